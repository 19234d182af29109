"""The futility stop: a variant that cannot win is stopped at an evaluation, freeing its lane.

The control trains first. At each of its evaluations during training it keeps the per-example
scores of the decision metric on the selection split (the recipe's ``score``), in
``runs/<control>/evals/scores-<step>.npz`` (example IDs and values, with its planned steps;
renamed into place at once, fsynced with the metrics before the next checkpoint commits: a
crash loses only records that the resume from that checkpoint writes again). At
each evaluation of a variant after the grace and before its last step, the variant scores the
same split and the interval the verdict uses with one seed a side (``core/gain_interval.py``,
the paired t-interval over the examples) gives the interval of its gain over the control at
the same step. Only at the same step: when the control has no record there (another lane still
trains it, or its evaluations fall on other steps) there is nothing to compare with, and the
check waits for the next evaluation.

The warm-up, so that an untrained model is never judged (Optuna's ``n_warmup_steps``, ASHA's
``grace_period``): no check before the grace (``stop_rules.grace``, a share of the variant's
planned steps, and never in the pilot), and none until the control's mean on the split has
moved from its first record, the untrained model's at step 0 (until then no model has learned
anything that a comparison could see: a network that still predicts one class ties every
other). A tie never stops: when
every per-example value of the variant equals the control's (to 1e-6 relative), the interval
is ``[0, 0]`` and says nothing of what the variant will reach.

The rule is the verdict's negative read on the optimistic end: with the gain signed so that
positive is better, the variant cannot win when the interval's upper end is below ``min_gain``
or not above 0. Then the hook asks the loop to stop the run keeping its evidence
(``keep_evidence``): the step is saved, the model it reached is evaluated on every split and
written as the run's ``model/``, ``result.json`` records the run (``completed`` false) with the
``futile`` stop and its numbers, and ``Futile`` is raised: the run's GPU lane goes to the next
run in its queue. Every check, stopping or not, is a ``futility`` row in ``metrics.jsonl``.

No check without per-example scores (a recipe with no ``score``, or one that does not return
the decision metric), without a control record, in a pilot call, for the control or its seed
replicates, or with ``stop_rules.futility: false``; why is said once (log, and a
``futility`` row with ``off``).
"""

from __future__ import annotations

import io
import logging
import math
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from gpucampaign.core.files import atomic_write_bytes, replace_bytes
from gpucampaign.core.gain_interval import paired_spread
from gpucampaign.core.stoprules import Futile
from gpucampaign.core.text import say_exact, say_number
from gpucampaign.engine.hooks import Hook, HookArgs, RunView, StopRequest
from gpucampaign.folder.layout import (
    EVAL_SCORES_DIR,
    EVAL_SCORES_GLOB,
    RESULT_FILE,
    eval_scores_file,
)
from gpucampaign.plan.stopping import futility_role
from gpucampaign.recipe.contract import has_score

log = logging.getLogger(__name__)

CONTROL = "control"


# --- the control's record -------------------------------------------------------------------
@dataclass(frozen=True)
class EvalScores:
    """One run's per-example scores of the decision metric at one evaluation."""

    step: int
    planned: int
    metric: str
    split: str
    ids: tuple[str, ...]
    values: np.ndarray


def write_eval_scores(
    run_dir: Path, rec: EvalScores, *, write: Callable[[Path, bytes], Any] = atomic_write_bytes
) -> Path:
    """Keep ``rec`` as ``run_dir/evals/scores-<step>.npz`` (atomic; a resumed run rewrites the
    same step with the same values). ``write``: the training loop's ``RunView.write_file``
    (durable by its next checkpoint, without an fsync at every evaluation)."""
    buf = io.BytesIO()
    np.savez(
        buf,
        ids=np.asarray(rec.ids, dtype=np.str_),
        values=np.asarray(rec.values, dtype=np.float64),
        step=np.int64(rec.step),
        planned=np.int64(rec.planned),
        metric=np.str_(rec.metric),
        split=np.str_(rec.split),
    )
    path = Path(run_dir) / eval_scores_file(rec.step)
    path.parent.mkdir(parents=True, exist_ok=True)
    write(path, buf.getvalue())
    return path


def read_eval_scores(path: Path) -> EvalScores:
    """Read one ``scores-<step>.npz`` back (no pickled objects are loaded)."""
    with np.load(path, allow_pickle=False) as z:
        return EvalScores(
            step=int(z["step"]),
            planned=int(z["planned"]),
            metric=str(z["metric"]),
            split=str(z["split"]),
            ids=tuple(str(i) for i in z["ids"]),
            values=np.asarray(z["values"], dtype=np.float64),
        )


