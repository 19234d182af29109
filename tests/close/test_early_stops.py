"""A variant stopped early (futile, not learning) in the verdict: named with its step, never
set against the finished control, never adopted; a negative verdict is complete only when
the stop's own interval shows the variant cannot win."""

from __future__ import annotations

from typing import Any

from gpucampaign.close.verdict import RunEvidence, decide_verdict
from gpucampaign.close.verdict_steps import futile_settled
from gpucampaign.config import DecisionRule

RULE = DecisionRule(metric="accuracy", threshold=0.5, min_gain=0.0)
CONTROL = RunEvidence(values={"val": 0.8, "test": 0.8})


def futile_stop(ci: list[float], **numbers: Any) -> dict[str, Any]:
    return {
        "stop_id": "stop-000000000001",
        "rule": "futile",
        "run_id": "bf16-0123456789",
        "run": "bf16",
        "step": 40,
        "reason": "cannot win: at step 40 its gain ...",
        # Decided at its look's boundary: the optimistic end read 2x wide (step 40 of 160).
        "numbers": {
            "futile": True,
            "gain_ci95": ci,
            "min_gain": 0.0,
            "boundary": 2.0,
            "reach": ci[1] + (ci[1] - ci[0]) / 2,
            **numbers,
        },
    }


def stopped(rule: str = "futile") -> RunEvidence:
    return RunEvidence(status="stopped", futile=40, planned=200, early_rule=rule)


def test_a_futile_variant_is_named_with_its_step_and_never_has_a_gain() -> None:
    stop = futile_stop([-0.3, -0.2])
    v = decide_verdict(
        RULE,
        control=CONTROL,
        variants={"bf16": stopped(), "wide": RunEvidence(values={"val": 0.7, "test": 0.7})},
        stops=[stop],
    )
    assert v.kind == "negative" and v.run != "bf16"
    assert "stopped early: 'bf16' as futile at step 40" in v.text
    assert v.variants["bf16"]["test"]["gain"] is None  # no 40-step model against the control
    assert stop["stop_id"] in v.text and "Negative result (complete)" in v.text


def test_a_stop_without_an_interval_that_settles_it_is_not_a_complete_negative() -> None:
    v = decide_verdict(
        RULE, control=CONTROL, variants={"bf16": stopped()}, stops=[futile_stop([0, 0], tie=True)]
    )
    assert v.kind == "inconclusive" and "Negative result (complete)" not in v.text
    assert "without its interval showing it cannot win" in v.answer


def test_which_early_stops_settle_the_comparison() -> None:
    def settles(**stop: Any) -> bool:
        return futile_settled(RULE, {"bf16": ""}, stops=[{"run": "bf16", **stop}])["bf16"]

    assert settles(**futile_stop([-0.3, -0.2]))
    assert not settles(**futile_stop([0.0, 0.0], tie=True))
    assert not settles(**futile_stop([-0.1, 0.02]))  # reaches above 0
    # Under 0 at the plain interval, above it at the look's boundary: not settled.
    assert not settles(**futile_stop([-0.2, -0.05]))
    plain = futile_stop([-0.3, -0.2])
    plain["numbers"] = {k: v for k, v in plain["numbers"].items() if k not in ("boundary", "reach")}
    assert not settles(**plain)  # recorded without error spending
    assert not settles(stop_id="s", rule="futile", run_id="bf16-1")
    assert settles(stop_id="s", rule="not_learning", run_id="bf16-1")
    assert not settles(stop_id="s", rule="below_threshold", run_id="bf16-1")
