"""The not-learning stop: a variant whose training loss is not below its start after the grace
is stopped, with its ID in ``stops.jsonl``, whether its recipe has ``score()`` or not; the
control never is.

A user's regression recipe without ``score()`` (``tests/helpers/specs.py``) on 96 points:
48 to train, 8 a batch, 6 steps an epoch, 4 epochs (24 steps; the grace, a quarter, ends at
step 6, and the loss windows are one epoch each, so the first check is at step 12).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpucampaign.core.stoprules import EVIDENCE_RULES, STOP_RULES, NotLearning
from gpucampaign.folder.layout import OutputFolder
from gpucampaign.folder.metrics import read_metrics
from gpucampaign.recipe.contract import has_score, load_recipe
from tests.helpers.closing import train_every_run
from tests.recipe.test_recipe import make_spec, train, write_recipe


def hopeless_campaign(base: Path, **stop_rules: object):
    """A control that cannot learn (lr 1e-7), a variant that cannot either ('frozen', lr 1e-7,
    8 units) and one that learns ('learns', lr 0.05, 8 units)."""
    module = write_recipe(base)
    return make_spec(
        base,
        module,
        control={"lr": 1e-7, "epochs": 4},
        variants=[
            {"name": "frozen", "changes": {"args": {"width": 8}}},
            {"name": "learns", "changes": {"args": {"width": 8}, "lr": 0.05}},
        ],
        stop_rules={"require_restart": False, **stop_rules},
    )


def rows(folder: OutputFolder, spec, run: str, kind: str = "not_learning") -> list[dict]:
    path = folder.run(spec.resolve_run(run).run_id).path / "metrics.jsonl"
    return [r for r in read_metrics(path) if r["kind"] == kind]


@pytest.mark.slow  # seconds of training
def test_a_variant_that_cannot_learn_is_stopped_without_score_never_the_control(
    tmp_path: Path,
) -> None:
    from gpucampaign.data.corpus import load_spec_corpus

    spec = hopeless_campaign(tmp_path)
    assert spec.stop_rules.not_learning and spec.stop_rules.grace == 0.25  # the defaults
    assert not has_score(load_recipe(spec.run_config("control").recipe))
    folder = OutputFolder(tmp_path / "out")
    train_every_run(spec, folder=folder, corpus=load_spec_corpus(spec, base_dir=tmp_path))

    stops = folder.read_jsonl("stops.jsonl")
    frozen = spec.resolve_run("frozen").run_id
    assert [(s["rule"], s["run_id"]) for s in stops] == [("not_learning", frozen)]
    stop = stops[0]
    assert stop["stop_id"].startswith("stop-") and stop["step"] == 12
    n = stop["numbers"]
    assert (n["window"], n["grace_step"], n["planned_steps"], n["steps_saved"]) == (6, 6, 24, 12)
    assert n["recent_loss"] >= n["start_loss"] * (1 - n["tolerance"]) and not n["learning"]
    assert "does not learn: at step 12" in stop["reason"]
    # Its model at that step is kept and evaluated, as evidence (the campaign goes on).
    result = json.loads((folder.run(frozen).path / "result.json").read_text())
    assert (result["completed"], result["steps_done"], result["stop"]["rule"]) == (
        False,
        12,
        "not_learning",
    )
    assert (folder.run(frozen).path / "model" / "model.safetensors").is_file()
    assert NotLearning.rule in EVIDENCE_RULES and STOP_RULES["not_learning"] is NotLearning

    # The control learns nothing either, and is never judged: every step, no check at all.
    control = json.loads(
        (folder.run(spec.resolve_run("control").run_id).path / "result.json").read_text()
    )
    assert control["completed"] and control["steps_done"] == 24 and control["stop"] is None
    assert rows(folder, spec, "control") == []
    # The variant that learns is checked at each evaluation after the grace and goes on.
    learns = rows(folder, spec, "learns")
    assert [r["step"] for r in learns] == [12, 18] and all(r["learning"] for r in learns)


def test_the_start_is_read_back_after_the_pilot_and_the_rule_can_be_turned_off(
    tmp_path: Path,
) -> None:
    spec = hopeless_campaign(tmp_path)
    pilot = train(spec, tmp_path, "frozen", stop_after_steps=3)
    assert not pilot.completed and checks(tmp_path, spec) == []  # never in the pilot
    # The full call reads the pilot's losses (steps 1-3) back from metrics.jsonl.
    with pytest.raises(NotLearning) as info:
        train(spec, tmp_path, "frozen")
    assert info.value.step == 12 and info.value.numbers["window"] == 6
    assert [r["step"] for r in checks(tmp_path, spec)] == [12]
    # A later call raises the same stop again: the run is finished.
    with pytest.raises(NotLearning) as again:
        train(spec, tmp_path, "frozen")
    assert again.value.stop_id == info.value.stop_id

    (tmp_path / "off").mkdir()
    off = hopeless_campaign(tmp_path / "off", not_learning=False)
    done = train(off, tmp_path / "off", "frozen")
    assert done.completed and done.steps_done == 24 and checks(tmp_path / "off", off) == []


def checks(base: Path, spec) -> list[dict]:
    path = base / "out" / "runs" / spec.resolve_run("frozen").run_id / "metrics.jsonl"
    return [r for r in read_metrics(path) if r["kind"] == "not_learning"]


def _rule_on(losses: list[float], metrics: dict[int, float]) -> list[object]:
    """``NotLearningRule`` fed a run's training losses (one a step) and its decision metric at
    evaluations (step -> accuracy), on a stand-in of the run: what it asks at each evaluation."""
    from types import SimpleNamespace

    from gpucampaign.config import DecisionRule
    from gpucampaign.engine import rules
    from gpucampaign.engine.rules import NotLearningRule

    spec = SimpleNamespace(
        decision_rule=DecisionRule(metric="accuracy", threshold=0.5),
        stop_rules=SimpleNamespace(grace=0.25),
    )
    r = SimpleNamespace(spec=spec, planned=len(losses), target=len(losses), step=0, rows=[])
    r.record = r.rows.append
    rule = NotLearningRule.__new__(NotLearningRule)
    rule.r, rule.grace, rule.window = r, len(losses) // 4, len(losses) // 8
    rule.first, rule.recent, rule.first_metric = {}, {}, None
    asked: list[object] = []
    keep = rules.keep_evidence
    rules.keep_evidence = lambda run, kind, *, reason, numbers: ("stop", reason)  # type: ignore[assignment]
    try:
        for step, loss in enumerate(losses, start=1):
            rule.on_train_row({"step": step, "loss": loss})
            if step in metrics:
                r.step = step
                asked.append(rule.after_eval({"accuracy": metrics[step]}))
    finally:
        rules.keep_evidence = keep
    return asked


def test_a_loss_with_a_ramped_regulariser_is_learning_when_its_metric_improves() -> None:
    """The training loss rises (a penalty ramped over 40% of the steps outweighs the fit) while
    the accuracy climbs: the run learns and is never stopped; with the accuracy flat too, it
    does not learn and is stopped."""
    steps = 80
    losses = [1.0 - 0.3 * s / steps + 0.8 * min(1.0, s / (0.4 * steps)) for s in range(steps)]
    evals = {s: 0.5 + 0.4 * s / steps for s in range(10, steps, 10)}
    assert losses[-1] > losses[0]  # the raw loss says "not learning"
    assert _rule_on(losses, evals) == [None] * len(evals)
    flat = dict.fromkeys(evals, 0.5)
    asked = _rule_on(losses, flat)
    assert asked[0] is None and asked[-1] is not None  # the first evaluation is the reference
    stop = next(a for a in asked if a is not None)
    assert "nor is its accuracy (0.5) better than at its first evaluation (0.5)" in stop[1]