def _recorded_steps(control_dir: Path) -> list[int]:
    folder = Path(control_dir) / EVAL_SCORES_DIR
    return sorted(
        int(p.stem.rpartition("-")[2]) for p in folder.glob(EVAL_SCORES_GLOB) if p.is_file()
    )


def control_scores_at(control_dir: Path, *, step: int) -> tuple[EvalScores | None, str]:
    """The control's record at the variant's step ``step``: never another step's, since a
    model of fewer (or more) steps says nothing of the variant's chance at that step.

    Returns:
        ``(record, "")`` at the same step; ``(None, why)`` when the control has none there.
    """
    # The step's own file first: a look reads one file, not the folder (``_recorded_steps``
    # only to say why there is none).
    if (path := Path(control_dir) / eval_scores_file(step)).is_file():
        return read_eval_scores(path), ""
    steps = _recorded_steps(control_dir)
    if not steps:
        return None, "the control kept no per-example scores during training"
    if (Path(control_dir) / RESULT_FILE).is_file() or step < steps[-1]:
        return None, f"the control has no evaluation at step {step} (only at unequal steps)"
    return None, f"the control has no evaluation at step {step} yet"


def first_record(control_dir: Path) -> EvalScores | None:
    """The control's first record (its untrained model's, at step 0), None before it has one.
    It never changes once written (a resumed control writes the same values again): a call's
    looks read it once (``Futility``)."""
    steps = _recorded_steps(control_dir)
    return read_eval_scores(Path(control_dir) / eval_scores_file(steps[0])) if steps else None


def control_moved(
    control_dir: Path, record: EvalScores, *, first: EvalScores | None = None
) -> tuple[bool, str]:
    """Whether the control's mean on the split at ``record`` moved from its first record (its
    untrained model's, at step 0; ``first`` when already read) by more than chance, and why
    not (a model that has learned nothing visible yet: no comparison says anything). Moved
    means the paired 95% interval of the change, example by example, excludes 0: two models
    still at chance never decide."""
    first = first or first_record(control_dir) or record
    now, then = (round(float(np.mean(r.values)), 12) for r in (record, first))
    if first.step < record.step and now != then:
        if tuple(first.ids) != tuple(record.ids) or len(record.values) < 2:
            return True, ""
        change = np.asarray(record.values, dtype=np.float64) - first.values
        if abs(float(change.mean())) > paired_spread(change[None, :]).half_width():
            return True, ""
    return False, (
        f"the control's {record.metric} on {record.split} at step {record.step} "
        f"({say_number(now)}) has not moved beyond chance from its first record (step "
        f"{first.step}, {say_number(then)}): no model has learned anything a comparison could "
        "see yet"
    )


def is_tie(variant: np.ndarray, control: np.ndarray) -> bool:
    """Every per-example value equal to the control's (to 1e-6 relative, 1e-12 absolute):
    identical predictions, a zero-width interval at 0; never a reason to stop."""
    return bool(np.allclose(variant, control, rtol=1e-6, atol=1e-12))


# --- the decision -----------------------------------------------------------------------------
def cannot_win(*, optimistic: float, min_gain: float) -> bool:
    """The verdict's negative rule, read on the interval's optimistic end (the gain signed so
    that positive is better): below the min gain, or not above 0, it can never be adopted."""
    return optimistic < min_gain or optimistic <= 0


#: The interval a look reads its boundary from: a run is checked at every evaluation, and each
#: look at the 95% interval would spend a few percent of dropping a slow starter that ends ahead.
FUTILITY_LEVEL = 0.99


def spending_factor(*, step: int, planned: int | None) -> float:
    """How much wider than the 99% interval (``FUTILITY_LEVEL``) a look at ``step`` of
    ``planned`` reads the optimistic end: ``sqrt(planned / step)``, O'Brien-Fleming's boundary
    with the share of steps as the information fraction. A run checked at every evaluation
    looks many times; an early look, when a slow starter still trails, needs evidence that
    much stronger, and the last looks read the 99% interval itself (``tests/engine/
    test_futility.py`` measures the slow starters it drops)."""
    if not planned or step <= 0 or step >= planned:
        return 1.0
    return round(math.sqrt(planned / step), 6)


