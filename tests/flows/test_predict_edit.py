"""A finished campaign rerun after only its recipe's ``predict`` was edited: the run IDs stay,
no run trains again (its checkpoints and training segments are untouched), its predictions
are written again with the new ``predict``, and the folder still verifies."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import yaml

from gpucampaign.cli.scaffold_textlm import init_textlm
from gpucampaign.config import load_spec
from gpucampaign.folder.records import read_timeline
from gpucampaign.verify.checks import verify_output

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

PREDICT = """    def predict(self, model, batch):
        x, y = batch
        return [{"first": int(row[0]), "NEW": 1} for row in x]

"""


def _tiny_textlm(tmp: Path) -> Path:
    spec_path = init_textlm(tmp / "tl")
    data = yaml.safe_load(spec_path.read_text())
    data["name"] = f"pe{uuid.uuid4().hex[:6]}"
    data["gpu_lock"] = {"name": f"gpu-{uuid.uuid4().hex[:8]}", "timeout_s": 600, "lease_s": 60}
    data["control"]["args"] = {"layers": 1, "width": 16, "heads": 2, "context": 16}
    data["control"]["max_steps"] = 12
    data["control"]["epochs"] = 1
    data["pilot"] = {"steps": 3}
    data["variants"] = data["variants"][:1]
    data["variants"][0]["changes"] = {"args": {"width": 8}}
    data["calendar"] = [s for s in data["calendar"] if s.get("run") != "lr-high"]
    data["decision_rule"]["threshold"] = 100.0
    data["stop_rules"] = {"futility": False}
    data["decision_point"] = {"rounds": 0}  # the edit of predict is the subject, not rounds
    spec_path.write_text(yaml.safe_dump(data, sort_keys=False))
    recipe = spec_path.parent / "textlm.py"
    text = recipe.read_text()
    marker = "    def evaluate(self, model, batches):"
    recipe.write_text(text.replace(marker, PREDICT.replace(', "NEW": 1', "") + marker, 1))
    return spec_path


def _files(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.stat().st_mtime_ns, p.stat().st_size)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_editing_only_predict_reruns_predictions_not_training(prefect_harness, tmp_path):
    from gpucampaign_prefect.flows.campaign import campaign

    spec_path = _tiny_textlm(tmp_path)
    out = tmp_path / "out"
    state = campaign(spec=str(spec_path), out=str(out), return_state=True)
    assert state.is_completed(), state.message
    first = state.result()
    assert first["verified"] is True
    ids = load_spec(spec_path).run_ids()
    checkpoints = _files(out / "checkpoints")
    assert checkpoints
    n_segments = len(read_timeline(out))
    control = out / "runs" / ids["control"]
    assert "NEW" not in (control / "predictions.csv").read_text()

    recipe = spec_path.parent / "textlm.py"
    text = recipe.read_text()
    recipe.write_text(text.replace(PREDICT.replace(', "NEW": 1', ""), PREDICT, 1))
    assert recipe.read_text() != text
    assert load_spec(spec_path).run_ids() == ids  # the same runs

    state = campaign(spec=str(spec_path), out=str(out), return_state=True)
    assert state.is_completed(), state.message
    second = state.result()
    # No training again: checkpoints untouched, no new training or pilot segment.
    assert _files(out / "checkpoints") == checkpoints
    new = [r.to_dict() for r in read_timeline(out)][n_segments:]
    assert new  # the rerun did run (its predictions, its close)
    trained = [r for r in new if r.get("steps", 0) > 0 or r["phase"] in {"pilot", "restart"}]
    assert trained == []
    # The predictions are the new predict's, for every run that saved a model.
    for rid in ids.values():
        assert "NEW" in (out / "runs" / rid / "predictions.csv").read_text(), rid
    assert second["verified"] is True and second["problems"] == []
    # Anchored by the new manifest's sha256, every model reloads through the recipe now in
    # the spec's folder and reproduces the new predictions.
    report = verify_output(out, expect=second["manifest_sha256"])
    assert report.verified, report
    assert sorted(report.reloaded_runs) == sorted(ids.values())
