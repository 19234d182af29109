"""Forecasts with a p10-p90 range; the re-forecast covers what surrounds a step, measured by
the pilot (plan/ranges.py, plan/decision.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from gpucampaign.plan.ranges import DEFAULT_SPREAD, hours_range, observed_ratios, spread_of
from tests.plan.test_decision import SPEC, _result, parse_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_ranges_learned_from_earlier_errors_hold_80_percent_of_new_actuals() -> None:
    """Simulated: ratios actual / forecast drawn from one law; the p10-p90 learned from 200
    earlier campaigns holds about 80% of 2000 new ones (asserted on both sides)."""
    rng = np.random.default_rng(0)
    earlier = rng.lognormal(mean=0.1, sigma=0.3, size=200)
    lo, hi = spread_of(earlier)
    new = rng.lognormal(mean=0.1, sigma=0.3, size=2000)
    inside = float(np.mean((new >= lo) & (new <= hi)))
    assert 0.75 <= inside <= 0.85
    assert spread_of([]) == DEFAULT_SPREAD
    few_lo, few_hi = spread_of([1.0, 1.2])  # a handful: the extremes, widened
    assert few_lo < 1.0 and few_hi > 1.2
    assert hours_range(2.0, (0.5, 1.5)) == (1.0, 3.0)


def test_the_reforecast_counts_the_loop_start_up_and_save_waits_the_pilot_measured() -> None:
    """A pilot of 5 steps: 0.05 s first step, 0.01 s later ones, 0.02 s of the loop's own per
    step, 3 s outside the loop: the 1995 steps left cost what surrounds them too."""
    from gpucampaign.plan.reforecast import forecast_run, pilot_measures

    spec = parse_spec(SPEC)
    timings = {
        **_result().timings,
        "train_s": 0.09 + 5 * 0.02 + 1.5 + 0.1,
        "steps_s_sum": 0.09,
        "eval_s": [0.5, 0.5, 0.5],
        "stall_s": [0.1],
        "total_s": 3.0 + 0.09 + 5 * 0.02 + 1.5 + 0.1,
    }
    rows = [{"kind": "train", "step": 1, "step_s": 0.05}] + [
        {"kind": "train", "step": s, "step_s": 0.01} for s in range(2, 6)
    ]
    m = pilot_measures(
        spec.resolve_run("control"), result=_result(timings=timings), n_train=3200, rows=rows
    )
    assert m["first_step_s"] == 0.05 and m["step_mean_s"] == pytest.approx(0.01)
    assert m["loop_s"] == pytest.approx(0.02) and m["fixed_s"] == pytest.approx(3.0)
    f = forecast_run(spec, run="control", pilot={"control": m}, planned_steps=2000)
    hours, how = f.hours, f.how
    left = 2000 - 5
    # 20 evaluations at the epochs' ends, 3 of them done in the pilot, and the 2 final ones;
    # the model folder's write at the end, as long as the pilot's save (0.2 s)
    expected = 3.0 + 0.05 + (left - 1) * 0.01 + left * 0.02 + (20 - 3 + 2) * 0.5 + 50 * 0.1 + 0.2
    assert hours * 3600 == pytest.approx(expected)
    assert "loop 39.9 s" in how


def test_plan_calibrates_from_several_campaigns_their_hours_and_ranges(tmp_path: Path) -> None:
    """`plan --calibrate-from A --calibrate-from B`: the median of their calibrated hours, and
    each step's range from the errors their re-forecasts made."""
    from gpucampaign.cli import app

    pilot = {
        "batch_size": 64,
        "n_train": 1000,
        "load_s": 36.0,
        "step_s": 0.5,
        "eval_s": 9.0,
        "evals": 20,
        "save_s": 18.0,
        "saves": 10,
        "planned_steps": 320,
    }
    outs = []
    for i, (step_s, ratios) in enumerate([(1.0, [1.1, 1.3, 0.9]), (3.0, [1.2, 1.0, 1.4])]):
        out = tmp_path / f"earlier{i}"
        out.mkdir()
        measured = {"load_s": 36.0, "step_s": step_s, "eval_s": 9.0, "save_s": 18.0}
        (out / "estimates.json").write_text(
            json.dumps(
                {"campaign_id": f"old-{i}", "measured": measured, "pilot": {"control": pilot}}
            )
        )
        steps = [
            {"step": f"s{j}", "run": "control", "reforecast_hours": 1.0, "observed_hours": r}
            for j, r in enumerate(ratios)
        ]
        report = {"budget": {}, "verdict": {}, "forecast_vs_actual": {"steps": steps}}
        (out / "report.json").write_text(json.dumps(report))
        outs += ["--calibrate-from", str(out)]
    spec = EXAMPLES / "digits" / "campaign.yaml"
    res = CliRunner().invoke(app, ["plan", str(spec), "--json", *outs])
    d = json.loads(res.stdout)
    steps = 20 * -(-1259 // 64)
    one = (36.0 + steps * 1.0 + 20 * 9.0 + 10 * 18.0) / 3600
    three = (36.0 + steps * 3.0 + 20 * 9.0 + 10 * 18.0) / 3600
    hours = {s["name"]: s["hours"] for s in d["steps"]}
    assert hours["train-control"] == pytest.approx((one + three) / 2, rel=1e-3)
    lo, hi = d["ranges"]["train-control"]
    p10, p90 = np.quantile([1.1, 1.3, 0.9, 1.2, 1.0, 1.4], [0.1, 0.9])
    assert lo == pytest.approx(hours["train-control"] * p10, rel=1e-3)
    assert hi == pytest.approx(hours["train-control"] * p90, rel=1e-3)
    assert (
        "old-0" in d["calibrated"]["train-control"] and "old-1" in d["calibrated"]["train-control"]
    )
    assert observed_ratios({"forecast_vs_actual": {"steps": [{"run": None}]}}) == []


def test_each_call_outside_its_loop_costs_the_least_any_pilot_measured() -> None:
    """The first pilot pays the process's one-time warm-up outside its loop: the re-forecast
    of every run takes the least time outside the loop any pilot measured."""
    from gpucampaign.plan.reforecast import reforecast_runs
    from tests.plan.test_decision import PILOT

    spec = parse_spec(SPEC)
    surround = {"loop_s": 0.0, "stall_s": 0.0, "steps_done": 0, "step_mean_s": 0.01}
    cold = {**PILOT["control"], **surround, "fixed_s": 2.0}
    warm = {**PILOT["control"], **surround, "fixed_s": 0.1, "planned_steps": 200}
    alone = reforecast_runs(spec, pilot={"control": cold})
    both = reforecast_runs(spec, pilot={"control": cold, "wide": warm})
    control = next(s.name for s in spec.calendar if s.run == "control")
    assert (alone[control].hours - both[control].hours) * 3600 == pytest.approx(1.9)
