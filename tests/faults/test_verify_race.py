"""``verify --expect SHA`` reads what it checked: right after the anchor and the hashes are
checked, and before the models reload, the folder's recipe copy, ``config.json`` and manifest
are swapped for a planted recipe (its manifest re-hashed to match). Nothing swapped runs, and
the verdict is the one of the folder checked."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpucampaign.cli import app
from gpucampaign.verify import checks
from tests.helpers import reseal


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _swap(out: Path, run_id: str, marker: Path) -> None:
    """The swap: a planted recipe copy whose import writes ``marker``, the model's
    ``config.json`` naming it with its sha256, and the manifest rewritten to match."""
    model = out / "runs" / run_id / "model"
    (model / "recipe").mkdir(exist_ok=True)
    planted = model / "recipe" / "planted_recipe.py"
    planted.write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n"
        "from gpucampaign.builtin.tabular import MLP as Planted\n"
    )
    cfg = json.loads((model / "config.json").read_text())
    cfg["recipe"] = cfg["run_config"]["recipe"] = "planted_recipe:Planted"
    cfg["recipe_sha256"] = _sha(planted)
    cfg["files"]["recipe/planted_recipe.py"] = {
        "sha256": cfg["recipe_sha256"],
        "bytes": planted.stat().st_size,
    }
    (model / "config.json").write_text(json.dumps(cfg, indent=2))
    reseal(out)


@pytest.mark.process
def test_a_swap_after_the_anchor_check_runs_nothing_swapped(
    out: Path, closed: dict, tmp_path: Path, monkeypatch, faults
) -> None:
    marker = tmp_path / "code-ran"
    control = closed["run_ids"]["control"]
    sha = _sha(out / "manifest.json")
    real = checks.reload_in_fresh_process
    swapped = []

    def swap_then_reload(*args, **kw):
        # The point between the checks and the reload: the folder is swapped under verify.
        _swap(out, control, marker)
        swapped.append(_sha(out / "manifest.json"))
        return real(*args, **kw)

    monkeypatch.setattr(checks, "reload_in_fresh_process", swap_then_reload)
    got = CliRunner().invoke(app, ["verify", str(out), "--expect", sha, "--json"])
    faults.code_attempt(ran=marker.exists())
    assert swapped and swapped[0] != sha  # the swap happened, and changed the manifest
    assert not marker.exists(), got.output
    report = json.loads(got.output)
    assert got.exit_code == 0 and report["verified"], got.output
    assert report["anchored"] is True and report["manifest_sha256"] == sha
    assert sorted(report["reloaded_runs"]) == sorted(closed["run_ids"].values())
    assert report["problems"] == [] and report["skipped"] == []
