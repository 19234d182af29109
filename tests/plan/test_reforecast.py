"""The re-forecast after the pilot is the sum of what a training call costs, part by part, each
part measured by the pilots (plan/decision.py: ``pilot_measures``, ``call_parts``,
``reforecast_runs``): the steps, the loop's own cost per step and its start once a call,
the evaluations at the run's cadence and at its end, the save waits and the model's write, the
time outside the loop and outside ``train_run``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from gpucampaign.config import CampaignSpec, load_spec, parse_spec
from gpucampaign.plan.reforecast import (
    call_parts,
    futility_looks_left,
    pilot_measures,
    pool_pilots,
    reforecast_runs,
    reports_left,
    step_shape,
)
from gpucampaign.plan.stopping import futility_role
from tests.plan.test_decision import SPEC, _result


def test_the_pilot_measures_the_loop_start_and_the_segment_apart_from_its_steps() -> None:
    """20 steps of 0.01 s (one 0.5 s hiccup among them), 0.4 s of the loop's start once, 0.002 s
    of the loop's own a step, one 0.3 s evaluation, 1 s outside the loop and a segment 0.05 s
    longer than the call: the start is not spread over the steps, the hiccup not over the run."""
    spec = parse_spec(SPEC)
    step_times = [0.05] + [0.01] * 18 + [0.5]
    train_s = 0.4 + sum(step_times) + 20 * 0.002 + 0.3
    timings = {
        **_result().timings,
        "train_s": train_s,
        "loop_start_s": 0.4,
        "steps_s_sum": sum(step_times),
        "eval_s": [0.3],
        "stall_s": [],
        "save_s": [0.2],
        "total_s": 1.0 + train_s,
    }
    rows = [{"kind": "train", "step": i + 1, "step_s": t} for i, t in enumerate(step_times)]
    m = _control_pilot(spec, timings, segment_s=1.05 + train_s, rows=rows)
    assert m["loop_start_s"] == 0.4
    assert m["loop_s"] == pytest.approx(0.002)  # main: (0.4 + 0.04) / 20 = 0.022 a step
    assert m["step_mean_s"] == pytest.approx(0.01)  # main: the mean, 0.035
    assert m["first_step_s"] == 0.05
    assert m["outside_s"] == pytest.approx(0.05) and m["fixed_s"] == pytest.approx(1.0)
    assert m["save_s"] == 0.2 and m["evals_done"] == 1


def _control_pilot(
    spec: CampaignSpec, timings: dict, *, segment_s: float, rows: Sequence[dict] = ()
) -> dict:
    """The control's pilot measures from its 20 steps of ``timings`` (3200 training examples)."""
    return pilot_measures(
        spec.resolve_run("control"),
        result=_result(timings=timings, steps_done=20),
        n_train=3200,
        rows=rows,
        segment_s=segment_s,
    )


def _measured(
    *, step: float, fixed: float, loop: float, eval_s: float, planned: int, tax: float = 1.0
) -> dict:
    return {
        "step_s": step,  # the pilot's median step
        "step_mean_s": tax * step,  # its trimmed mean
        "first_step_s": 5 * step,
        "fixed_s": fixed,
        "loop_s": loop,
        "loop_start_s": 10 * loop,
        "outside_s": fixed / 10,
        "eval_s": eval_s,
        "evals": 20,
        "evals_done": 1,
        "stall_s": eval_s / 2,
        "save_s": eval_s,
        "saves": 4,
        "steps_done": 20,
        "planned_steps": planned,
        "batch_size": 32,
        "load_s": 0.1,
        "n_train": 3200,
    }


