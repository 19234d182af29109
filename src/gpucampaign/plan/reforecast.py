"""The re-forecast after the pilot: what a pilot measured (``pilot_measures``) and the sum of
what a training call costs, part by part (``call_parts``), for every run-linked calendar step
(``reforecast_runs``); the plan of a new campaign from an earlier one's measures
(``calibrated_hours``). Pure functions; ``plan.decision`` decides with them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpucampaign.config import CampaignSpec, ResolvedRun, RunConfig
from gpucampaign.config.parts import EVAL_SPLITS
from gpucampaign.core.errors import ArgumentError
from gpucampaign.core.files import median
from gpucampaign.core.text import say_step
from gpucampaign.plan.stopping import futility_role


@dataclass(frozen=True)
class RunForecast:
    """A run's machine time forecast from pilot measurements: ``hours``, ``how`` it was made
    (the text the decision shows), and, when the pilot measured what surrounds a step, the
    call's ``parts`` in seconds (``call_parts``), the settled ``step_s`` they rest on and the
    ``steps`` the call trains (the report splits a miss into the steps and the rest)."""

    hours: float
    how: str
    parts: dict[str, float] = field(default_factory=dict)
    step_s: float | None = None
    steps: int = 0

    def record(self) -> dict[str, Any]:
        """What ``decisions.jsonl`` keeps beside the hours: the parts and the step they rest
        on (nothing when the pilot did not measure them)."""
        if not self.parts:
            return {}
        return {"parts_s": dict(self.parts), "step_s": self.step_s, "steps": self.steps}


def forecast_run(
    spec: CampaignSpec, *, run: str, pilot: Mapping[str, Mapping[str, Any]], planned_steps: int
) -> RunForecast:
    """Forecast a run's machine time from pilot measurements, in hours, with how it was made.

    A piloted run uses its own measurements. Others use the control's cost per sample,
    scaled by their planned samples: said so in the explanation. A pilot that measured what
    surrounds a step (``fixed_s`` and ``loop_s``: ``pilot_measures``) is forecast as the sum
    of the call's parts (``call_parts``), for the steps left after the pilot (the training
    resumes from its checkpoint).

    Args:
        spec: the campaign.
        run: run name.
        pilot: pilot measurements per run name (``load_s``, ``step_s``, ``eval_s``, ``save_s``,
            ``evals``, ``saves``, ``batch_size``; ``fixed_s``, ``loop_s``, ``stall_s`` and
            ``steps_done`` when measured).
        planned_steps: the run's planned optimizer steps.
    """
    cfg = spec.run_config(run)
    if run in pilot:
        m = dict(pilot[run])
        how = f"pilot of '{run}': {say_step(m['step_s'])}/step"
        left = max(0, planned_steps - int(m.get("steps_done") or 0))
    else:
        ref = pilot.get("control") or next(iter(pilot.values()))
        m = dict(ref)
        scale = cfg.batch_size / ref["batch_size"]
        for key in ("step_s", "step_mean_s", "first_step_s", "warmup_s"):
            if key in m:
                m[key] = ref[key] * scale
        m["evals_done"] = 0
        how = "not piloted: control's cost per sample scaled to this run's batch size"
        left = planned_steps
    if "fixed_s" in m and "loop_s" in m:
        # The evaluations' cadence (and the live view's reports at them) is the run's own.
        m["planned_steps"] = planned_steps
        if m.get("n_train"):
            m["eval_step"] = cfg.eval_every or cfg.steps_per_epoch(int(m["n_train"]))
        # The scores futility asks for at the evaluations left: the control records them, a
        # variant checks them (the pilots' probe timed them: no pilot records or checks).
        m["looks_left"] = futility_looks_left(
            spec,
            run=run,
            done=planned_steps - left,
            planned=planned_steps,
            eval_step=int(m.get("eval_step") or 0),
        )
        # each at its measured cost: the control's record, a variant's check (about twice it)
        m["look_each_s"] = float(m.get("record_s" if run == "control" else "check_s") or 0.0)
        parts = call_parts(m, left=left)
        how += ", " + ", ".join(f"{k} {v:.3g} s" for k, v in parts.items())
        step_s = float(m.get("step_mean_s", m["step_s"]))
        return RunForecast(sum(parts.values()) / 3600.0, how, parts, step_s, left)
    seconds = (
        m["load_s"]
        + planned_steps * m["step_s"]
        + m.get("evals", 0) * m.get("eval_s", 0.0)
        + m.get("saves", 0) * m.get("save_s", 0.0)
    )
    return RunForecast(seconds / 3600.0, how)


def call_parts(m: Mapping[str, Any], *, left: int) -> dict[str, float]:
    """The seconds of a training call that trains ``left`` steps, part by part, from what a
    pilot measured (``pilot_measures``): each part is a measure times the count the run's own
    config gives (its steps, its evaluation cadence, its saves), none assumed.

    - ``outside``: the call's segment beyond ``train_run`` (the timeline's lines, the GPU
      slot's hand-over), the call's set-up and last save (``fixed_s``) and its restore (the
      read of the pilot's save the pilot timed, ``resume_s``; the pilot restored nothing);
    - ``loop start``: the loop's start before its first step, once a call;
    - ``steps``: the first step and the pilot's warm-up steps after it (``warmup_s``, what a
      call pays again: ``_step_spread``), the others at the run's settled step time
      (``pool_pilots``: its pilot's median step times the machine's tax on a step);
    - ``loop``: the loop's own time per step beyond the step (rows, hooks), what it adds at
      each evaluation left (``loop_eval_s``) and once a call (``loop_warm_s``: ``_loop_split``
      of the pilot's marks), the live view's reports left at the run's evaluations and its
      end (``reports_left``), each at the measured report; and
      futility's looks left (``looks_left``: the control records the selection split's
      per-example scores at each evaluation, a variant checks its own), each at its measured
      cost with the scores (``look_each_s``: the pilot's probe's ``record_s`` or ``check_s``);
    - ``evaluations``: the evaluations left at the run's cadence, and the final ones of every
      split at the run's end (``EVAL_SPLITS``), each at the measured evaluation;
    - ``saves``: the waits of the run's saves, and the model folder's write at the end, as long
      as a checkpoint's whole save (its write and commit, ``save_s``).
    """
    eval_s = float(m.get("eval_s") or 0.0)
    evals_left = max(0, int(m.get("evals") or 0) - int(m.get("evals_done") or 0))
    loop = left * float(m["loop_s"]) + (float(m.get("loop_warm_s") or 0.0) if left else 0.0)
    loop += evals_left * float(m.get("loop_eval_s") or 0.0)
    if "report_s" in m:  # measured apart from the loop's per step
        planned = int(m["planned_steps"])
        reports = reports_left(
            done=planned - left, planned=planned, eval_step=int(m.get("eval_step") or 0)
        )
        loop += reports * float(m["report_s"])
    loop += int(m.get("looks_left") or 0) * float(m.get("look_each_s") or 0.0)
    step = float(m.get("step_mean_s", m["step_s"]))
    # The pilot's warm-up steps at what they cost, paid again by the call (its model and
    # optimizer are built anew from the checkpoint); the others at the settled step time.
    warm = min(max(0, left - 1), int(m.get("warmup_steps") or 0))
    warm_s = float(m.get("warmup_s") or 0.0) * warm / max(1, int(m.get("warmup_steps") or 0))
    return {
        "outside": float(m.get("outside_s") or 0.0)
        + float(m["fixed_s"])
        + float(m.get("resume_s") or 0.0),
        "loop start": float(m.get("loop_start_s") or 0.0),
        "steps": (float(m.get("first_step_s", step)) + warm_s + max(0, left - 1 - warm) * step)
        if left
        else 0.0,
        "loop": loop,
        "evaluations": (evals_left + len(EVAL_SPLITS)) * eval_s,
        "saves": int(m.get("saves") or 0) * float(m.get("stall_s") or 0.0)
        + float(m.get("save_s") or 0.0),
    }


def futility_looks_left(
    spec: CampaignSpec, *, run: str, done: int, planned: int, eval_step: int
) -> int:
    """The evaluations after step ``done`` at which futility scores a training call of ``run``
    (its role: ``plan.stopping.futility_role``): the control records at each one; a variant
    checks after the pilot's steps and the grace, never at its last step."""
    role, _ = futility_role(spec, run=run)
    if role == "off" or eval_step <= 0:
        return 0
    if role == "record":
        return planned // eval_step - done // eval_step
    first = max(done + 1, spec.pilot.steps + 1, spec.stop_rules.grace_step(planned=planned))
    last = planned - 1
    return max(0, last // eval_step - (first - 1) // eval_step)


def reports_left(*, done: int, planned: int, eval_step: int) -> int:
    """The live view's reports at the steps after ``done`` up to ``planned`` (``engine.live``):
    after each evaluation (each multiple of ``eval_step``, when the run evaluates during
    training) and at the last step, one report at a step that is both. (Reports due by the
    clock, about twice a second, are left out: under 0.1% of a run's time at a report's cost
    of a millisecond; the ``progress`` callback's steps write nothing.)"""
    if planned <= done:
        return 0
    count = planned // eval_step - done // eval_step if eval_step > 0 else 0
    return count + (0 if eval_step > 0 and planned % eval_step == 0 else 1)


#: Config fields that change what a run trains, not what one of its steps costs: the pilots of
#: runs that differ only in these measured the same step.
STEP_NEUTRAL = ("lr", "epochs", "max_steps", "seed", "seeds", "eval_every", "resume")


def step_shape(cfg: RunConfig) -> str:
    """What one step of a run costs depends on (its config less ``STEP_NEUTRAL``), hashed."""
    data = cfg.model_dump(mode="json", exclude=set(STEP_NEUTRAL))
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode("utf-8")).hexdigest()[:12]


