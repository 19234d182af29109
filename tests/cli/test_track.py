"""`campaign track OUT`: its refusals, each an exit code and one paragraph naming what to fix,
before anything is sent (the sending itself: tests/tracking and tests/e2e/test_mlflow_server)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpucampaign.cli import app
from gpucampaign.tracking import mlflow as tracking
from tests.helpers import SPEC_TEMPLATE

runner = CliRunner()


@pytest.fixture(autouse=True)
def _no_server(monkeypatch):
    """No refusal may reach a tracking server."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("GPUCAMPAIGN_TRACKING", raising=False)

    def refuse(uri: str) -> None:
        raise AssertionError(f"a client was made for {uri}")

    monkeypatch.setattr(tracking, "make_client", refuse)


def _folder(root: Path, *, tracked: bool = True, uri: str | None = "http://127.0.0.1:9") -> Path:
    """A campaign folder whose manifest lists its spec with the wrong hash (a changed file)."""
    text = SPEC_TEMPLATE.format(sha="0" * 64, threshold=0.2, unit="null")
    if uri:
        text += f"tracking: {{mlflow: {{uri: '{uri}'}}}}\n"
    (root / "runs" / "control-0123456789").mkdir(parents=True)
    (root / "spec.yaml").write_text(text)
    if tracked:
        state = {"run_id": "control-0123456789", "uri": uri, "experiment": "closing-test"}
        (root / "runs" / "control-0123456789" / "mlflow.json").write_text(json.dumps(state))
    spec = {"path": "spec.yaml", "size": len(text), "sha256": "0" * 64}
    (root / "manifest.json").write_text(json.dumps({"campaign_id": "c-1", "files": [spec]}))
    return root


def test_a_folder_changed_since_its_seal_is_not_trusted(tmp_path):
    out = _folder(tmp_path / "out")
    res = runner.invoke(app, ["track", str(out), "--folder-uri"])
    assert res.exit_code == 4, res.output
    assert "hash_mismatch spec.yaml" in res.stdout
    assert (
        "is NOT the folder its manifest sealed" in res.stdout and "nothing was sent" in res.stdout
    )


@pytest.mark.parametrize(
    ("case", "field", "said"),
    [
        ("not a campaign", "OUT", "not a campaign output folder"),
        ("not closed", "OUT", "has no manifest.json: the campaign is not closed"),
        ("no server", "MLFLOW_TRACKING_URI", "no MLflow tracking server"),
        ("never tracked", "OUT", "was tracked (no runs/*/mlflow.json)"),
        ("credentials", "--uri", "remove the part before '@'"),
    ],
)
def test_bad_input_exits_2_naming_the_field_without_a_traceback(tmp_path, case, field, said):
    out = tmp_path / "out"
    args = ["track", str(out)]
    if case == "not a campaign":
        out.mkdir()
    elif case == "not closed":
        _folder(out)
        (out / "manifest.json").unlink()
    elif case == "no server":
        _folder(out, uri=None)
    elif case == "never tracked":
        _folder(out, tracked=False)
        args += ["--uri", "http://127.0.0.1:9"]
    else:
        _folder(out)
        args += ["--uri", "http://me:s3cret-pass@127.0.0.1:5000"]
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    text = " ".join(res.output.split())  # as one paragraph, whatever the terminal's width
    assert said in text and (str(out) if field == "OUT" else field) in text
    assert "Traceback" not in res.output and "s3cret-pass" not in res.output