def test_the_reforecast_pools_the_costs_the_pilots_share_and_counts_each_runs_own() -> None:
    """Three pilots: the first pays the process's warm-up (outside the loop, in the loop, in its
    first evaluation) and another process's burst (its steps' trimmed mean 1.6 times their
    median). Each run is forecast with its own step time (its median, times the machine's tax
    on a step pooled over the pilots: 1.2) and its own counts (steps left, evaluations left at
    its cadence and the two final ones, saves), the costs shared by the pilots at their median
    (outside the loop: the median of the pilots less the first, which measured the most): the
    warm-up is not forecast again for every run, and
    nothing is forecast that was not measured."""
    spec = parse_spec(SPEC)
    pilot = {
        "control": _measured(step=0.010, fixed=2.0, loop=0.010, eval_s=0.30, planned=2000, tax=1.6),
        "wide": _measured(step=0.020, fixed=0.5, loop=0.002, eval_s=0.10, planned=2000),
        "big": _measured(step=0.018, fixed=0.6, loop=0.003, eval_s=0.12, planned=1000),
    }
    hours = reforecast_runs(spec, pilot=pilot)
    shared = {  # the median of the three pilots (outside the loop: of the two less the first)
        "fixed": 0.55,
        "loop": 0.003,
        "eval": 0.12,
        "outside": 0.06,
        "first": 5 * 0.018,
    }
    for step, run in (("c", "control"), ("w", "wide"), ("x", "big")):
        m = pilot[run]
        left = m["planned_steps"] - 20
        expected = (
            shared["outside"]
            + shared["fixed"]
            + 10 * shared["loop"]  # the loop's start, once
            + shared["first"]
            + (left - 1) * m["step_s"] * 1.2  # its own steps, the pooled tax: (1.6 + 1 + 1) / 3
            + left * shared["loop"]
            + (20 - 1 + 2) * shared["eval"]  # its cadence, less the pilot's, and the final two
            + 4 * shared["eval"] / 2  # its saves' waits
            + shared["eval"]  # the model folder's write, as long as a checkpoint's save
        )
        h, how = hours[step].hours, hours[step].how
        assert h * 3600 == pytest.approx(expected), run
        assert "loop start" in how and "evaluations" in how
    # On main the control's forecast was its own pilot's warm-up and burst spread over every
    # step: the least time outside the loop, then 1979 steps at their mean (16 ms), 1980 at its
    # loop's own (10 ms), its 20 evaluations at 0.3 s and 4 saves' waits: 58.6 s, not 33.2 s.
    main_s = 0.5 + 0.05 + 1979 * 0.016 + 1980 * 0.010 + 20 * 0.30 + 4 * 0.15
    assert hours["c"].hours * 3600 < 0.6 * main_s


def test_the_pilot_measures_the_live_views_reports_apart_from_the_loop_per_step() -> None:
    """A pilot's 20 steps with 3 of the live view's reports (0.03 s in all) in 0.1 s of the
    loop's own time: the reports are a cost at the run's cadence, not of each step."""
    spec = parse_spec(SPEC)
    timings = {
        **_result().timings,
        "train_s": 0.2 + 0.1,
        "loop_start_s": 0.0,
        "steps_s_sum": 0.2,
        "eval_s": [],
        "stall_s": [],
        "reports": 3,
        "report_s": 0.03,
        "total_s": 0.3,
    }
    m = _control_pilot(spec, timings, segment_s=0.3)
    assert m["report_s"] == pytest.approx(0.01) and m["reports"] == 3
    assert m["loop_s"] == pytest.approx(0.07 / 20)  # main: 0.1 / 20, the reports in it


def test_each_run_is_forecast_with_its_own_count_of_the_live_views_reports() -> None:
    """The live view reports after each evaluation and at the end: the control (2000 steps)
    evaluates every 100 steps, 'big' (1000 steps at twice the batch) every 50: the same count
    of reports for half the steps. Each run's loop is its steps at the pooled loop cost
    beyond the reports, plus its own reports left at the pooled report's cost."""
    spec = parse_spec(SPEC)
    pilot = {
        run: {
            **_measured(step=0.01, fixed=0.5, loop=0.001, eval_s=0.1, planned=planned),
            "report_s": 0.01,
            "reports": 1,
        }
        for run, planned in (("control", 2000), ("wide", 2000), ("big", 1000))
    }
    hours = reforecast_runs(spec, pilot=pilot)
    base = {run: dict(m, report_s=0.0) for run, m in pilot.items()}
    without = reforecast_runs(spec, pilot=base)  # the same, its reports at no cost
    # control: the multiples of 100 after step 20 up to 2000 (20); big: of 50 up to 1000 (20)
    assert (hours["c"].hours - without["c"].hours) * 3600 == pytest.approx(20 * 0.01)
    assert (hours["x"].hours - without["x"].hours) * 3600 == pytest.approx(20 * 0.01)


def test_reports_left_counts_the_steps_the_live_view_reports_at() -> None:
    """Against the live view's rule at each step, the clock aside: an evaluation's step or
    the last step (``engine.live.ProgressHook.wants_rows``); the ``progress`` callback's
    steps write nothing and are no report (main: each multiple of ``report_every`` too)."""
    for planned in (1, 7, 50, 99, 160, 400, 1013):
        for eval_step in (0, 1, 3, 20, 37):
            for done in (0, 1, 20, planned):
                want = sum(
                    1
                    for s in range(done + 1, planned + 1)
                    if (eval_step and s % eval_step == 0) or s == planned
                )
                got = reports_left(done=done, planned=planned, eval_step=eval_step)
                assert got == want, (planned, eval_step, done)