#: What the pilots share (one process, one machine), pooled at their median over them.
_POOLED = (
    "loop_s",
    "loop_warm_s",
    "loop_eval_s",
    "loop_start_s",
    "outside_s",
    "eval_s",
    "stall_s",
    "save_s",
    "first_step_s",
    "report_s",
    "record_s",
    "check_s",
)


def pool_pilots(pilot: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every pilot's measures with the shared ones pooled (``_POOLED``: their median over the
    pilots that measured them, so one pilot's hiccup stays out; the time outside the loop: the
    median of the pilots less the one that measured the most, the first, which pays the
    process's one-time warm-up).

    A run's step time is its own (its model, its batch): the median of the settled steps of
    every pilot of the same step, pooled (``step_shape``: the runs that differ only in their
    learning rate, length or seed train the same step, so one pilot's burst of another
    process's load is outvoted; a pilot's 20 steps last milliseconds, so whether another
    process took the core then is luck). Nothing is added for the mean's excess over the
    median: the pilots' later steps still run slower than a long call's (each call's first
    tens of steps do), which that excess would count twice (bench/forecast.py, 10 campaigns
    recorded idle: the step part over-forecast by 7.3% with the mean over the pilots of their
    trimmed mean over their median as a tax, by 1.4% pooled without it; records without
    ``settled_s`` keep that older estimate)."""
    taxes = [
        float(m["step_mean_s"]) / float(m["step_s"])
        for m in pilot.values()
        if "fixed_s" in m and m.get("step_mean_s") and m.get("step_s")
    ]
    tax = sum(taxes) / len(taxes) if taxes else None
    same_step: dict[str, list[float]] = {}
    settled: dict[str, list[float]] = {}
    for m in pilot.values():
        if "fixed_s" in m and m.get("step_shape") and m.get("step_s"):
            same_step.setdefault(str(m["step_shape"]), []).append(float(m["step_s"]))
        if "fixed_s" in m and m.get("step_shape") and isinstance(m.get("settled_s"), list):
            times = [float(t) for t in m["settled_s"] if isinstance(t, int | float)]
            settled.setdefault(str(m["step_shape"]), []).extend(times)
    shared: dict[str, float] = {}
    for key in _POOLED:
        values = [float(m[key]) for m in pilot.values() if isinstance(m.get(key), int | float)]
        if key == "eval_s":  # a pilot shorter than the evaluation cadence measured none
            values = [v for v in values if v > 0]
        if values:
            shared[key] = float(median(values) or 0.0)
    fixed = [float(m["fixed_s"]) for m in pilot.values() if "fixed_s" in m]
    if fixed:
        # The pilot that measured the most left out (the first, which paid the process's
        # one-time warm-up), the median of the others: a training call's time outside the loop
        # is one draw like theirs, and the least of several draws is below a typical one (the
        # demo's pilots 18, 24, 28 and 109 ms, its training calls' 28-40 ms).
        shared["fixed_s"] = float(median(sorted(fixed)[:-1] or fixed) or 0.0)
    out = {run: {**m, **shared} if "fixed_s" in m else dict(m) for run, m in pilot.items()}
    for m in out.values():
        if "fixed_s" in m and settled.get(shape := str(m.get("step_shape"))):
            m["step_s"] = m["step_mean_s"] = float(median(settled[shape]) or m["step_s"])
            continue
        if str(m.get("step_shape")) in same_step and "fixed_s" in m:
            m["step_s"] = float(median(same_step[str(m["step_shape"])]) or m["step_s"])
        if tax is not None and "fixed_s" in m and m.get("step_mean_s") and m.get("step_s"):
            m["step_mean_s"] = float(m["step_s"]) * tax
    return out


def reforecast_runs(
    spec: CampaignSpec, *, pilot: dict[str, dict[str, Any]]
) -> dict[str, RunForecast]:
    """Every run-linked calendar step, re-forecast from the pilot's measurements (the costs
    the pilots share pooled: ``pool_pilots``)."""
    out: dict[str, RunForecast] = {}
    if not pilot:
        return out
    pilot = pool_pilots(pilot)
    for step in spec.calendar:
        if step.run is None:
            continue
        measured = pilot.get(step.run)
        planned = measured["planned_steps"] if measured else planned_steps_of(spec, step.run, pilot)
        out[step.name] = forecast_run(spec, run=step.run, pilot=pilot, planned_steps=planned)
    return out


def planned_steps_of(spec: CampaignSpec, run: str, pilot: dict[str, dict[str, Any]]) -> int:
    """Planned optimizer steps of a run that was not piloted, from the train split's size."""
    ref = pilot.get("control") or next(iter(pilot.values()))
    return spec.run_config(run).planned_steps(ref["n_train"])


