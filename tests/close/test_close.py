"""The close: verdict (R1), budget (R13, R14), forecast vs actual (R16), the report."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpucampaign.cli import app
from gpucampaign.close.budget import close_budget, render_budget_md
from gpucampaign.close.forecast import actual_intervals, forecast_vs_actual, load_estimates
from gpucampaign.close.report import SUMMARY_KEYS
from gpucampaign.close.verdict import RunEvidence, decide_verdict
from gpucampaign.config import DecisionRule, Expense, Package, SpecError, parse_spec
from gpucampaign.core.errors import ArgumentError, FolderError
from gpucampaign.folder.records import DecisionRecord, PlanRecord, StopRecord, TimelineRow

LOT_3D = Package(gpu="rtx4090", days=3)


def _budget(
    *deliveries: tuple[str, str, bool, str],
    packages: list[Any] | None = None,
    unit: str | None = "corpus",
    **kw: Any,
) -> dict[str, Any]:
    """``close_budget`` of these ``(id, content sha256, accepted, reason)`` deliveries, on one
    3-day lot unless ``packages`` says otherwise."""
    return close_budget(
        packages or [LOT_3D],
        unit=unit,
        deliveries=[
            {"id": i, "content_sha256": h, "accepted": a, "reason": r} for i, h, a, r in deliveries
        ],
        **kw,
    )


# --- budget: the MISSION's numbers come out exactly -----------------------------------------
def test_two_three_day_lots_cost_94_28():
    b = _budget(
        ("c1", "a" * 64, True, "passed"), packages=[Package(gpu="rtx4090", days=3, count=2)]
    )
    assert Decimal(repr(b["rental_usd"])) == Decimal("94.28")
    assert b["packages"][0]["price_usd"] == 47.14 and b["packages"][0]["count"] == 2
    assert b["spent_usd"] == 94.28


def test_two_accepted_deliveries_give_23_57_each():
    b = _budget(
        ("c1", "a" * 64, True, "passed the announced checks"),
        ("c2", "b" * 64, True, "passed the announced checks"),
    )
    assert b["accepted_deliveries"] == 2
    assert Decimal(repr(b["rental_per_accepted_usd"])) == Decimal("23.57")
    assert b["undefined_reason"] is None
    assert "23.57 USD" in render_budget_md(b)


def test_replays_of_the_same_content_count_once():
    replays = [(f"timing-{k}", "a" * 64, True, "passed") for k in range(5)]
    b = _budget(*replays, ("c2", "b" * 64, True, "passed"))
    assert b["accepted_deliveries"] == 2
    assert len(b["replays"]) == 4 and all(r["replay_of"] == "timing-0" for r in b["replays"])
    assert b["rental_per_accepted_usd"] == 23.57


def test_zero_accepted_is_undefined_and_shows_the_money_and_each_reason():
    b = _budget(
        ("c1", "a" * 64, False, "stopped: non-finite loss at step 12"),
        ("c2", "b" * 64, False, "audit: 14 rows leak between train and test"),
    )
    assert b["rental_per_accepted_usd"] is None
    assert b["spent_usd"] == 47.14 and b["rental_usd"] == 47.14
    assert "non-finite loss at step 12" in b["undefined_reason"]
    assert "14 rows leak" in b["undefined_reason"]
    assert "47.14" in b["undefined_reason"]
    assert [r["id"] for r in b["rejected"]] == ["c1", "c2"]
    md = render_budget_md(b)
    assert (
        "undefined" in md
        and "47.14" in md
        and "0.00 USD" not in md.split("Spent")[1].split("\n")[0]
    )


def test_no_delivery_at_all_is_still_undefined_not_zero():
    b = _budget(unit="model")
    assert b["rental_per_accepted_usd"] is None and b["spent_usd"] == 47.14
    assert "no delivery was produced" in b["undefined_reason"]


def test_other_expenses_stay_apart_and_never_change_the_rental_ratio():
    b = _budget(
        ("c1", "a" * 64, True, "ok"),
        ("c2", "b" * 64, True, "ok"),
        expenses=[Expense(name="egress of 20 GB", usd=1.8, note="inv-7")],
    )
    assert b["other_expenses_usd"] == 1.8
    assert b["spent_usd"] == 48.94
    assert b["rental_per_accepted_usd"] == 23.57
    assert b["expenses"] == [{"name": "egress of 20 GB", "usd": 1.8, "note": "inv-7"}]


def test_no_invented_costs_or_hourly_rates():
    b = _budget(("c1", "a" * 64, True, "ok"))
    assert (
        b["expenses"] == [] and b["other_expenses_usd"] == 0.0 and b["spent_usd"] == b["rental_usd"]
    )
    text = (render_budget_md(b) + json.dumps(b)).lower()
    assert "no tax or transfer cost is assumed" in text
    for word in ("per hour", "usd/h", "/ h", "hourly"):
        assert word not in text


def test_research_decision_describes_the_result_instead_of_a_unit():
    b = _budget(
        ("r", "a" * 64, True, "ok"),
        unit=None,
        result_text="Keep the control: no variant meets the threshold",
    )
    assert b["rental_per_accepted_usd"] is None
    assert "research decision" in b["undefined_reason"]
    assert b["result"] == "Keep the control: no variant meets the threshold"
    md = render_budget_md(b)
    assert "Keep the control" in md and "47.14" in md


def test_resolved_dict_packages_and_missing_price():
    b = _budget(
        ("c1", "a" * 64, True, "ok"),
        ("c2", "b" * 64, True, "ok"),
        ("c3", "c" * 64, True, "ok"),
        packages=[{"gpu": "rtx4090", "days": 7, "count": 1, "price_usd": 110}],
    )
    assert b["rental_per_accepted_usd"] == 36.67  # 110 / 3 rounded half-up to cents
    with pytest.raises(SpecError, match="price"):
        close_budget([Package(gpu="b200", days=3)], unit="corpus")


# --- verdict --------------------------------------------------------------------------------
RULE = DecisionRule(metric="accuracy", threshold=0.9, min_gain=0.02)


def _ev(
    val: float | None,
    test: float | None,
    *,
    status: str = "completed",
    seeds: tuple[int, ...] = (0, 1),
) -> RunEvidence:
    """Evidence whose per-example scores all equal the value, for each of two seeds (training
    noise measured, and nil): a zero-width interval on it."""
    from gpucampaign.close.scores import Scores

    values = {"val": val, "test": test}
    ids = tuple(f"r{i}" for i in range(20))
    scores = {
        split: tuple(Scores(ids, {"accuracy": (x,) * 20, "loss": (x,) * 20}, seed=k) for k in seeds)
        for split, x in values.items()
        if x is not None
    }
    return RunEvidence(values=values, scores=scores, status=status)


def _verdict(rule, control, **variants):
    return decide_verdict(rule, control=control, variants=variants)


def _spread(val: float, test: float, *, by: float) -> RunEvidence:
    """Evidence whose per-example scores scatter by ``by`` around the value: a wide interval."""
    from gpucampaign.close.scores import Scores

    ids = tuple(f"r{i}" for i in range(20))
    scores = {
        split: tuple(
            Scores(ids, {"accuracy": tuple(x + (by if i % 2 else -by) for i in range(20))}, seed=k)
            for k in (0, 1)
        )
        for split, x in (("val", val), ("test", test))
    }
    return RunEvidence(values={"val": val, "test": test}, scores=scores)


ANSWERS = {
    "adopt": (
        lambda: _verdict(RULE, _ev(0.92, 0.92), a=_ev(0.97, 0.96)),
        "Yes: 'a' improves accuracy over the control by +0.04 on test (95% CI [+0.04, "
        "+0.04] over 2 seeds (0, 1) x 20 examples), clearing the min gain 0.02, and reaches "
        "0.96 against the threshold 0.9. "
        "Verdict: adopt.",
    ),
    "negative, the control kept": (
        lambda: _verdict(RULE, _ev(0.95, 0.95), a=_ev(0.96, 0.96)),
        "No: no variant improves accuracy over the control by the min gain 0.02 on val (the "
        "best on val: 'a' improves accuracy over the control by +0.01 on test (95% CI "
        "[+0.01, +0.01] over 2 seeds (0, 1) x 20 examples)); keep the control (accuracy 0.95 "
        "on val, threshold 0.9 met). "
        "Verdict: negative.",
    ),
    "negative, under the threshold": (
        lambda: _verdict(RULE, _ev(0.5, 0.5), a=_ev(0.6, 0.6)),
        "No: no variant reaches the threshold 0.9 in accuracy on val (the best on val: 'a' "
        "improves accuracy over the control by +0.1 on test (95% CI [+0.1, +0.1] over 2 seeds "
        "(0, 1) x 20 examples)); "
        "neither does the control (0.5 on val). Verdict: negative.",
    ),
    "negative, not confirmed on test": (
        lambda: _verdict(RULE, _ev(0.92, 0.92), a=_ev(0.96, 0.93)),
        "No: 'a' improves accuracy over the control by +0.01 on test (95% CI [+0.01, "
        "+0.01] over 2 seeds (0, 1) x 20 examples), under the min gain 0.02; keep the "
        "control. Verdict: negative.",
    ),
    "inconclusive, a straddling interval": (
        lambda: _verdict(RULE, _ev(0.92, 0.92), a=_spread(0.96, 0.95, by=0.2)),
        "Not yet: 'a' improves accuracy over the control by +0.03 on test (95% CI [",
    ),
    "inconclusive, no interval": (
        lambda: _verdict(
            RULE,
            RunEvidence(
                values={"val": 0.92, "test": 0.92}, no_interval="recipe 'm:R' defines no score()"
            ),
            a=RunEvidence(
                values={"val": 0.97, "test": 0.97}, no_interval="recipe 'm:R' defines no score()"
            ),
        ),
        "Not yet: 'a' improves accuracy over the control by +0.05 on test (a point estimate, "
        "no interval), and without an interval (no per-example accuracy on test: recipe 'm:R' "
        "defines no score()) a point estimate cannot show the min gain 0.02 cleared. Verdict: "
        "inconclusive.",
    ),
    "stopped": (
        lambda: decide_verdict(RULE, control=None, variants={"a": _ev(0.97, 0.97)}),
        "Not answered: the control has no accuracy to compare with ('control' has no metric "
        "(no stop recorded)). Verdict: stopped.",
    ),
    "re-pose": (
        lambda: decide_verdict(RULE, control=None, variants={}, repose_reason="it takes 90 h"),
        "Not answered: re-pose the question; the decision point after the pilot stopped the "
        "campaign (it takes 90 h). Verdict: re-pose.",
    ),
}


@pytest.mark.parametrize("case", sorted(ANSWERS))
def test_the_answer_says_yes_no_or_not_yet_in_one_sentence_then_the_kind(case: str):
    make, expected = ANSWERS[case]
    v = make()
    assert v.answer.startswith(expected), v.answer
    assert v.answer.endswith(f"Verdict: {v.kind}.") and case.startswith(v.kind)
    assert v.answer.count(". ") == 1  # one sentence, then the kind


def test_adopts_the_best_variant_that_meets_threshold_and_gain():
    v = _verdict(RULE, _ev(0.92, 0.92), a=_ev(0.95, 0.95), b=_ev(0.97, 0.97), c=_ev(0.93, 0.93))
    assert (v.kind, v.run) == ("adopt", "b")
    assert "accuracy 0.97, gain +0.05" in v.text and "control val 0.92" in v.text
    assert v.variants["c"]["test"]["gain"] == pytest.approx(0.01)
    assert (v.select_split, v.report_split) == ("val", "test")


def test_gain_exactly_min_gain_is_enough_despite_float_noise():
    # 0.96 - 0.94 is 0.019999999999999907 in binary floating point.
    v = _verdict(RULE, _ev(0.94, 0.94), a=_ev(0.96, 0.96))
    assert v.kind == "adopt"


def test_negative_keeps_the_control_when_no_variant_beats_it_enough():
    v = _verdict(RULE, _ev(0.95, 0.95), a=_ev(0.96, 0.96))
    assert (v.kind, v.run) == ("negative", "control")
    assert "min gain" in v.text and "keep the control" in v.text


def test_negative_result_states_the_numbers():
    v = decide_verdict(
        RULE,
        control=_ev(0.5, 0.5),
        variants={"a": _ev(0.6, 0.6), "b": None},
        stops=[
            {
                "stop_id": "stop-1",
                "rule": "non_finite_loss",
                "run_id": "b-0123456789",
                "reason": "nan at step 4",
            }
        ],
    )
    assert v.kind == "negative" and v.run is None
    assert "no variant meets the threshold" in v.text
    for number in ("control val 0.5,", "a val 0.6 ", "threshold 0.9", "nan at step 4"):
        assert number in v.text


def test_a_dropped_run_is_reported_as_dropped():
    v = _verdict(RULE, _ev(0.95, 0.95), a=_ev(None, None, status="dropped"))
    assert "a dropped at the decision point" in v.text and "stopped (no metric)" not in v.text


def test_minimize_direction():
    rule = DecisionRule(metric="loss", direction="minimize", threshold=0.5, min_gain=0.05)
    v = _verdict(rule, _ev(0.4, 0.4), a=_ev(0.3, 0.3), b=_ev(0.38, 0.38))
    assert (v.kind, v.run) == ("adopt", "a")


def test_stopped_control_gives_no_comparison():
    v = decide_verdict(
        RULE,
        control=None,
        variants={"a": _ev(0.97, 0.97)},
        stops=[
            {
                "stop_id": "stop-9",
                "rule": "no_usable_restart",
                "run": "control",
                "reason": "no restore",
            }
        ],
    )
    assert v.kind == "stopped" and "stop-9" in v.text


def test_re_pose_verdict():
    v = decide_verdict(RULE, control=None, variants={}, repose_reason="essential steps take 90 h")
    assert v.kind == "re-pose" and "90 h" in v.text


def test_choice_follows_val_and_says_when_test_disagrees():
    v = _verdict(RULE, _ev(0.90, 0.90), a=_ev(0.95, 0.91), b=_ev(0.93, 0.96))
    assert (v.kind, v.run) == ("negative", None)  # 'a', chosen on val, is not confirmed on test
    assert v.test_disagrees and "on test 'b' would be chosen, on val 'a'" in v.text


def test_same_split_for_choice_and_report_is_a_spec_error():
    with pytest.raises(ValueError, match="both 'test'"):
        DecisionRule(metric="accuracy", threshold=0.5, select_split="test")
    spec = {**RUN_SPEC, "decision_rule": {"metric": "accuracy", "threshold": 0.5, "split": "test"}}
    with pytest.raises(SpecError, match="select_split .default val. and report_split"):
        parse_spec(spec)


# --- forecast vs actual ---------------------------------------------------------------------
PLAN = {
    "span_hours": 8.0,
    "window_hours": 72.0,
    "steps": [
        {"name": "prep", "kind": "human", "hours": 2.0},
        {"name": "control", "kind": "machine", "hours": 4.0, "run": "control"},
        {"name": "wide", "kind": "machine", "hours": 2.0, "run": "wide"},
        {"name": "eval", "kind": "machine", "hours": 1.0, "phase": "predict"},
    ],
}


def _row(step, start, end, phase="train", **kw):
    return TimelineRow(
        step=step,
        phase=phase,
        start=f"2026-01-05T{start}:00+00:00",
        end=f"2026-01-05T{end}:00+00:00",
        **kw,
    )


def test_forecast_vs_actual_per_step():
    reforecast = {
        "span_hours": 7.0,
        "steps": [dict(s, hours=3.0) if s["name"] == "control" else s for s in PLAN["steps"]],
    }
    timeline = [
        _row("control", "10:00", "12:00", phase="train", run="control"),
        _row("control", "11:00", "13:30", phase="eval", run="control"),  # overlaps: counted once
    ]
    decisions = [
        {
            "point": "after-pilot",
            "decision": {
                "action": "reduce",
                "dropped_steps": ["wide"],
                "reasons": ["does not fit"],
                "by": "auto",
            },
        }
    ]
    stops = [
        {
            "stop_id": "stop-a",
            "rule": "below_threshold",
            "run_id": "control-0123456789",
            "reason": "0.4 < 0.9",
        }
    ]
    plan_before = json.dumps(PLAN, sort_keys=True)
    f = forecast_vs_actual(
        PlanRecord.from_dict(PLAN),
        reforecast=PlanRecord.from_dict(reforecast),
        timeline=timeline,
        decisions=[DecisionRecord.from_dict(d) for d in decisions],
        stops=[StopRecord.from_dict(s) for s in stops],
        pilot={"control": {"step_s": 0.004, "load_s": 6.0}},
    )
    assert json.dumps(PLAN, sort_keys=True) == plan_before  # never rewritten
    by = {s["step"]: s for s in f["steps"]}
    c = by["control"]
    assert c["allotted_hours"] == 4.0 and c["reforecast_hours"] == 3.0
    assert c["observed_hours"] == pytest.approx(3.5)
    assert c["deviation_hours"] == pytest.approx(0.5)
    assert "pilot" in c["explanation"] and "stop-a" in c["explanation"]
    # |3.5 - 3| / 3.5 of the observed time: said per step (main: only the deviation in hours)
    assert "the re-forecast within 14% of the observed time" in c["explanation"]
    assert "dropped at the decision point" in by["wide"]["explanation"]
    assert by["prep"]["observed_hours"] is None  # human time not recorded: not observed
    assert "not observed" in by["prep"]["explanation"]
    assert f["estimates"]["measured"]["load_s"] == 6.0
    assert f["estimates"]["measured"]["restore_s"] is None


def test_a_reforecast_off_by_more_than_its_goal_is_said_so():
    reforecast = {"span_hours": 7.0, "steps": [dict(s, hours=2.0) for s in PLAN["steps"]]}
    f = forecast_vs_actual(
        PlanRecord.from_dict(PLAN),
        reforecast=PlanRecord.from_dict(reforecast),
        timeline=[_row("control", "10:00", "13:00", run="control")],
    )
    c = next(s for s in f["steps"] if s["step"] == "control")
    assert "the re-forecast 33% off the observed time (over 15%)" in c["explanation"]


def test_a_runs_miss_is_split_into_its_steps_and_the_rest_with_the_step_the_forecast_used():
    # The decision kept the parts its 2 h sum (7200 s) and the pooled step they rest on (60 s,
    # where the run's own pilot measured 40 s): 100 steps after a 20-step pilot. The call's
    # steps ran at 90 s: 9000 s of the 10800 s observed, the rest 1800 s against 1200 s.
    kept = {
        "hours": 2.0,
        "how": "pilot of 'control'",
        "p10_hours": 1.0,
        "p90_hours": 4.0,
        "parts_s": {"outside": 200.0, "steps": 6000.0, "evaluations": 1000.0},
        "step_s": 60.0,
        "steps": 100,
    }
    decisions = [
        {
            "point": "after-pilot",
            "decision": {"action": "continue", "reasons": [], "by": "auto"},
            "reforecast": {"control": kept},
        }
    ]
    # The pilot's 20 steps, then the call's 100 (steps 50-51 trained again after a resume:
    # counted once, at their last time).
    rows = [{"kind": "train", "step": k, "step_s": 40.0} for k in range(1, 21)]
    rows += [{"kind": "train", "step": k, "step_s": 90.0} for k in range(21, 52)]
    rows += [{"kind": "eval", "step": 40, "eval_s": 5.0}]
    rows += [{"kind": "train", "step": k, "step_s": 90.0} for k in range(50, 121)]
    reforecast = {"span_hours": 7.0, "steps": [dict(s, hours=2.0) for s in PLAN["steps"]]}
    f = forecast_vs_actual(
        PlanRecord.from_dict(PLAN),
        reforecast=PlanRecord.from_dict(reforecast),
        timeline=[_row("control", "10:00", "13:00", run="control")],
        decisions=[DecisionRecord.from_dict(d) for d in decisions],
        pilot={"control": {"step_s": 40.0}},
        metrics={"control": rows},
    )
    c = next(s for s in f["steps"] if s["step"] == "control")
    assert c["steps_split"] == {
        "reforecast_steps_s": 6000.0,
        "observed_steps_s": 9000.0,
        "reforecast_rest_s": 1200.0,
        "observed_rest_s": pytest.approx(1800.0),
        "pilot_step_s": 60.0,
        "observed_step_s": 90.0,
    }
    assert "re-forecast from the pilot's measurements (60000.00 ms/step)" in c["explanation"]
    assert (
        "33% off the observed time (over 15%): its steps took 2.5 h against 1.67 h re-forecast "
        "(their median 90000.00 ms, the pilot's 60000.00 ms, 1.50x), the rest 30 min against "
        "20 min"
    ) in c["explanation"]
    # A run that trained fewer steps than the re-forecast counted (a stop): no split.
    short = forecast_vs_actual(
        PlanRecord.from_dict(PLAN),
        reforecast=PlanRecord.from_dict(reforecast),
        timeline=[_row("control", "10:00", "13:00", run="control")],
        decisions=[DecisionRecord.from_dict(d) for d in decisions],
        metrics={"control": rows[:60]},
    )
    c = next(s for s in short["steps"] if s["step"] == "control")
    assert c["steps_split"] is None and "(over 15%)" in c["explanation"]


def test_unexplained_deviation_is_said_so():
    f = forecast_vs_actual(
        PlanRecord.from_dict(PLAN),
        reforecast=None,
        timeline=[_row("eval", "10:00", "13:00", phase="eval")],
    )
    e = next(s for s in f["steps"] if s["step"] == "eval")
    assert e["deviation_hours"] == pytest.approx(2.0)
    assert "longer than forecast: not explained" in e["explanation"]


def test_a_resume_explains_a_deviation():
    f = forecast_vs_actual(
        PlanRecord.from_dict(PLAN),
        reforecast=None,
        timeline=[
            _row("control", "10:00", "11:00", run="control"),
            _row("control", "12:00", "15:00", run="control"),
        ],
    )
    c = next(s for s in f["steps"] if s["step"] == "control")
    assert (
        "resumed: 2 training intervals" in c["explanation"]
        and "not explained" not in c["explanation"]
    )


@pytest.mark.parametrize(
    ("hours", "text"),
    [(0.0001, "0.36 s"), (0.01, "36 s"), (0.5, "30 min"), (3.05091, "3.05 h"), (3.3, "3.3 h")],
)
def test_durations_have_sensible_precision(hours, text):
    from gpucampaign.core.text import say_hours

    assert say_hours(hours) == text


def test_estimates_from_timeline_pilot_and_metrics():
    from gpucampaign.close.forecast import measured_estimates

    est = measured_estimates(
        [
            TimelineRow(phase="train", seconds=30.0, steps=10),
            TimelineRow(phase="restore", seconds=2.0),
        ],
        pilot={"control": {"load_s": 6.0, "step_s": 0.004, "eval_s": [0.5, 0.7], "save_s": []}},
        metrics={
            "control": [
                {"kind": "train", "step_s": 0.006},
                {"kind": "eval", "eval_s": 0.6},
                {"kind": "checkpoint", "save_s": 0.25},
            ]
        },
    )
    m = est["measured"]
    assert m["step_s"] == pytest.approx(0.006)  # median of 3.0, 0.004, 0.006
    assert m["eval_s"] == pytest.approx(0.6) and m["save_s"] == 0.25 and m["restore_s"] == 2.0
    assert m["load_s"] == 6.0 and est["not_observed"] == []
    assert measured_estimates([])["not_observed"] == [
        "eval_s",
        "load_s",
        "restore_s",
        "save_s",
        "step_s",
    ]


def test_actual_intervals_for_the_gantt():
    rows = [_row("control", "10:00", "12:00"), _row("eval", "12:30", "13:00")]
    got = actual_intervals(rows)
    assert got[0] == {"name": "control", "start_hours": 0.0, "end_hours": 2.0}
    assert got[1]["start_hours"] == pytest.approx(2.5)


def test_load_estimates(tmp_path: Path):
    with pytest.raises(ArgumentError, match="estimates.json"):
        load_estimates(tmp_path)
    (tmp_path / "estimates.json").write_text(
        json.dumps({"campaign_id": "x", "measured": {"step_s": 0.004, "eval_s": None}})
    )
    assert load_estimates(tmp_path)["measured"] == {"step_s": 0.004, "eval_s": None}
    (tmp_path / "estimates.json").write_text(json.dumps({"measured": {"step_s": -1}}))
    with pytest.raises(ArgumentError, match="step_s"):
        load_estimates(tmp_path)


# --- a whole close, negative and stopped ------------------------------------------------------
def test_negative_campaign_produces_a_complete_report(tmp_path: Path):
    from gpucampaign.core.text import say_number
    from tests.helpers import build_closed_folder

    built = build_closed_folder(tmp_path, threshold=1.5, unit="model", stop_variant=True)
    out = built["out"]
    assert built["verdict"].kind == "negative"
    md = (out / "report.md").read_text()
    for section in (
        "## Verdict",
        "## Runs",
        "## Budget",
        "## Forecast vs actual",
        "## Decisions taken",
        "## Stops",
        "## Error analysis",
        "## Estimates for next time",
        "## Figures",
    ):
        assert section in md
    assert "no variant meets the threshold" in md
    question, answer, cost = md.split("\n\n")[1:4]  # after the title: the question answered
    assert question.startswith("**Question:** Does a wider hidden layer beat the control")
    assert answer == (
        "**Answer:** No: no variant reaches the threshold 1.5 in accuracy on val; neither does "
        f"the control ({say_number(built['verdict'].control['val'])} on val). Verdict: negative."
    )
    assert cost.startswith("Cost: 47.14 USD spent")  # the stopped variant has no gain to quote
    assert md.count(answer.removeprefix("**Answer:** ")) == 1  # said once, never repeated
    table = md.split("## Forecast vs actual")[1].split("\n\n")[2]
    assert "| 40 s |" in table and "| 1.53 min |" in table and ".000" not in table
    assert "stop-0123456789ab" in md  # the stopped variant keeps its stop ID and reason
    # The control is one accepted model; the stopped variant is an expense, never a delivery.
    assert built["budget"]["accepted_deliveries"] == 1
    assert built["budget"]["rental_per_accepted_usd"] == 47.14
    assert built["budget"]["rejected"][0]["reason"] == "stopped (stop stop-0123456789ab)"
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 4 and 'src="figures/' not in html
    assert load_estimates(out)["campaign_id"] == "closing-test-0001"

    result = CliRunner().invoke(app, ["report", str(out), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert set(SUMMARY_KEYS) <= set(summary)
    assert summary["verdict"]["kind"] == "negative"
    assert summary["spent_usd"] == 47.14 and summary["rental_usd"] == 47.14
    assert summary["other_expenses_usd"] == 0.0
    text = CliRunner().invoke(app, ["report", str(out)])
    assert text.exit_code == 0 and "Negative result" in text.output


def test_report_of_a_folder_that_did_not_close(tmp_path: Path):
    result = CliRunner().invoke(app, ["report", str(tmp_path), "--json"])
    assert result.exit_code == 2
    assert "report.json" in result.output


# --- records: one shape each, one reader each ------------------------------------------------
def test_plan_reader_takes_the_written_shape_only(tmp_path: Path):
    from gpucampaign.folder.records import read_plan

    assert read_plan(tmp_path) is None
    (tmp_path / "plan.json").write_text(json.dumps(PLAN))
    plan = read_plan(tmp_path)
    assert [s.name for s in plan.steps] == ["prep", "control", "wide", "eval"]
    assert plan.step("control").hours == 4.0 and plan.step("control").run == "control"
    assert plan.step("nope") is None and plan.window_hours == 72.0
    with pytest.raises(FolderError, match="no 'steps'"):
        PlanRecord.from_dict({"plan": PLAN})
    with pytest.raises(FolderError, match="hours"):
        PlanRecord.from_dict({"steps": [{"name": "a", "allotted_hours": 1.0}]})


def test_decision_stop_and_timeline_records_round_trip(tmp_path: Path):
    from datetime import UTC, datetime, timedelta

    from gpucampaign.folder.records import (
        append_decision,
        append_stop,
        append_timeline,
        decision_after_pilot,
        read_decisions,
        read_stops,
        read_timeline,
    )
    from gpucampaign.plan.decision import Decision

    assert decision_after_pilot(read_decisions(tmp_path)) is None
    rec = DecisionRecord(
        point="after-pilot",
        time="t",
        decision=Decision(action="reduce", dropped_runs=["w"], reasons=["slow"]),
        reforecast={"c": {"hours": 1.0}},
    )
    append_decision(tmp_path, rec)
    assert read_decisions(tmp_path) == [rec]
    assert decision_after_pilot(read_decisions(tmp_path)).dropped_runs == ["w"]
    with pytest.raises(KeyError):  # a flat decision is not a decisions.jsonl line
        DecisionRecord.from_dict({"point": "after-pilot", "action": "continue"})

    stop = StopRecord(stop_id="stop-1", rule="non_finite_loss", run_id="w-0123456789", reason="nan")
    assert append_stop(tmp_path, stop) and not append_stop(tmp_path, stop)  # once per stop ID
    assert read_stops(tmp_path) == [stop]

    t0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
    row = TimelineRow.between("c", phase="train", start=t0, end=t0 + timedelta(minutes=30), steps=3)
    append_timeline(tmp_path, row)
    (back,) = read_timeline(tmp_path)
    assert (
        back == row and back.seconds == 1800.0 and back.interval == (t0, t0 + timedelta(minutes=30))
    )
    assert TimelineRow(phase="close", start="2026-01-05T09:00:00+00:00").interval is None


# --- one answer to "what became of this run?" ------------------------------------------------
RUN_SPEC = {
    "name": "states",
    "packages": [{"gpu": "rtx4090", "days": 3}],
    "calendar": [{"name": "c", "kind": "machine", "resource": "gpu", "hours": 1, "run": "control"}],
    "control": {"batch_size": 32},
    "variants": [
        {"name": "wide", "tier": "useful", "changes": {"hidden": [64]}},
        {"name": "big", "tier": "exploratory", "changes": {"batch_size": 64}},
    ],
    "decision_rule": {"metric": "accuracy", "direction": "maximize", "threshold": 0.5},
}


def _finish(root: Path, spec, run: str, *, accuracy: float, model: bool = True) -> None:
    from gpucampaign.folder.runresult import RunResult

    rid = spec.resolve_run(run).run_id
    (root / "runs" / rid / "model").mkdir(parents=True)
    result = RunResult(
        run_id=rid,
        run=run,
        completed=True,
        steps_done=4,
        planned_steps=4,
        metrics={"accuracy": accuracy},
        timings={},
        n_checkpoints=1,
        eval_metrics={"val": {"accuracy": accuracy}, "test": {"accuracy": accuracy}},
        checkpoint_every=None,
        save_interval=None,
        resumed_from_step=None,
    )
    (root / "runs" / rid / "result.json").write_text(json.dumps(result.to_dict()))
    if model:
        (root / "runs" / rid / "model" / "model.safetensors").write_bytes(b"weights")


def test_run_states_decide_each_run_once(tmp_path: Path):
    from gpucampaign.close.closing import expected_runs, runs_table
    from gpucampaign.close.evidence import closing_verdict, run_evidence, run_metrics
    from gpucampaign.config import parse_spec
    from gpucampaign.folder.records import append_stop, read_stops, run_states
    from gpucampaign.plan.decision import Decision

    spec = parse_spec(RUN_SPEC)
    _finish(tmp_path, spec, "control", accuracy=0.8)
    _finish(tmp_path, spec, "wide", accuracy=0.9, model=False)
    states = run_states(spec, root=tmp_path)
    assert [s.status for s in states.values()] == ["completed", "not_run", "not_run"]
    assert "model was not saved" in states[spec.resolve_run("wide").run_id].reason
    assert states[spec.resolve_run("big").run_id].reason == "the campaign stopped"

    append_stop(
        tmp_path,
        StopRecord(
            stop_id="stop-w",
            rule="non_finite_loss",
            run_id=spec.resolve_run("wide").run_id,
            reason="nan",
        ),
    )
    decision = Decision(action="reduce", dropped_runs=["big"])
    states = run_states(spec, root=tmp_path, decision=decision)
    c, w, b = states.values()
    assert (c.status, w.status, w.stop_id, b.status) == (
        "completed",
        "stopped",
        "stop-w",
        "dropped",
    )
    assert expected_runs(states)[spec.resolve_run("wide").run_id] == {
        "run": "wide",
        "tier": "useful",
        "status": "stopped",
        "stop_id": "stop-w",
        "reason": "stopped by non_finite_loss: nan",
    }
    # A stopped run keeps the metric it measured; a dropped one has none.
    metric_of = run_metrics(states, metric="accuracy")
    assert metric_of == {"control": 0.8, "wide": 0.9, "big": None}
    evidence = run_evidence(spec, root=tmp_path, states=states)
    verdict = closing_verdict(
        spec, evidence=evidence, stops=read_stops(tmp_path), decision=decision
    )
    # One seed a side (and no interval): chosen, but never adopted without training noise.
    assert (verdict.kind, verdict.run) == ("inconclusive", "wide")
    assert "training noise is not measured" in verdict.answer
    assert "big dropped at the decision point" in verdict.text
    table = runs_table(states, metric_of=metric_of, analyses={})
    assert [(r["run"], r["status"], r["metric"]) for r in table] == [
        ("control", "completed", 0.8),
        ("wide", "stopped", 0.9),
        ("big", "dropped", None),
    ]

    repose = Decision(action="re-pose", reasons=["too long"])
    states = run_states(spec, root=tmp_path / "empty", decision=repose)
    assert {s.reason for s in states.values()} == {"the question was re-posed"}
    v = closing_verdict(spec, evidence={}, stops=[], decision=repose)
    assert v.kind == "re-pose" and "too long" in v.text


def test_a_run_that_did_not_complete_is_never_an_accepted_delivery(tmp_path: Path):
    from gpucampaign.close.closing import delivery
    from gpucampaign.folder.records import RunState, StopRecord

    nan, at_point = "stopped by non_finite_loss: nan", "dropped at the decision point"
    stop = StopRecord(stop_id="stop-w", rule="non_finite_loss", run_id="wide-0123456789")
    stopped = RunState("wide", "wide-0123456789", "useful", "stopped", stop=stop, reason=nan)
    dropped = RunState("big", "big-0123456789", "exploratory", "dropped", reason=at_point)
    for state, reason in ((stopped, "stopped (stop stop-w)"), (dropped, at_point)):
        d = delivery(tmp_path, state, corpus=None)
        assert d["accepted"] is False and d["reason"] == reason


def test_a_spec_without_a_decision_rule_gets_a_stopped_verdict():
    from gpucampaign.close.evidence import closing_verdict
    from gpucampaign.config import parse_spec

    spec = parse_spec({k: v for k, v in RUN_SPEC.items() if k != "decision_rule"})
    v = closing_verdict(spec, evidence={}, stops=[], decision=None)
    assert (v.kind, v.run) == ("stopped", None) and "no decision rule" in v.text
    assert spec.essential_runs() == ["control"]
    assert spec.runs_by_tier() == ["control", "wide", "big"]


# --- numbers as they are, ties ----------------------------------------------------------------
def test_a_value_is_never_rounded_onto_the_threshold_it_misses():
    from types import SimpleNamespace

    from gpucampaign.core.text import say_exact, say_number
    from gpucampaign.engine.rules import quality_stop

    assert say_number(0.000241, against=0.0002) == "0.000241"
    assert say_number(0.00020004, against=0.0002) == "0.00020004"  # not "0.0002"
    assert say_number(0.9888, against=0.95) == "0.9888" and say_number(2.72) == "2.72"
    assert say_number(0.019999, against=0.02, signed=True) == "+0.019999"
    assert say_exact(0.0002) == "0.0002" and say_exact(0.1 + 0.2) == repr(0.1 + 0.2)

    rule = DecisionRule(metric="mse", direction="minimize", threshold=0.0002, min_gain=0.00001)
    v = _verdict(rule, _ev(0.00015, 0.00015), **{"lr-high": _ev(0.00020004, 0.000241)})
    assert "lr-high val 0.00020004 " in v.text and "test 0.000241 " in v.text
    assert "threshold 0.0002," in v.text and "0.0002 (" not in v.text
    spec = SimpleNamespace(
        decision_rule=rule, stop_rules=SimpleNamespace(below_threshold=True, quality_floor=None)
    )
    stop = quality_stop(spec, "lr-high-0123456789", {"mse": 0.000241}, step=7)
    assert stop is not None
    assert stop.reason == "final mse on val is 0.000241, above the ceiling 0.0002"
    floor = DecisionRule(metric="accuracy", threshold=0.95)
    low = SimpleNamespace(decision_rule=floor, stop_rules=spec.stop_rules)
    assert (
        "is 0.94999, below the floor 0.95"
        in quality_stop(low, "c", {"accuracy": 0.94999}, step=1).reason
    )


def test_a_tie_on_the_selection_split_is_broken_by_the_stated_rule():
    from dataclasses import replace

    from gpucampaign.close.verdict import TIE_RULE

    a, b = _ev(0.9888, 0.97), _ev(0.9888, 0.98)
    v = _verdict(RULE, _ev(0.92, 0.92), a=replace(a, train_s=0.46), b=replace(b, train_s=0.41))
    assert (v.kind, v.run) == ("adopt", "b")  # the cheaper of the two
    assert f"Tie on val: 'a', 'b' all reach 0.9888; broken by the stated rule ({TIE_RULE})" in (
        v.text
    )
    assert "'b' (training time 'a' 0.46 s, 'b' 0.41 s)" in v.text
    assert v.numbers["tie"] == {"tied": ["a", "b"], "chosen": "b", "rule": TIE_RULE}
    # Same measured time (or none): the first in the spec's order.
    same = _verdict(RULE, _ev(0.92, 0.92), a=a, b=b)
    assert same.run == "a" and "Tie on val" in same.text
    # No tie, nothing said.
    assert "Tie" not in _verdict(RULE, _ev(0.92, 0.92), a=a).text
    # A variant that only ties the control gains nothing: the control is kept.
    kept = _verdict(
        DecisionRule(metric="accuracy", threshold=0.9), _ev(0.95, 0.95), a=_ev(0.95, 0.95)
    )
    assert (kept.kind, kept.run) == ("negative", "control")