def test_a_pilot_without_an_evaluation_gives_the_one_timed_after_its_steps() -> None:
    """20 steps of a run that evaluates at each epoch's end (100 steps): none fell in the
    pilot, so the evaluation timed after its last save (0.3 s) is each evaluation's cost and
    is not counted as one of the run's, nor in the call's time outside the loop (main: no
    evaluation measured, 0 s for each of the run's 22)."""
    spec = parse_spec(SPEC)
    timings = {
        **_result().timings,
        "train_s": 0.5,
        "loop_start_s": 0.0,
        "steps_s_sum": 0.4,
        "eval_s": [],
        "stall_s": [],
        "probe_eval_s": 0.3,
        "total_s": 1.0 + 0.5 + 0.3,
    }
    m = _control_pilot(spec, timings, segment_s=1.8)
    assert m["eval_s"] == 0.3 and m["evals_done"] == 0
    assert m["fixed_s"] == pytest.approx(1.0)


def test_the_pilots_of_one_step_share_their_median_step() -> None:
    """The control's pilot met another process's burst (its median step 50 ms); 'lr-high' and
    'short' train the same step (they change the learning rate, the length) and measured
    10 and 11 ms: the three are forecast at their median step, 11 ms. 'bf16' trains another
    step and keeps its own (main: each run its own pilot's, the control's 50 ms over 1980
    steps)."""
    spec = parse_spec(
        {
            **SPEC,
            "calendar": [
                {"name": n, "kind": "machine", "resource": "gpu", "hours": 1, "run": n}
                for n in ("control", "lr-high", "short", "bf16")
            ],
            "variants": [
                {"name": "lr-high", "tier": "useful", "changes": {"lr": 0.003}},
                {"name": "short", "tier": "useful", "changes": {"epochs": 8}},
                {"name": "bf16", "tier": "useful", "changes": {"precision": "bf16"}},
            ],
        }
    )
    shapes = {n: step_shape(spec.run_config(n)) for n in ("control", "lr-high", "short", "bf16")}
    assert shapes["control"] == shapes["lr-high"] == shapes["short"] != shapes["bf16"]
    steps = {"control": 0.050, "lr-high": 0.010, "short": 0.011, "bf16": 0.020}
    pilot = {
        n: {
            **_measured(step=s, fixed=0.5, loop=0.001, eval_s=0.1, planned=2000),
            "step_shape": shapes[n],
        }
        for n, s in steps.items()
    }
    same = {n: 0.011 if n != "bf16" else 0.020 for n in pilot}  # the step each is forecast at
    alone = {n: {**pilot[n], "step_s": same[n], "step_mean_s": same[n]} for n in pilot}
    hours, expected = reforecast_runs(spec, pilot=pilot), reforecast_runs(spec, pilot=alone)
    for n in steps:
        assert hours[n].hours == pytest.approx(expected[n].hours), n
    assert hours["control"].hours * 3600 < 0.5 * 1980 * 0.050
    # The decision keeps the step each rests on and the parts its hours sum: the report says
    # the pooled 11 ms, not the control's own 50 ms, and splits a miss at them (main: only
    # the hours and their text).
    from gpucampaign.plan.decision import decide_after_pilot

    kept = decide_after_pilot(spec, catalog=None, pilot=pilot, pilot_stops=[]).hours_record()
    for n in steps:
        assert kept[n]["step_s"] == pytest.approx(same[n]), n
        assert 3600 * kept[n]["hours"] == pytest.approx(sum(kept[n]["parts_s"].values()))
        assert kept[n]["steps"] == 2000 - pilot[n]["steps_done"]


