"""Comparisons the verdict can stand behind: a run stopped as futile is never adopted, and the
verdict names the step each run is compared at (a control that peaked earlier than its last
model is compared at its last step, and the verdict says so and why)."""

from __future__ import annotations

from gpucampaign.close.scores import Scores
from gpucampaign.close.verdict import RunEvidence, decide_verdict
from gpucampaign.config import DecisionRule

RULE = DecisionRule(metric="loss", direction="minimize", threshold=2.0, min_gain=0.0)
IDS = tuple(f"r{i}" for i in range(40))


def _ev(loss: float, *, spread: float = 0.05, **kw) -> RunEvidence:
    """Two seeds of per-example losses scattered around ``loss``."""
    rows = tuple(
        Scores(
            IDS, {"loss": tuple(loss + spread * ((i * 7 + k) % 5 - 2) for i in range(40))}, seed=k
        )
        for k in (0, 1)
    )
    return RunEvidence(values={"val": loss, "test": loss}, scores={"val": rows, "test": rows}, **kw)


STOP = {
    "stop_id": "stop-aaaa",
    "rule": "futile",
    "run": "lr-high",
    "run_id": "lr-high-0123456789",
    "step": 200,
    "reason": "futile: cannot win at step 200",
}


def test_a_variant_stopped_as_futile_is_never_adopted_and_the_steps_compared_are_named():
    # The textlm case: 'lr-high' stopped as futile at step 200; the control then overfit to
    # step 2550 (its best val loss was at step 400) and ends far worse than lr-high's step 200.
    control = _ev(5.2, step=2550, planned=2550, peak=(400, 1.15))
    futile = _ev(1.2, step=200, planned=2550, futile=200, status="stopped")
    v = decide_verdict(RULE, control=control, variants={"lr-high": futile}, stops=[STOP])
    assert v.kind != "adopt" and v.run != "lr-high", v.text
    assert "lr-high" in v.numbers["never_adopted"]
    assert "stopped as futile at step 200 of 2550: never adopted" in v.text
    assert "Steps compared: 'control' at step 2550 of 2550 (its best val loss, 1.15, was at " in (
        v.text
    )
    assert "step 400; a run keeps only its last model, so it is compared at step 2550)" in v.text
    assert "'lr-high' at step 200 of 2550 (stopped as futile there)" in v.text
    assert v.numbers["steps"]["control"] == {
        "step": 2550,
        "planned": 2550,
        "peak_step": 400,
        "peak_value": 1.15,
        "futile": None,
    }
    assert v.numbers["steps"]["lr-high"]["futile"] == 200
    # Its stop recorded no interval that shows it cannot win: the result is not a complete
    # negative, and the answer says why.
    assert v.kind == "inconclusive" and "Negative result (complete)" not in v.text
    assert "'lr-high' stopped as futile early without its interval showing it cannot win" in (
        v.answer
    )


def test_a_futile_stop_whose_interval_shows_it_cannot_win_leaves_a_complete_negative():
    control = _ev(5.2, step=2550, planned=2550, peak=(400, 1.15))
    futile = _ev(1.2, step=200, planned=2550, futile=200, status="stopped")
    # Decided at its look's error-spending boundary: the optimistic end read 3.57x wide.
    numbers = {"gain": -0.087, "gain_ci95": [-0.132, -0.042], "boundary": 3.57, "reach": -0.01}
    stop = {**STOP, "numbers": numbers}
    # A stop at the plain interval (no error spent over the looks) settles nothing.
    plain = {**STOP, "numbers": {"gain": -0.087, "gain_ci95": [-0.132, -0.042]}}
    unsettled = decide_verdict(RULE, control=control, variants={"lr-high": futile}, stops=[plain])
    assert unsettled.kind == "inconclusive", unsettled.text
    v = decide_verdict(RULE, control=control, variants={"lr-high": futile}, stops=[stop])
    assert (v.kind, v.run) == ("negative", None), v.text
    said = "stopped early: 'lr-high' as futile at step 200 (each stop shows it cannot win)"
    assert said in v.text
    # Never quoted as the best variant, with a gain its unfinished model has on the control.
    assert "the best on val: 'lr-high'" not in v.answer


def test_a_finished_variant_beside_a_futile_one_is_still_adopted():
    control = _ev(1.5, step=100, planned=100, peak=(100, 1.5))
    done = _ev(1.0, step=100, planned=100, peak=(100, 1.0))
    futile = _ev(0.5, step=20, planned=100, futile=20, status="stopped")
    v = decide_verdict(RULE, control=control, variants={"a": futile, "b": done}, stops=[])
    assert (v.kind, v.run) == ("adopt", "b"), v.text
    assert "Steps compared: 'control' at step 100 of 100, 'a' at step 20 of 100" in v.text


def test_a_run_whose_model_is_a_rejected_delivery_is_never_adopted():
    from gpucampaign.close.verdict_steps import refuse_rejected

    control = _ev(1.5, step=100, planned=100)
    v = decide_verdict(RULE, control=control, variants={"b": _ev(1.0, step=100, planned=100)})
    assert (v.kind, v.run) == ("adopt", "b")
    reason = "reloaded predictions differ on 3 row(s)"
    refused = refuse_rejected(v, rejected={"b": reason, "control": "x"})
    assert (refused.kind, refused.run) == ("inconclusive", "b")
    assert refused.answer == (
        f"Not yet: 'b' clears the rule, but its model is a rejected delivery ({reason}), so it "
        "is not adopted. Verdict: inconclusive."
    )
    assert refuse_rejected(v, rejected={"control": reason}) is v


def test_a_stopped_seed_replicate_is_named_in_the_verdict():
    """Only the second seed of 'wide' was stopped as futile: the verdict names that replicate
    and its stop, and the variant is not judged on its other seed alone."""
    rule = DecisionRule(metric="accuracy", threshold=0.0, min_gain=0.0)
    control = RunEvidence(values={"val": 0.8, "test": 0.8})
    wide = RunEvidence(status="stopped", futile=30, planned=100, step=30, early_rule="futile")
    stop = {
        "run": "wide.s1",
        "run_id": "wide.s1-0123456789",
        "rule": "futile",
        "stop_id": "stop-7",
        "reason": "cannot win: at step 30 its gain ...",
        "numbers": {"gain_ci95": [-0.3, -0.1]},
    }
    v = decide_verdict(rule, control=control, variants={"wide": wide}, stops=[stop])
    assert "'wide.s1' stopped by futile (stop-7)" in v.text
    assert "no stop recorded" not in v.text