@dataclass(frozen=True)
class FutilityCheck:
    """One comparison of a variant with the control at one evaluation.

    ``gain`` and ``ci95`` are signed so that positive is better (the verdict's convention);
    ``ci95[1]`` is the optimistic end.
    """

    step: int
    control_step: int
    metric: str
    split: str
    direction: str
    min_gain: float
    gain: float
    ci95: tuple[float, float]
    n: int
    futile: bool
    compared_with: str = ""
    tie: bool = False
    boundary: float = 1.0
    reach: float | None = None

    def numbers(self) -> dict[str, Any]:
        """JSON-ready numbers (the stop record's and the ``futility`` row's)."""
        return {
            "step": self.step,
            "control_step": self.control_step,
            "metric": self.metric,
            "split": self.split,
            "direction": self.direction,
            "min_gain": self.min_gain,
            "gain": self.gain,
            "gain_ci95": [self.ci95[0], self.ci95[1]],
            "n": self.n,
            "futile": self.futile,
            "boundary": self.boundary,
            "reach": self.reach,
            **({"tie": True} if self.tie else {}),
            **({"compared_with": self.compared_with} if self.compared_with else {}),
        }

    def reason(self) -> str:
        """One sentence: the interval, the min gain, and why the variant cannot win."""
        lo, hi = self.ci95
        reach = hi if self.reach is None else self.reach
        against = (
            f"the control at step {self.control_step}"
            if not self.compared_with
            else f"{self.compared_with}"
        )
        end = (
            "its upper end"
            if self.reach is None
            else f"the upper end of its 99% interval read {self.boundary:g}x wide at this look "
            "(O'Brien-Fleming: an early look needs stronger evidence)"
        )
        why = (
            f"{end}, {say_number(reach, against=self.min_gain)}, is below the min gain "
            f"{say_exact(self.min_gain)}"
            if reach < self.min_gain
            else f"{end}, {say_number(reach, against=0.0)}, is not above 0"
        )
        return (
            f"cannot win: at step {self.step} its gain in {self.metric} on {self.split} over "
            f"{against} is {say_number(self.gain)} [95% CI {say_number(lo)}, "
            f"{say_number(hi)}] over {self.n} examples; {why}"
        )


def futility_check(
    control: EvalScores,
    *,
    ids: list[str] | tuple[str, ...],
    values: list[float] | np.ndarray,
    step: int,
    direction: str,
    min_gain: float,
    compared_with: str = "",
    planned: int | None = None,
) -> FutilityCheck | None:
    """Compare a variant's per-example scores at ``step`` with the control's record.

    Args:
        control: the control's record (``control_scores_at``).
        ids: the variant's example IDs on the same split.
        values: its per-example values of the same metric, in the order of ``ids``.
        step: the variant's step.
        direction: ``maximize`` or ``minimize``.
        min_gain: the decision rule's min gain.
        compared_with: how the control's record was chosen when not at the same step.
        planned: the variant's planned steps: the check at ``step`` of ``planned`` spends its
            error as O'Brien-Fleming's boundary does (``spending_factor``); None: a final look.

    Returns:
        The check (never futile on a tie: ``is_tie``), or None when the two share no example
        or a value is not finite.
    """
    pos = {i: n for n, i in enumerate(ids)}
    common = [(n, pos[i]) for n, i in enumerate(control.ids) if i in pos]
    if not common:
        return None
    c_idx, v_idx = (np.asarray(x, dtype=np.int64) for x in zip(*common, strict=True))
    mine, theirs = np.asarray(values, dtype=np.float64)[v_idx], control.values[c_idx]
    diff = mine - theirs
    if not np.isfinite(diff).all():
        return None
    sign = 1.0 if direction == "maximize" else -1.0
    gain = float(diff.mean())
    spread = paired_spread(diff[None, :])
    half = spread.half_width()
    lo, hi = sorted((round(sign * (gain - half), 12), round(sign * (gain + half), 12)))
    factor = spending_factor(step=step, planned=planned)
    # The optimistic end at this look's boundary: the 99% interval, widened early in the run.
    reach = round(sign * gain + factor * spread.half_width(level=FUTILITY_LEVEL), 12)
    tie = is_tie(mine, theirs)
    return FutilityCheck(
        step=step,
        control_step=control.step,
        metric=control.metric,
        split=control.split,
        direction=direction,
        min_gain=min_gain,
        gain=round(sign * gain, 12),
        ci95=(lo, hi),
        n=len(diff),
        futile=not tie and cannot_win(optimistic=reach, min_gain=min_gain),
        compared_with=compared_with,
        tie=tie,
        boundary=factor,
        reach=reach,
    )


