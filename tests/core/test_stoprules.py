"""One test per stop rule, and the exceptions survive pickling with every field."""

from __future__ import annotations

import json
import math
import pickle

import pytest

from gpucampaign.core.stoprules import (
    STOP_RULES,
    BelowThreshold,
    EssentialInputMissing,
    IncompleteRun,
    NonFiniteLoss,
    NoUsableRestart,
)
from gpucampaign.data.tables import write_digits_corpus
from gpucampaign.folder.layout import WEIGHTS_FILE, RunFolder, checkpoint_step_dir
from gpucampaign.folder.metrics import read_metrics
from gpucampaign.folder.runresult import require_complete
from tests.helpers import corpus_of, digits_file, make_spec, run, run_dir  # noqa: F401


def test_exploding_learning_rate_gives_non_finite_loss_with_its_step(tmp_path, digits_file):  # noqa: F811
    spec = make_spec(
        tmp_path, digits_file, control={"optimizer": "sgd", "lr": 1e6, "scheduler": "none"}
    )
    with pytest.raises(NonFiniteLoss) as exc:
        run(spec, tmp_path)
    e = exc.value
    assert (
        e.rule == "non_finite_loss"
        and e.run_id == spec.resolve_run("control").run_id
        and e.stop_id.startswith("stop-")
    )
    rows = [
        r for r in read_metrics(run_dir(spec, tmp_path) / "metrics.jsonl") if r["kind"] == "train"
    ]
    assert e.step == len(rows) + 1 > 1  # the steps before it were finite and recorded
    assert all(math.isfinite(r["loss"]) for r in rows)
    assert f"step {e.step}" in e.reason and not (run_dir(spec, tmp_path) / "result.json").exists()


def test_final_quality_below_the_floor(tmp_path, digits_file):  # noqa: F811
    spec = make_spec(
        tmp_path,
        digits_file,
        decision_rule={"metric": "accuracy", "threshold": 0.5},
        stop_rules={"quality_floor": 1.01},
    )
    with pytest.raises(BelowThreshold) as exc:
        run(spec, tmp_path)
    e = exc.value
    assert e.step == 20 and "below the floor 1.01" in e.reason
    folder = run_dir(spec, tmp_path)
    recorded = json.loads((folder / "result.json").read_text())
    assert (
        recorded["completed"] and recorded["stop"]["stop_id"] == e.stop_id
    )  # kept: a negative result
    assert (folder / "model" / WEIGHTS_FILE).is_file()
    with pytest.raises(BelowThreshold) as again:  # rerunning reports the same stop, trains nothing
        run(spec, tmp_path)
    assert again.value.stop_id == e.stop_id


def test_below_threshold_is_direction_aware_and_can_be_off(tmp_path, digits_file):  # noqa: F811
    spec = make_spec(
        tmp_path,
        digits_file,
        decision_rule={"metric": "loss", "direction": "minimize", "threshold": 1e-9},
    )
    with pytest.raises(BelowThreshold, match="above the ceiling 1e-09"):
        run(spec, tmp_path)
    off = make_spec(
        tmp_path,
        digits_file,
        control={"lr": 0.02},
        decision_rule={"metric": "loss", "direction": "minimize", "threshold": 1e-9},
        stop_rules={"below_threshold": False},
    )
    assert run(off, tmp_path).completed


def test_corpus_that_is_not_the_pinned_one(tmp_path, digits_file):  # noqa: F811
    spec = make_spec(tmp_path, digits_file)
    other = tmp_path / "other"
    other.mkdir()
    sha = write_digits_corpus(other / "data" / "digits.csv", seed=7)
    wrong = corpus_of(other, make_spec(other, (other / "data" / "digits.csv", sha)))
    from gpucampaign.engine.loop import train_run
    from gpucampaign.storage import LocalStore

    with pytest.raises(EssentialInputMissing, match="pins"):
        train_run(
            spec,
            run=spec.resolve_run("control"),
            corpus=wrong,
            store=LocalStore(tmp_path / "s"),
            run_folder=RunFolder.scratch(tmp_path / "o", "r"),
        )


def test_no_usable_restart(tmp_path, digits_file):  # noqa: F811
    spec = make_spec(tmp_path, digits_file)
    run(spec, tmp_path, stop_after_steps=4)
    weights = (
        tmp_path
        / "out"
        / "checkpoints"
        / spec.resolve_run("control").run_id
        / checkpoint_step_dir(4)
        / WEIGHTS_FILE
    )
    weights.write_bytes(b"\0" * weights.stat().st_size)
    with pytest.raises(NoUsableRestart) as exc:
        run(spec, tmp_path)
    assert "altered" in exc.value.reason and exc.value.run_id == spec.resolve_run("control").run_id
    relaxed = make_spec(tmp_path, digits_file, stop_rules={"require_restart": False})
    res = run(relaxed, tmp_path)  # same run ID: the stop rule does not change the config
    assert res.completed and res.resumed_from_step is None and res.refused_checkpoints


def test_incomplete_run_is_never_complete(tmp_path, digits_file):  # noqa: F811
    with pytest.raises(IncompleteRun) as exc:
        require_complete("r-1", steps_done=9, planned_steps=10)
    assert exc.value.step == 9
    require_complete("r-1", steps_done=10, planned_steps=10)
    spec = make_spec(tmp_path, digits_file)
    run(spec, tmp_path)
    path = run_dir(spec, tmp_path) / "result.json"
    doc = json.loads(path.read_text())
    path.write_text(
        json.dumps({**doc, "steps_done": doc["planned_steps"] - 5})
    )  # a record that lies
    with pytest.raises(IncompleteRun, match="15 of its 20"):
        run(spec, tmp_path)


@pytest.mark.parametrize("cls", sorted(STOP_RULES.values(), key=lambda c: c.rule))
def test_stop_rules_survive_pickling(cls):
    original = cls("control-0123456789", "a reason, with details", step=42)
    clone = pickle.loads(pickle.dumps(original))
    assert type(clone) is cls
    assert (clone.run_id, clone.reason, clone.step, clone.stop_id, clone.rule) == (
        original.run_id,
        original.reason,
        original.step,
        original.stop_id,
        original.rule,
    )
    assert clone.to_record() == original.to_record() and str(clone) == str(original)