def test_the_pilots_warm_up_steps_are_counted_once_not_spread_over_the_run() -> None:
    """A pilot's 20 steps: the first 0.05 s, the next nine warming up (0.04 s each: the first
    half), the other 10 settled at 0.01 s. The settled steps give the run's step time (median
    and trimmed mean 0.01 s); the warm-up is counted once, at what it cost, in a call of 380
    steps: 0.05 + 0.36 + 370 x 0.01 = 4.11 s (main: the warm-up in the trimmed mean, 0.0241 s,
    for each of the 379 steps after the first: 9.2 s)."""
    spec = parse_spec(SPEC)
    step_times = [0.05] + [0.04] * 9 + [0.01] * 10
    timings = {
        **_result().timings,
        "step_s": sorted(step_times[1:])[9],  # the engine's: the median without the first
        "train_s": sum(step_times),
        "loop_start_s": 0.0,
        "steps_s_sum": sum(step_times),
        "eval_s": [],
        "stall_s": [],
        "total_s": sum(step_times),
    }
    rows = [{"kind": "train", "step": i + 1, "step_s": t} for i, t in enumerate(step_times)]
    m = _control_pilot(spec, timings, segment_s=sum(step_times), rows=rows)
    assert m["step_s"] == pytest.approx(0.01) and m["step_mean_s"] == pytest.approx(0.01)
    assert m["warmup_s"] == pytest.approx(0.36) and m["warmup_steps"] == 9
    assert call_parts(m, left=380)["steps"] == pytest.approx(0.05 + 0.36 + 370 * 0.01)
    # A call too short for the whole warm-up pays its share of it.
    assert call_parts(m, left=3)["steps"] == pytest.approx(0.05 + 2 * 0.04)
    # The pilots' step pooled: the warm-up does not raise the machine's tax on a step.
    pooled = pool_pilots({"control": {**m, "fixed_s": 0.0}})["control"]
    assert pooled["step_mean_s"] == pytest.approx(0.01)


def test_the_restore_the_pilot_timed_is_forecast_for_the_call_that_resumes() -> None:
    """A pilot that started from nothing timed a read of its save (0.2 s, ``probe_restore_s``,
    in its ``total_s``): the call resuming the run pays it outside the loop; it is not the
    pilot's own set-up (``fixed_s`` stays 1 s; main: 1.2 s in ``fixed_s`` and no restore for a
    call that restores, or none at all when the pilot took none)."""
    spec = parse_spec(SPEC)
    timings = {
        **_result().timings,
        "train_s": 0.5,
        "loop_start_s": 0.0,
        "steps_s_sum": 0.4,
        "eval_s": [0.1],
        "stall_s": [],
        "probe_restore_s": 0.2,
        "total_s": 1.0 + 0.5 + 0.2,
    }
    m = _control_pilot(spec, timings, segment_s=1.7)
    assert m["fixed_s"] == pytest.approx(1.0) and m["resume_s"] == 0.2
    assert call_parts(m, left=100)["outside"] == pytest.approx(1.2)


def test_the_time_outside_the_loop_is_the_median_of_the_pilots_less_the_first() -> None:
    """The demo's four pilots measured 109 ms outside the loop (the first, the process's
    warm-up), 18, 24 and 28 ms; its training calls, one draw each, 28-40 ms: the pooled time is
    the median of the three after the first, 24 ms (main: the least, 18 ms). Two pilots give
    the lesser: the other paid the warm-up."""
    four = {
        run: _measured(step=0.01, fixed=f, loop=0.001, eval_s=0.1, planned=400)
        for run, f in (("control", 0.109), ("lr-high", 0.018), ("bf16", 0.024), ("short", 0.028))
    }
    assert pool_pilots(four)["short"]["fixed_s"] == pytest.approx(0.024)
    two = {run: four[run] for run in ("control", "bf16")}
    assert pool_pilots(two)["control"]["fixed_s"] == pytest.approx(0.024)


DEMO = Path(__file__).resolve().parents[2] / "examples" / "digits" / "campaign.yaml"


def test_futility_looks_are_counted_at_the_training_calls_evaluations() -> None:
    """The demo (an evaluation every 20 steps, pilots of 20, grace 25%): the control records
    at each of its 19 evaluations left; 'lr-high' (400 steps) checks from step 100 (the grace)
    to 380, never at its last: 15; 'short' (160 steps) from step 40 to 140: 6; with futility
    off nothing does."""
    spec = load_spec(DEMO)
    planned = {n: spec.run_config(n).planned_steps(1259) for n in ("control", "lr-high", "short")}
    assert planned == {"control": 400, "lr-high": 400, "short": 160}

    def looks(s: CampaignSpec, run: str) -> int:
        p = s.run_config(run).planned_steps(1259)
        return futility_looks_left(s, run=run, done=20, planned=p, eval_step=20)

    assert {n: looks(spec, n) for n in planned} == {"control": 19, "lr-high": 15, "short": 6}
    off = spec.model_copy(
        update={"stop_rules": spec.stop_rules.model_copy(update={"futility": False})}
    )
    assert {n: looks(off, n) for n in planned} == {"control": 0, "lr-high": 0, "short": 0}