def look_at_control(
    control_dir: Path,
    *,
    ids: list[str] | tuple[str, ...],
    values: list[float] | np.ndarray,
    step: int,
    direction: str,
    min_gain: float,
    planned: int,
    first: EvalScores | None = None,
) -> tuple[FutilityCheck | None, str]:
    """A variant's look at ``step``: the control's record at the same step read, whether the
    control has moved from its first record (``first`` when already read: ``first_record``),
    and the comparison (``futility_check``).

    Returns:
        ``(check, "")``, or ``(None, why)`` when there is nothing to compare with yet.
    """
    control, note = control_scores_at(control_dir, step=step)
    if control is None:
        return None, note
    moved, note = control_moved(control_dir, control, first=first)
    if not moved:
        return None, note
    check = futility_check(
        control,
        ids=ids,
        values=values,
        step=step,
        direction=direction,
        min_gain=min_gain,
        planned=planned,
    )
    return (check, "") if check is not None else (None, "no common finite example")


def look_costs(
    *,
    ids: list[str],
    values: list[float],
    step: int,
    planned: int,
    metric: str,
    split: str,
    direction: str,
    min_gain: float,
) -> tuple[float, float]:
    """Seconds of a look beyond the scores, for the re-forecast: the control's record of
    ``values`` (``write_eval_scores``, as ``RunView.write_file`` writes it: no fsync) and a
    variant's look at such a record (``look_at_control``: the record read, the control's first
    one held as a call's looks hold it after their first, the comparison). Done in a
    temporary folder, removed: nothing of the run is written. A variant's look costs about
    twice a record on the demo (a file read, the IDs matched, the interval), so one price for
    both would under-forecast every variant's training call."""
    rec = EvalScores(
        step=step,
        planned=planned,
        metric=metric,
        split=split,
        ids=tuple(ids),
        values=np.asarray(values, dtype=np.float64),
    )
    with tempfile.TemporaryDirectory(prefix="gpucampaign-look-") as tmp:
        folder = Path(tmp)
        # The control's first record, another mean: the look reads both and compares.
        first = replace(rec, step=0, values=rec.values + 1.0)
        write_eval_scores(folder, first, write=replace_bytes)
        for _ in range(2):  # the second kept: warm, as at a training call's every look
            t0 = time.perf_counter()
            write_eval_scores(folder, rec, write=replace_bytes)
            record_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            look_at_control(
                folder,
                ids=ids,
                values=values,
                step=step,
                direction=direction,
                min_gain=min_gain,
                planned=planned,
                first=first,
            )
            check_s = time.perf_counter() - t0
    return record_s, check_s


