"""The decision point's pure logic and the input model a person fills in the UI (R3, R9)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpucampaign.config import parse_spec
from gpucampaign.plan.decision import DecisionInput, apply_answer, check_decision_input, decide_auto
from gpucampaign.plan.reforecast import forecast_run

SPEC = {
    "name": "d",
    "packages": [{"gpu": "rtx4090", "days": 3}],
    "calendar": [
        {"name": "c", "kind": "machine", "resource": "gpu", "hours": 1, "run": "control"},
        {
            "name": "w",
            "kind": "machine",
            "resource": "gpu",
            "hours": 1,
            "run": "wide",
            "tier": "useful",
        },
        {
            "name": "x",
            "kind": "machine",
            "resource": "gpu",
            "hours": 1,
            "run": "big",
            "tier": "exploratory",
        },
    ],
    "control": {"batch_size": 32},
    "variants": [
        {"name": "wide", "tier": "useful", "changes": {"hidden": [128]}},
        {"name": "big", "tier": "exploratory", "changes": {"batch_size": 64}},
    ],
}
PILOT = {
    "control": {
        "load_s": 2.0,
        "step_s": 0.01,
        "eval_s": 0.5,
        "save_s": 0.2,
        "evals": 4,
        "saves": 2,
        "batch_size": 32,
        "planned_steps": 100,
        "n_train": 3200,
    }
}


def _auto(**kw):
    base = dict(
        fits_all=True,
        reduced_fits=True,
        reduced_dropped_runs=[],
        reduced_dropped_steps=[],
        pilot_stops=[],
        essential_runs=["control"],
        span_hours=10,
        reduced_span_hours=10,
        window_hours=72,
    )
    return decide_auto(**{**base, **kw})


def test_continue_when_it_fits():
    d = _auto()
    assert d.action == "continue" and d.kept and "fits" in d.reasons[0]


def test_reduce_names_what_it_drops():
    d = _auto(
        fits_all=False,
        reduced_dropped_runs=["big"],
        reduced_dropped_steps=["x"],
        span_hours=80,
        reduced_span_hours=60,
    )
    assert d.action == "reduce"
    assert d.dropped_runs == ["big"]
    assert "80.00 h exceeds the 72 h window" in d.reasons[0]


def test_repose_when_essentials_do_not_fit():
    d = _auto(fits_all=False, reduced_fits=False, reduced_span_hours=90, span_hours=100)
    assert d.action == "re-pose" and not d.kept
    assert "90.00 h" in d.reasons[0]


def test_repose_when_the_pilot_of_an_essential_run_stopped():
    stop = {"run": "control", "rule": "non_finite_loss", "reason": "loss is nan at step 3"}
    d = _auto(pilot_stops=[stop])
    assert d.action == "re-pose"
    assert "non_finite_loss" in d.reasons[0]


def test_forecast_uses_own_pilot_or_scales_the_controls():
    spec = parse_spec(SPEC)
    f = forecast_run(spec, run="control", pilot=PILOT, planned_steps=100)
    hours, how = f.hours, f.how
    assert hours == pytest.approx((2.0 + 100 * 0.01 + 4 * 0.5 + 2 * 0.2) / 3600)
    assert "pilot of 'control'" in how
    big = forecast_run(spec, run="big", pilot=PILOT, planned_steps=50)
    hours_big, how_big = big.hours, big.how
    # batch 64 vs 32: twice the cost per step, half the steps.
    assert hours_big == pytest.approx((2.0 + 50 * 0.02 + 4 * 0.5 + 2 * 0.2) / 3600)
    assert "not piloted" in how_big


def test_decision_input_model_validates():
    spec = parse_spec(SPEC)
    with pytest.raises(ValidationError):
        DecisionInput(action="maybe")
    with pytest.raises(ValidationError):
        DecisionInput(action="reduce", drop=["big", "big"])
    with pytest.raises(ValidationError):
        DecisionInput.model_validate({"action": "continue", "surprise": 1})
    with pytest.raises(ValueError, match="essential"):
        check_decision_input(spec, DecisionInput(action="reduce", drop=["control"]))
    with pytest.raises(ValueError, match="not a run"):
        check_decision_input(spec, DecisionInput(action="reduce", drop=["nope"]))
    with pytest.raises(ValueError, match="only the 'reduce'"):
        check_decision_input(spec, DecisionInput(action="continue", drop=["big"]))
    ok = apply_answer(
        spec, answer=DecisionInput(action="reduce", drop=["big"], note="GPU busy"), auto=_auto()
    )
    assert ok.by == "person" and ok.dropped_runs == ["big"] and ok.dropped_steps == ["x"]
    assert "the automatic rule proposed 'continue'" in ok.reasons


# --- the decide task's composition, as library functions -------------------------------------
def _result(**kw):
    from gpucampaign.folder.runresult import RunResult

    base = dict(
        run_id="control-0123456789",
        run="control",
        completed=False,
        steps_done=5,
        planned_steps=2000,
        metrics={},
        n_checkpoints=1,
        checkpoint_every=40,
        save_interval=None,
        resumed_from_step=None,
        timings={"load_s": 2.0, "step_s": 0.01, "eval_s": [0.4, 0.6, 0.5], "save_s": 0.2},
    )
    return RunResult(**{**base, **kw})


def test_pilot_measures_count_steps_from_the_run_config():
    from gpucampaign.plan.reforecast import pilot_measures

    spec = parse_spec(SPEC)
    m = pilot_measures(spec.resolve_run("control"), result=_result(), n_train=3200)
    # 20 epochs (the default) of 3200 / 32 = 100 steps; evaluated at each epoch end.
    assert m["planned_steps"] == spec.run_config("control").planned_steps(3200) == 2000
    assert m["evals"] == 20 and m["saves"] == 50
    assert (m["load_s"], m["step_s"], m["eval_s"], m["save_s"]) == (2.0, 0.01, 0.5, 0.2)
    assert m["restore_s"] == 0.0 and m["steps_done"] == 5 and m["batch_size"] == 32


def _pilot(step_s: float) -> dict:
    return {"control": {**PILOT["control"], "step_s": step_s, "planned_steps": 1000}}


def test_decide_after_pilot_continues_when_the_reforecast_fits():
    from gpucampaign.plan.decision import decide_after_pilot

    spec = parse_spec(SPEC)
    refo = decide_after_pilot(spec, catalog=None, pilot=_pilot(0.01), pilot_stops=[])
    assert refo.decision.action == "continue" and refo.plan.fits
    assert set(refo.hours) == {"c", "w", "x"}
    assert refo.hours_record()["c"]["hours"] == pytest.approx(refo.hours["c"][0])


def test_decide_after_pilot_drops_the_exploratory_run_first():
    from gpucampaign.plan.decision import decide_after_pilot, decision_markdown

    spec = parse_spec(SPEC)
    # One GPU lane, 70 s a step: control 1000 steps (19.4 h), wide 2000 steps (38.9 h), big
    # 1000 steps of twice the batch (38.9 h): 97 h in all, 58 h without big, in a 72 h window.
    refo = decide_after_pilot(spec, catalog=None, pilot=_pilot(70.0), pilot_stops=[])
    assert refo.decision.action == "reduce" and refo.decision.dropped_runs == ["big"]
    assert refo.decision.dropped_steps == ["x"] and not refo.plan.fits
    md = decision_markdown(refo.decision, refo.hours)
    assert "**reduce**" in md and "Dropped runs: big" in md and "| x |" in md


def test_decide_after_pilot_re_poses_when_an_essential_pilot_stopped():
    from gpucampaign.plan.decision import decide_after_pilot, on_timeout

    spec = parse_spec(SPEC)
    stop = {"run": "control", "rule": "non_finite_loss", "reason": "nan"}
    refo = decide_after_pilot(spec, catalog=None, pilot={}, pilot_stops=[stop])
    assert refo.decision.action == "re-pose" and refo.hours == {}
    late = on_timeout(refo.decision, why="no answer in time")
    assert late.by == "timeout" and late.reasons[-1] == "no answer in time"
    assert late.action == "re-pose"


def test_the_decision_after_the_pilot_is_recorded_once_in_one_shape(tmp_path):
    import json

    from gpucampaign.folder.records import (
        decision_after_pilot,
        read_decisions,
        read_plan,
        record_decision_after_pilot,
    )
    from gpucampaign.plan.decision import decide_after_pilot

    spec = parse_spec(SPEC)
    refo = decide_after_pilot(spec, catalog=None, pilot=_pilot(0.01), pilot_stops=[])
    record_decision_after_pilot(tmp_path, refo.decision, reforecast=refo)
    (line,) = [json.loads(x) for x in (tmp_path / "decisions.jsonl").read_text().splitlines()]
    assert line["point"] == "after-pilot" and line["decision"]["action"] == "continue"
    assert line["reforecast"]["c"]["hours"] == pytest.approx(refo.hours["c"][0])
    assert decision_after_pilot(read_decisions(tmp_path)) == refo.decision
    assert read_plan(tmp_path, relative="reforecast.json").step("c").hours == pytest.approx(
        refo.hours["c"][0], abs=1e-6
    )
    assert refo.decision.summary().startswith("continue by auto: the re-forecast span")


def test_the_forms_deadline_is_a_time_not_a_frozen_count_of_seconds():
    """The form stays open while nothing updates it: "taken in 628 s" stays 628 s; the time
    the proposal is taken reads right whenever the page is looked at."""
    from datetime import UTC, datetime, timedelta

    from gpucampaign.plan.decision import Decision, ask_description

    deadline = datetime(2026, 1, 5, 9, 0, tzinfo=UTC) + timedelta(seconds=628)
    text = ask_description(
        "evidence", auto=Decision(action="continue", reasons=["fits"]), deadline=deadline
    )
    assert "by 2026-01-05 09:10:28 UTC the proposal is taken" in text
    assert "628" not in text and " s " not in text