def test_futilitys_role_is_one_rule_for_the_hook_its_probe_and_the_count_of_looks() -> None:
    """``futility_role`` on the demo with seeds bought and a data-parallel variant: the control
    records, a variant's training call checks (not its pilot, nor a run of two GPUs, said why),
    the control's seeds never look; with futility off a variant says so. The looks the
    re-forecast counts follow it: some where it looks, none where it is off."""
    base = load_spec(DEMO)
    control = base.control.model_copy(update={"seeds": (0, 1, 2)})
    wide = base.variants[1].model_copy(update={"changes": {"gpus": 2}})
    spec = base.model_copy(update={"control": control, "variants": [base.variants[0], wide]})
    roles = {run: futility_role(spec, run=run) for run in spec.run_names()}
    assert roles == {
        "control": ("record", ""),
        "control.s1": ("off", ""),
        "control.s2": ("off", ""),
        "lr-high": ("check", ""),
        "bf16": ("off", "a data-parallel run (gpus > 1) is not checked"),
    }
    assert futility_role(spec, run="lr-high", pilot=True) == ("off", "")
    assert futility_role(spec, run="control", pilot=True) == ("record", "")
    for run, (role, _) in roles.items():
        looks = futility_looks_left(spec, run=run, done=20, planned=400, eval_step=20)
        assert (looks > 0) == (role != "off"), run
    off = spec.model_copy(
        update={"stop_rules": spec.stop_rules.model_copy(update={"futility": False})}
    )
    assert futility_role(off, run="control") == ("off", "")
    assert futility_role(off, run="lr-high") == (
        "off",
        "futility is off (stop_rules.futility: false)",
    )


def test_each_look_is_forecast_at_its_roles_cost_the_pilots_probe_timed() -> None:
    """Pilots whose probe timed a record (5, 3 and 4 ms: pooled, 4 ms) and a check (10, 7 and
    8 ms: pooled, 8 ms), each with its scores: the control's training forecast holds its 19
    records at 4 ms, a variant's its 15 checks at 8 ms (6 for 'short'). Main priced both at
    the scores alone, while a variant's check costs about twice a record (the demo: 2.6-3.0 ms
    a check, 1.9 ms a record, 1.3-2.0 ms the scores): every variant was under-forecast."""
    spec = load_spec(DEMO)
    runs = ("control", "lr-high", "short")
    base = {
        n: {
            **_measured(step=0.001, fixed=0.02, loop=0.0001, eval_s=0.002, planned=400),
            "step_shape": step_shape(spec.run_config(n)),
            "n_train": 1259,
        }
        for n in runs
    }
    base["short"]["planned_steps"] = 160
    record = {"control": 0.005, "lr-high": 0.003, "short": 0.004}
    check = {"control": 0.010, "lr-high": 0.007, "short": 0.008}
    timed = {n: {**m, "record_s": record[n], "check_s": check[n]} for n, m in base.items()}
    with_looks, without = reforecast_runs(spec, pilot=timed), reforecast_runs(spec, pilot=base)
    added = {
        step: round(3600 * (with_looks[step].hours - without[step].hours), 9) for step in with_looks
    }
    assert added == {
        "train-control": pytest.approx(19 * 0.004),
        "train-lr-high": pytest.approx(15 * 0.008),
        "train-short": pytest.approx(6 * 0.008),
        "train-bf16": pytest.approx(15 * 0.008),  # not piloted: from step 0, the same checks
    }


def test_the_pilot_times_its_looks_and_the_scores_apart_from_the_loop() -> None:
    """The control's pilot: one look after its evaluation (its record, 0.03 s) and the probe of
    the looks after its last save (0.012 s in all): the look leaves the loop's per-step cost,
    the probe the time outside the loop, and a record's and a check's costs are kept for the
    forecast of each look."""
    spec = parse_spec(SPEC)
    step_times = [0.01] * 20
    train_s = sum(step_times) + 20 * 0.002 + 0.3 + 0.03
    timings = {
        **_result().timings,
        "train_s": train_s,
        "loop_start_s": 0.0,
        "steps_s_sum": sum(step_times),
        "eval_s": [0.3],
        "stall_s": [],
        "looks": 1,
        "look_s": 0.03,
        "probe_looks_s": 0.012,
        "probe_record_s": 0.004,
        "probe_check_s": 0.007,
        "total_s": 1.0 + train_s + 0.012,
    }
    rows = [{"kind": "train", "step": i + 1, "step_s": t} for i, t in enumerate(step_times)]
    m = _control_pilot(spec, timings, segment_s=1.0 + train_s + 0.012, rows=rows)
    assert m["loop_s"] == pytest.approx(0.002)  # main: 0.0035, the record spread on 20 steps
    assert m["look_s"] == pytest.approx(0.03)
    assert (m["record_s"], m["check_s"]) == pytest.approx((0.004, 0.007))
    assert m["fixed_s"] == pytest.approx(1.0)