def calibrated_hours(
    spec: CampaignSpec, *, estimates: Mapping[str, Any], n_train: int | None = None
) -> dict[str, tuple[float, str]]:
    """Hours of every run-linked step of a NEW campaign from an earlier campaign's measurements.

    The earlier control's pilot record gives the shape (batch size, evals, saves); its median
    times over the whole campaign (``measured``) replace the pilot's where they were observed.

    Args:
        spec: the campaign being planned.
        estimates: ``estimates.json`` of a closed campaign (``forecast.load_estimates``).
        n_train: training rows of this spec's corpus; the earlier corpus's count when None.
    """
    pilots = estimates.get("pilot") or {}
    ref = dict(pilots.get("control") or next(iter(pilots.values()), {}))
    if not ref:
        raise ArgumentError(
            "the earlier campaign recorded no pilot measurements to calibrate from",
            field="calibrate_from",
        )
    ref.update(
        {k: v for k, v in (estimates.get("measured") or {}).items() if v is not None and k in ref}
    )
    if n_train is not None:
        ref["n_train"] = n_train
    source = f"calibrated from {estimates.get('campaign_id', 'an earlier campaign')}"
    out: dict[str, tuple[float, str]] = {}
    for step in spec.calendar:
        if step.run is None:
            continue
        planned = planned_steps_of(spec, step.run, {"control": ref})
        cfg = spec.run_config(step.run)
        scale = cfg.batch_size / ref["batch_size"]
        # The earlier campaign's step time over its training (``measured``) for every step.
        m = {
            **ref,
            "step_s": ref["step_s"] * scale,
            "step_mean_s": ref["step_s"] * scale,
            "first_step_s": float(ref.get("first_step_s") or ref["step_s"]) * scale,
            "warmup_s": float(ref.get("warmup_s") or 0.0) * scale,
            "steps_done": 0,
            "evals_done": 0,
        }
        hours = forecast_run(spec, run=step.run, pilot={step.run: m}, planned_steps=planned).hours
        out[step.name] = (hours, f"{source}: {say_step(m['step_s'])}/step x {planned} steps")
    return out


