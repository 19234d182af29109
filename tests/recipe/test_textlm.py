"""The second example: a character-level transformer written as the user's own recipe
(``examples/textlm/textlm.py``), planned and run by the campaign flow to a verified folder."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from gpucampaign.cli import app
from gpucampaign.cli.scaffold_textlm import CORPUS_REL, init_textlm
from gpucampaign.config import load_spec
from gpucampaign.core.files import sha256_file
from gpucampaign.verify.checks import verify_output

REPO = Path(__file__).resolve().parents[2]


def test_init_writes_the_example_the_repository_keeps(tmp_path: Path) -> None:
    spec_path = init_textlm(tmp_path / "tl")
    assert sha256_file(tmp_path / "tl" / CORPUS_REL) == sha256_file(
        REPO / "examples" / "textlm" / CORPUS_REL
    )
    assert spec_path.read_text() == (REPO / "examples" / "textlm" / "campaign.yaml").read_text()
    spec = load_spec(spec_path)
    assert spec.control.recipe == "textlm:CharLM" and spec.decision_rule.metric == "loss"
    assert spec.decision_rule.direction == "minimize" and spec.decision_rule.select_split == "val"
    assert [v.changes for v in spec.variants] == [{"args": {"width": 64}}, {"lr": 0.003}]
    assert spec.run_config("narrow").args["layers"] == 2  # args merge into the control's
    with pytest.raises(Exception, match="refusing to overwrite"):
        init_textlm(tmp_path / "tl")


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_textlm_is_planned_and_run_to_a_verified_folder(prefect_harness, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from gpucampaign_prefect.flows.campaign import campaign

    spec_path = init_textlm(tmp_path / "tl")
    data = yaml.safe_load(spec_path.read_text())
    data["gpu_lock"] = {"name": f"gpu-{uuid.uuid4().hex[:8]}", "timeout_s": 900, "lease_s": 60}
    data["control"]["epochs"] = 2
    # No round of seeds beyond the plan: this test is about the recipe, not the rounds
    # (tests/flows/test_campaign.py), and each round's runs would be reloaded again below.
    data["decision_point"] = {**(data.get("decision_point") or {}), "rounds": 0}
    spec_path.write_text(yaml.safe_dump(data, sort_keys=False))
    planned = CliRunner().invoke(app, ["plan", str(spec_path)])
    assert planned.exit_code == 0, planned.output
    out = tmp_path / "out"
    state = campaign(spec=str(spec_path), out=str(out), return_state=True)
    assert state.is_completed(), state.message
    summary = state.result()
    assert summary["verified"] is True and summary["problems"] == []
    statuses = summary["runs"]
    assert statuses[next(r for r in statuses if r.startswith("control-"))] == "completed"
    # Cut to 2 epochs here, a variant may miss the loss floor: a recorded stop, not a failure.
    assert set(statuses.values()) <= {"completed", "stopped"}
    assert "loss" in summary["verdict"]["text"]
    # Not anchored, the folder's copy of the recipe is not run: each reload is skipped, and said.
    with_model = [r for r, s in statuses.items() if s in ("completed", "stopped")]
    unanchored = verify_output(out)
    assert unanchored.verified and unanchored.reloaded_runs == []
    assert len(unanchored.skipped) >= len(with_model)
    # Anchored by the sha256 the close printed, in a fresh process that knows nothing of the
    # spec's folder: the output folder alone resolves the recipe (its copy beside spec.yaml)
    # and the run IDs, and every model reloads, a run stopped by the quality floor's too (the
    # model it reached). One anchored verify: each reload is a process of its own.
    sha = summary["manifest_sha256"]
    again = subprocess.run(
        [sys.executable, "-m", "gpucampaign.cli", "verify", str(out), "--expect", sha, "--json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert again.returncode == 0, again.stdout + again.stderr
    report = json.loads(again.stdout)
    assert report["verified"] and sorted(report["reloaded_runs"]) == sorted(with_model)
    assert (out / "textlm.py").read_bytes() == (tmp_path / "tl" / "textlm.py").read_bytes()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["corpus"]["sha256"] == data["corpus"]["sha256"]
    rid = next(r for r, v in manifest["runs"].items() if v["run"] == "control")
    cfg = json.loads((out / "runs" / rid / "model" / "config.json").read_text())
    assert cfg["recipe"] == "textlm:CharLM" and cfg["recipe_sha256"] == sha256_file(
        tmp_path / "tl" / "textlm.py"
    )
    assert (out / "runs" / rid / "predictions.csv").read_text().startswith("batch,rows,loss")


@pytest.mark.slow
def test_textlm_reaches_a_verdict_with_an_interval_on_validation_loss(tmp_path: Path) -> None:
    """The example's recipe scores each text window: the close draws the verdict's interval
    on validation (and test) loss from them. Trained small here, without Prefect."""
    from gpucampaign.data.corpus import load_spec_corpus
    from gpucampaign.folder.layout import OutputFolder
    from gpucampaign.plan import calendar
    from tests.helpers import close_and_seal, train_every_run

    spec_path = init_textlm(tmp_path / "tl")
    data = yaml.safe_load(spec_path.read_text())
    data["control"].update(args={"layers": 1, "width": 32, "heads": 2, "context": 32}, epochs=1)
    data["variants"][0]["changes"] = {"args": {"width": 16}}
    data["stop_rules"] = {"require_restart": False, "below_threshold": False}
    spec_path.write_text(yaml.safe_dump(data, sort_keys=False))
    spec = load_spec(spec_path)
    out = tmp_path / "out"
    folder = OutputFolder(out)
    folder.copy_in(spec_path, "spec.yaml")
    folder.write_plan_once(calendar.plan(spec).to_dict())
    corpus = load_spec_corpus(spec, base_dir=spec_path.parent)
    train_every_run(spec, folder=folder, corpus=corpus)
    closed, _ = close_and_seal(
        spec,
        out=out,
        base_dir=spec_path.parent,
        corpus=corpus,
        trained=spec.run_names(),
        campaign_id="textlm-0001",
    )
    v = closed.verdict
    assert v.kind in ("adopt", "negative", "inconclusive") and v.numbers["metric"] == "loss"
    for name in ("narrow", "lr-high"):
        for split in ("val", "test"):
            entry = v.variants[name][split]
            low, high = entry["gain_ci95"]
            assert low <= entry["gain"] <= high and entry["n"] > 10
    assert "(no interval)" not in v.text