def test_the_loops_time_is_split_at_the_pilots_marks() -> None:
    """A pilot's 20 steps (0.01 s each) with 0.06 s of the loop's own time: 0.015 s before its
    mark at step 10 (the first epoch's start, the cold code), 0.009 s between its marks at
    steps 10 and 19 (a report of 0.005 s there, apart), 0.036 s after (step 20's evaluation
    of 0.1 s aside: the rows flushed before it, the save's hand-over). A call pays 1 ms at
    each step, 35 ms more at each evaluation and 5 ms once (main: 3 ms at each step, the
    demo's pilots 75-130 us a step so against 48-58 us in its calls)."""
    spec = parse_spec(SPEC)
    zero = {"eval_s": 0.0, "stall_s": 0.0, "look_s": 0.0}
    marks = [
        {"step": 10, "at_s": 0.115, "steps_s": 0.1, "report_s": 0.0, **zero},
        {"step": 19, "at_s": 0.219, "steps_s": 0.19, "report_s": 0.005, **zero},
        {"step": 20, "at_s": 0.365, "steps_s": 0.2, "report_s": 0.005, **zero, "eval_s": 0.1},
    ]
    timings = {
        **_result().timings,
        "train_s": 0.365,
        "loop_start_s": 0.0,
        "steps_s_sum": 0.2,
        "eval_s": [0.1],
        "stall_s": [],
        "reports": 1,
        "report_s": 0.005,
        "marks": marks,
        "total_s": 0.4,
    }
    m = _control_pilot(spec, timings, segment_s=0.4)
    split = (m["loop_s"], m["loop_eval_s"], m["loop_warm_s"])
    assert split == pytest.approx((0.001, 0.035, 0.005))
    left, evals_left = m["planned_steps"] - 20, m["evals"] - m["evals_done"]
    reports = reports_left(done=20, planned=m["planned_steps"], eval_step=m["eval_step"])
    assert call_parts(m, left=left)["loop"] == pytest.approx(
        left * 0.001 + evals_left * 0.035 + 0.005 + reports * 0.005
    )
    # A pilot that evaluated nothing: its last step's time goes with the once-a-call part.
    quiet = {
        **timings,
        "eval_s": [],
        "train_s": 0.265,
        "probe_eval_s": 0.1,
        "total_s": 0.4,
        "marks": [*marks[:2], {**marks[2], "at_s": 0.265, "eval_s": 0.0}],
    }
    m = _control_pilot(spec, quiet, segment_s=0.4)
    assert (m["loop_s"], m["loop_warm_s"]) == pytest.approx((0.001, 0.04))
    assert "loop_eval_s" not in m
    # Records without the three marks (before them, or the two of the round before): per step
    for older in ({**timings, "marks": []}, {**timings, "marks": marks[:2]}):
        m = _control_pilot(spec, older, segment_s=0.4)
        assert m["loop_s"] == pytest.approx(0.06 / 20) and "loop_warm_s" not in m


def test_the_same_steps_settled_times_are_pooled_at_their_median_with_no_tax() -> None:
    """Three pilots of one step: their settled steps (after their warm-up) pooled, 25 times,
    median 11 ms, whatever each pilot's trimmed mean over its median (no tax on top: the
    pilots' later steps still run slower than a long call's). 'bf16' keeps its own."""
    spec = load_spec(DEMO)
    settled = {"control": [0.010] * 10, "lr-high": [0.012] * 10, "short": [0.011] * 5}
    pilot = {
        n: {
            **_measured(step=max(t), fixed=0.02, loop=0.0001, eval_s=0.002, planned=400, tax=1.4),
            "step_shape": step_shape(spec.run_config(n)),
            "settled_s": t,
        }
        for n, t in {**settled, "bf16": [0.020] * 10}.items()
    }
    pooled = pool_pilots(pilot)
    assert {n: pooled[n]["step_mean_s"] for n in pilot} == pytest.approx(
        {"control": 0.011, "lr-high": 0.011, "short": 0.011, "bf16": 0.020}
    )
    assert pooled["short"]["step_s"] == pytest.approx(0.011)