def _median_or_zero(values: Any) -> float:
    vals = values if isinstance(values, list) else [values]
    return float(median(v for v in vals if isinstance(v, int | float)) or 0.0)


def pilot_measures(
    run: ResolvedRun,
    *,
    result: Any,
    n_train: int,
    losses: Sequence[float] = (),
    rows: Sequence[Mapping[str, Any]] = (),
    segment_s: float | None = None,
) -> dict[str, Any]:
    """What the re-forecast needs from a pilot: load, step, eval and save costs and their counts,
    and the early loss curve the decision point compares with the control's.

    Args:
        run: the piloted run (``CampaignSpec.resolve_run``).
        result: the pilot's ``runresult.RunResult``.
        n_train: rows of the corpus's train split.
        losses: the pilot's training losses (``early_losses``).
        rows: the pilot's ``metrics.jsonl`` rows: each step's time (its first, the warm-up a
            resumed call pays again, apart from the mean of the others).
        segment_s: the pilot's segment on the timeline, in seconds (the observed time a
            training call is compared with): what it holds beyond ``train_run`` is measured.
    """
    cfg = run.config
    t = result.timings
    planned = cfg.planned_steps(n_train)
    steps_per_epoch = cfg.steps_per_epoch(n_train)
    evals = planned // cfg.eval_every if cfg.eval_every else -(-planned // steps_per_epoch)
    every = result.checkpoint_every or planned
    done = max(1, int(result.steps_done or 0))
    evals_s = [float(x) for x in (t.get("eval_s") or []) if isinstance(x, int | float)]
    stalls = [float(x) for x in (t.get("stall_s") or []) if isinstance(x, int | float)]
    loop_wall = float(t.get("train_s") or 0.0)
    loop_start = float(t.get("loop_start_s") or 0.0)
    reports = int(t.get("reports") or 0)
    report = float(t.get("report_s") or 0.0) if reports else 0.0
    looks = int(t.get("looks") or 0)
    look = float(t.get("look_s") or 0.0) if looks else 0.0
    steps_sum = float(t.get("steps_s_sum") or 0.0)
    total = float(t.get("total_s") or 0.0)
    own = max(0.0, loop_wall - loop_start - steps_sum - sum(evals_s) - sum(stalls) - report - look)
    return {
        "run_id": result.run_id,
        "steps_done": result.steps_done,
        "planned_steps": planned,
        "batch_size": cfg.batch_size,
        "n_train": n_train,
        "load_s": float(t.get("load_s") or 0.0),
        "step_s": float(t.get("step_s") or 0.0),
        # An evaluation's cost: those of the pilot's steps, else the one timed after them.
        "eval_s": _median_or_zero(evals_s or t.get("probe_eval_s")),
        "save_s": _median_or_zero(t.get("save_s")),
        "restore_s": float(t.get("restore_s") or 0.0),
        # The restore of the call that resumes the run: the read of its save the pilot timed
        # (``engine.outcome.time_restore``), apart from ``fixed_s``.
        "resume_s": float(t.get("probe_restore_s") or 0.0),
        "evals": evals,
        "evals_done": len(evals_s),
        "saves": max(1, -(-planned // max(1, int(every)))),
        "checkpoint_every": result.checkpoint_every,
        # The run's own cadences of the live view's reports and of its evaluations.
        "step_shape": step_shape(cfg),
        "eval_step": cfg.eval_every or steps_per_epoch,
        "early_losses": [float(x) for x in losses],
        # What surrounds a step, measured by this call (not assumed): the loop's own time per
        # step beyond the step, its start, its evaluations and its save waits; the call's time
        # outside the loop (set-up, load, restore, the last save) and outside ``train_run``
        # (its segment's lines).
        **_loop_split(t, own_s=own, done=done),
        # The live view's reports, apart (``call_parts`` counts them at each run's cadence).
        **({"report_s": report / reports, "reports": reports} if reports else {}),
        # The hooks' looks after its evaluations (the control's records), apart from the loop.
        **({"look_s": look / looks, "looks": looks} if looks else {}),
        # Futility's looks at each evaluation of the training (``looks_left``), with their
        # scores: the control's record, a variant's check.
        **{k: float(t[f"probe_{k}"]) for k in ("record_s", "check_s") if t.get(f"probe_{k}")},
        "loop_start_s": loop_start,
        "fixed_s": max(
            0.0,
            total
            - loop_wall
            - float(t.get("probe_eval_s") or 0.0)
            - float(t.get("probe_restore_s") or 0.0)
            - float(t.get("probe_looks_s") or 0.0),
        ),
        "outside_s": max(0.0, segment_s - total) if segment_s is not None else 0.0,
        **_step_spread(rows, fallback=steps_sum / done),
        "stall_s": _median_or_zero(stalls),
    }


def settled_from(steps: int) -> int:
    """The pilot's steps up to this one are its warm-up; the later ones are settled.

    The steps after the first up to half the pilot are kept apart, at what each cost, not
    spread over the run; the loop's own time is split at the same step (the first of the
    pilot's ``timings.marks``). On bench/forecast.py's idle campaigns (53 pilots of 20 steps)
    the median by position of steps 2-10 ran 1.06-1.43x the training call's later steps, of
    steps 11-20 0.95-1.28x; the step part's forecast over actual went from 1/0.85 to 1/0.91 on
    the same records. A pilot of fewer than 8 steps has none but its first."""
    return steps // 2 if steps >= 8 else 1


def pilot_marks(steps: int | None) -> tuple[int, ...]:
    """The steps of a pilot of ``steps`` after which the loop marks its counters: the end of
    its warm-up (``settled_from``) and the step before its last (whose evaluation a call pays
    at each of its own: ``_loop_split``); the loop marks them once more at its end. None for a
    pilot too short to have both."""
    if not steps or settled_from(steps) >= steps - 1:
        return ()
    return (settled_from(steps), steps - 1)


def _loop_split(t: Mapping[str, Any], *, own_s: float, done: int) -> dict[str, float]:
    """The pilot's loop time beyond the steps (``own_s`` over its ``done`` steps) split at its
    marks (``pilot_marks``, then its end): between the first two, what a long call pays at
    each step (``loop_s``); after the second, beyond that rate, what the last step's
    evaluation brings to the loop (the rows flushed before it, their hand-over to the hooks,
    the save's), which a call pays at each of its evaluations (``loop_eval_s``; once, with the
    rest, when the pilot evaluated none); before the first, beyond that rate, what a call pays
    once (``loop_warm_s``: its code and data cold, the first epoch's start). Without the
    three marks (an older record), all of it per step: the demo's pilots measured 75-130 us a
    step so, where a training call paid 48-58 us a step with its evaluations' share, and 24-42
    us between the first two marks."""
    marks = t.get("marks")
    if not isinstance(marks, list) or len(marks) < 3:
        return {"loop_s": own_s / done}
    a, b, end = marks[0], marks[1], marks[-1]

    def between(x: Mapping[str, Any], y: Mapping[str, Any]) -> float:
        """The loop's own time from counters ``x`` to ``y`` (less loop start: before both)."""
        keys = ("at_s", "steps_s", "eval_s", "stall_s", "report_s", "look_s")
        at, *parts = (float(y[k]) - float(x[k]) for k in keys)
        return max(0.0, at - sum(parts))

    per_step = between(a, b) / max(1, int(b["step"]) - int(a["step"]))
    tail = max(0.0, between(b, end) - per_step * (int(end["step"]) - int(b["step"])))
    once = max(0.0, own_s - between(a, end) - per_step * int(a["step"]))
    if not t.get("eval_s"):
        return {"loop_s": per_step, "loop_warm_s": once + tail}
    return {"loop_s": per_step, "loop_eval_s": tail, "loop_warm_s": once}


def _step_spread(rows: Sequence[Mapping[str, Any]], *, fallback: float) -> dict[str, Any]:
    """The pilot's first step (a call's warm-up), the 10%-trimmed mean of its later steps (a
    pilot's few steps on a shared machine hold a hiccup or two, another process's burst, that
    their mean would spread over every step of the run), and those later steps themselves
    (``settled_s``: ``pool_pilots`` pools them over the pilots of the same step)."""
    times = [
        float(r["step_s"])
        for r in rows
        if r.get("kind") == "train" and isinstance(r.get("step_s"), int | float)
    ]
    if len(times) < 2:
        return {"step_mean_s": fallback, "first_step_s": fallback}
    warm = settled_from(len(times))
    later = sorted(times[max(1, warm) :])
    cut = len(later) // 10  # from each end (scipy's trim_mean(0.1); scipy is not a dependency)
    kept = later[cut : len(later) - cut]
    out: dict[str, Any] = {
        "step_mean_s": sum(kept) / len(kept),
        "first_step_s": times[0],
        "settled_s": later,
    }
    if warm > 1:
        out |= {
            "warmup_s": sum(times[1:warm]),
            "warmup_steps": warm - 1,
            "step_s": float(median(later) or fallback),  # the settled steps' median
        }
    return out