# --- during training --------------------------------------------------------------------------
class Futility(Hook):
    """One training call's part in the futility rule, a hook: the control records, a variant
    checks, after each evaluation in the loop.

    Built once per call (``for_run``; as a hook, ``hook``: None when there is nothing to do
    or say); why a run is not checked is said at the loop's start.
    """

    def __init__(self, r: RunView, *, role: str, off: str = "") -> None:
        self.r = r
        self.role = role  # "record", "check" or "off"
        self.off = off
        self._said: set[str] = set()
        rule = r.spec.decision_rule
        self.metric = rule.metric if rule else ""
        self.split = r.spec.selection_split
        self.first: EvalScores | None = None  # the control's first record, read once a call

    @classmethod
    def hook(cls, r: RunView, args: HookArgs) -> Futility | None:
        """The hook of this call (``for_run``), or None when it is off with nothing to say."""
        f = cls.for_run(r)
        return None if f.role == "off" and not f.off else f

    def on_start(self) -> StopRequest | None:
        if self.role == "off" and self.off:
            self._say(self.off)
        if self.role == "record" and self.r.step == 0 and self.r.dist.is_main:
            self.check()  # the untrained control: the value its metric moves from
        return None

    def after_eval(self, metrics: dict[str, float]) -> StopRequest | None:
        """Asks to stop, the model kept as evidence, when the variant cannot win."""
        return self.check()

    @classmethod
    def for_run(cls, r: RunView) -> Futility:
        """The role of this call (``plan.stopping.futility_role``: the control records, a
        variant's full training call checks), off when the recipe scores no example (and why,
        when the rule cannot run as asked)."""
        role, why = futility_role(r.spec, run=r.run, pilot=r.target < r.planned)
        if role != "off" and not has_score(r.recipe):
            return cls(r, role="off", off=_no_score(r))
        return cls(r, role=role, off=why)

    def _say(self, why: str) -> None:
        """Say once why this run is not checked (log and a ``futility`` row)."""
        if why in self._said:
            return
        self._said.add(why)
        log.info("futility of %s: no check: %s", self.r.run_id, why)
        self.r.record({"kind": "futility", "step": self.r.step, "off": why})

    def _scores(self) -> tuple[list[str], list[float]] | None:
        """This run's per-example decision metric on the selection split, or None (said)."""
        r = self.r
        got = r.scores(self.split)
        if got is None:
            self._say(f"the recipe gives no '{self.split}' split to score")
            return None
        ids, columns = got
        if self.metric not in columns:
            self._say(f"the score() of recipe '{r.config.recipe}' returns no '{self.metric}'")
            return None
        return ids, columns[self.metric]

    def check(self) -> StopRequest | None:
        """After an evaluation at the current step: record (control) or check (variant).

        Returns:
            The stop to ask for when the variant cannot win, else None.
        """
        r = self.r
        if self.role == "off":
            return None
        step = r.step
        if self.role == "check" and (step <= r.spec.pilot.steps or step >= r.planned):
            return None  # after the pilot, and never at the last step (nothing left to save)
        grace = r.spec.stop_rules.grace_step(planned=r.planned)
        if self.role == "check" and step < grace:
            why = f"within the grace: no check before step {grace} of {r.planned}"
            r.record({"kind": "futility", "step": step, "skipped": why})
            return None
        got = self._scores()
        if got is None:
            return None
        ids, values = got
        if self.role == "record":
            write_eval_scores(
                r.run_folder.path,
                EvalScores(
                    step=step,
                    planned=r.planned,
                    metric=self.metric,
                    split=self.split,
                    ids=tuple(ids),
                    values=np.asarray(values, dtype=np.float64),
                ),
                write=r.write_file,
            )
            return None
        rule = r.spec.decision_rule
        assert rule is not None  # role "check" needs one
        control_dir = r.run_folder.of_run(r.spec.resolve_run(CONTROL).run_id).path
        self.first = self.first or first_record(control_dir)
        check, note = look_at_control(
            control_dir,
            ids=ids,
            values=values,
            step=step,
            direction=rule.direction,
            min_gain=rule.min_gain,
            planned=r.planned,
            first=self.first,
        )
        if check is None:
            r.record({"kind": "futility", "step": step, "skipped": note})
            return None
        r.record({"kind": "futility", **check.numbers()})
        if not check.futile:
            return None
        return keep_evidence(r, Futile, reason=check.reason(), numbers=check.numbers())


def _no_score(r: RunView) -> str:
    return (
        f"recipe '{r.config.recipe}' defines no score() (per-example values), so no interval "
        "can be computed during training"
    )


def keep_evidence(
    r: RunView, kind: type[Futile], *, reason: str, numbers: dict[str, Any]
) -> StopRequest:
    """The stop a run asks for when it cannot win (futile, not learning): its step saved and
    durable before the lane is given up, the model it reached evaluated on every split and kept
    as evidence, ``result.json`` recording the stop (the loop's ``_end`` does all of it).

    Args:
        r: The run's view.
        kind: The stop's class (``Futile``, or ``NotLearning``).
        reason: The stop's sentence.
        numbers: What decided it (the stop record adds the planned steps, the steps saved and
            the measured step time).
    """
    step = r.step
    numbers = {
        **numbers,
        "planned_steps": r.planned,
        "steps_saved": r.planned - step,
        "step_s": r.step_s(),
    }
    stop = kind(r.run_id, reason, step=step, numbers=numbers)
    return StopRequest.of(stop, save=True, keep_model=True)


def saved_seconds(numbers: dict[str, Any]) -> float | None:
    """The GPU time a futility stop saved: the steps it did not train times the measured step
    time (None without a measured step time)."""
    step_s, left = numbers.get("step_s"), numbers.get("steps_saved")
    if (
        not isinstance(step_s, int | float)
        or not isinstance(left, int)
        or not math.isfinite(step_s)
    ):
        return None
    return left * float(step_s)
