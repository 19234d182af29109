"""A closed campaign stays sealed: a rerun into its folder verifies it against its manifest,
says so, trains nothing and rewrites nothing (every file's bytes and mtime, the manifest's
sha256 the anchor kept from the first close). A folder closed with runs left is no such
folder: its rerun resumes."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpucampaign.cli import app
from gpucampaign.preflight import closed_for_good
from tests.helpers.noprefect import PrefectWouldStart, refuse_prefect


@pytest.fixture(autouse=True)
def no_prefect(monkeypatch: pytest.MonkeyPatch) -> None:
    refuse_prefect(monkeypatch)


def walk(root: Path) -> dict[str, tuple[bytes | None, int]]:
    return {
        p.relative_to(root).as_posix(): (
            p.read_bytes() if p.is_file() else None,
            p.stat().st_mtime_ns,
        )
        for p in sorted(root.rglob("*"))
    }


def test_a_rerun_of_a_closed_campaign_verifies_and_rewrites_nothing(closed: dict) -> None:
    out: Path = closed["out"]
    spec = out.parent / "src" / "campaign.yaml"
    anchor = hashlib.sha256((out / "manifest.json").read_bytes()).hexdigest()
    before = walk(out)

    result = CliRunner().invoke(app, ["run", str(spec), "--out", str(out)])

    assert not isinstance(result.exception, PrefectWouldStart), "the campaign ran again"
    text = " ".join(result.output.split())
    assert result.exit_code == 0, text
    assert "closed for good" in text and "rewrote nothing" in text and "verified" in text
    assert anchor in text
    assert walk(out) == before
    assert hashlib.sha256((out / "manifest.json").read_bytes()).hexdigest() == anchor


def test_a_folder_closed_with_runs_left_is_not_closed_for_good(
    closed: dict, tmp_path: Path
) -> None:
    out = Path(shutil.copytree(closed["out"], tmp_path / "out"))
    assert closed_for_good(out) is not None
    manifest = json.loads((out / "manifest.json").read_text())
    first = next(iter(manifest["runs"]))
    manifest["runs"][first].update(status="not_run", reason="the lot ended")
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert closed_for_good(out) is None
    manifest["runs"][first].update(reason="the question was re-posed")  # final all the same
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert closed_for_good(out) is not None
