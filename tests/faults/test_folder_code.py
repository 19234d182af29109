"""No code of an output folder runs unless its manifest is anchored: a folder whose manifest was
rewritten to match a planted recipe is verified on its bytes, its planted code never imported;
``--expect`` (the manifest's sha256 printed at the close, kept outside the folder) fails on
another manifest and, when it matches, lets the folder's own recipe copies reload its models."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gpucampaign.cli import app
from gpucampaign.config import load_spec, parse_spec, spec_sha256
from tests.helpers import reseal
from tests.helpers.specs import REGRESS_RECIPE as RECIPE

REPO = Path(__file__).resolve().parents[2]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _payload(marker: Path) -> str:
    """Module text that runs a command (``id``) into ``marker`` when imported."""
    return (
        "import subprocess\n"
        f"with open({str(marker)!r}, 'w') as f:\n"
        "    subprocess.run(['id'], stdout=f, check=False)\n"
        "from gpucampaign.builtin.tabular import MLP as Planted\n"
    )


def _plant(out: Path, run_id: str, marker: Path) -> None:
    """The attack: the run's model names a recipe shipped in the folder (in its model folder,
    and at the folder's top, found first from a working folder inside it), whose code runs
    ``id``; its hash is recorded in config.json and the manifest is rewritten to match."""
    model = out / "runs" / run_id / "model"
    (model / "recipe").mkdir(exist_ok=True)
    for where in (model / "recipe", out):
        (where / "planted_recipe.py").write_text(_payload(marker))
    cfg = json.loads((model / "config.json").read_text())
    cfg["recipe"] = cfg["run_config"]["recipe"] = "planted_recipe:Planted"
    cfg["recipe_sha256"] = _sha(model / "recipe" / "planted_recipe.py")
    cfg["files"]["recipe/planted_recipe.py"] = {
        "sha256": cfg["recipe_sha256"],
        "bytes": (model / "recipe" / "planted_recipe.py").stat().st_size,
    }
    (model / "config.json").write_text(json.dumps(cfg, indent=2))
    reseal(out)


def _verify(out: Path, *args: str) -> tuple[int, str]:
    got = CliRunner().invoke(app, ["verify", str(out), *args])
    return got.exit_code, " ".join(got.output.split())


@pytest.mark.process
def test_a_rewritten_manifest_does_not_get_the_folders_code_run(
    out: Path, closed: dict, tmp_path: Path, faults
) -> None:
    """The hashes all match (exit 0), the planted model is not reloaded, and the output says
    why and how to allow it; ``--expect`` with another sha256 fails naming both."""
    marker = tmp_path / "code-ran"
    control = closed["run_ids"]["control"]
    _plant(out, control, marker)
    code, text = _verify(out)
    faults.code_attempt(ran=marker.exists())
    assert not marker.exists(), "the folder's code ran"
    assert code == 0, text
    assert f"model of run {control} not reloaded" in text
    assert "--expect" in text and "--trust-folder-code" in text
    assert f"manifest.json sha256 {_sha(out / 'manifest.json')}" in text
    got = CliRunner().invoke(app, ["verify", str(out), "--json"])
    report = json.loads(got.output)
    assert got.exit_code == 0 and report["verified"] and report["folder_code_trusted"] is False
    assert control not in report["reloaded_runs"] and len(report["reloaded_runs"]) == 1
    assert any(control in s and "not reloaded" in s for s in report["skipped"])

    wrong = "0" * 64
    code, text = _verify(out, "--expect", wrong)
    faults.code_attempt(ran=marker.exists())
    assert code == 4 and not marker.exists(), text
    assert "manifest_not_anchored" in text and wrong in text
    assert _sha(out / "manifest.json") in text
    assert "Traceback" not in text

    code, text = _verify(out, "--expect", "not-a-sha")
    assert code == 2 and "--expect" in text and "64 hexadecimal" in text
    # Anchored (or trusted), the folder's copy is what reloads the model: the payload is real.
    code, text = _verify(out, "--expect", _sha(out / "manifest.json"))
    assert marker.exists(), text
    assert "as expected (--expect)" in text


@pytest.mark.process
def test_verifying_from_inside_the_folder_imports_nothing_of_it(
    out: Path, closed: dict, tmp_path: Path, faults
) -> None:
    """``python -m gpucampaign.cli verify .`` from inside the folder: its top is the first place
    Python looks, the spec copy names a recipe in a package planted there, the model a planted
    module; nothing of them is imported."""
    marker = tmp_path / "code-ran"
    _plant(out, closed["run_ids"]["control"], marker)
    (out / "planted_pkg").mkdir()
    (out / "planted_pkg" / "__init__.py").write_text(_payload(marker))
    (out / "planted_pkg" / "mod.py").write_text("VALUE = 1\n")
    spec_copy = out / "spec.yaml"
    data = yaml.safe_load(spec_copy.read_text())
    data["control"]["recipe"] = "planted_pkg.mod:Planted"
    spec_copy.write_text(yaml.safe_dump(data, sort_keys=False))
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["spec_sha256"] = spec_sha256(parse_spec(data))  # no recipe is looked up
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    reseal(out)
    path = [os.environ.get("PYTHONPATH"), str(REPO / "src"), str(REPO)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, path))}
    proc = subprocess.run(
        [sys.executable, "-m", "gpucampaign.cli", "verify", "."],
        cwd=out,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    faults.code_attempt(ran=marker.exists())
    assert not marker.exists(), proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert "not reloaded" in " ".join(proc.stdout.split())


# --- a campaign of a user's recipe, sealed; the user's recipe file gone afterwards ---------


@pytest.fixture(scope="module")
def recipe_campaign(tmp_path_factory) -> dict:
    """A closed, sealed campaign whose two runs were trained by a user's recipe."""
    import torch

    from gpucampaign.data.corpus import load_spec_corpus
    from gpucampaign.folder.layout import OutputFolder
    from gpucampaign.plan import calendar
    from tests.helpers import close_and_seal, train_every_run

    base = tmp_path_factory.mktemp("recipe-campaign")
    src = base / "src"
    src.mkdir()
    module = f"anchored_recipe_{uuid.uuid4().hex[:8]}"
    (src / f"{module}.py").write_text(textwrap.dedent(RECIPE))
    g = torch.Generator().manual_seed(0)
    X = torch.rand(96, 2, generator=g)
    y = 2 * X[:, 0] - X[:, 1]
    rows = zip(X.tolist(), y.tolist(), strict=True)
    (src / "points.txt").write_text("".join(f"{a:.6f} {b:.6f} {c:.6f}\n" for (a, b), c in rows))
    data = {
        "name": "anchored",
        "packages": [{"gpu": "rtx4090", "days": 3}],
        "calendar": [{"name": "prep", "kind": "human", "hours": 1}],
        "corpus": {"path": "points.txt", "sha256": _sha(src / "points.txt")},
        "control": {
            "recipe": f"{module}:Regress",
            "args": {"width": 4},
            "batch_size": 8,
            "epochs": 1,
            "lr": 0.05,
            "threads": 1,
        },
        "variants": [{"name": "wide", "changes": {"args": {"width": 8}}}],
        "decision_rule": {"metric": "mse", "direction": "minimize", "threshold": 10.0},
        "stop_rules": {"require_restart": False},
        "pilot": {"steps": 2},
    }
    (src / "campaign.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    spec = load_spec(src / "campaign.yaml")
    folder = OutputFolder(base / "out")
    folder.copy_in(src / "campaign.yaml", "spec.yaml")
    folder.write_plan_once(calendar.plan(spec).to_dict())
    corpus = load_spec_corpus(spec, base_dir=src)
    trained = train_every_run(spec, folder=folder, corpus=corpus)
    close_and_seal(
        spec, out=folder.root, base_dir=src, corpus=corpus, trained=trained, campaign_id="a-1"
    )
    keep = base / "recipes"
    keep.mkdir()
    shutil.move(src / f"{module}.py", keep / f"{module}.py")  # only the folder's copy is left
    sys.modules.pop(module, None)
    runs = sorted(spec.run_ids().values())
    return {"out": folder.root, "recipes": keep, "runs": runs, "module": module}


@pytest.mark.process
def test_an_anchored_recipe_campaign_reloads_through_its_own_copy(recipe_campaign) -> None:
    out, runs = recipe_campaign["out"], recipe_campaign["runs"]
    sha = _sha(out / "manifest.json")
    code, text = _verify(out)
    assert code == 0, text
    assert all(f"model of run {rid} not reloaded" in text for rid in runs), text
    assert f"0 model(s) reloaded and reproduced, {len(runs)} not reloaded" in " ".join(text.split())

    got = CliRunner().invoke(app, ["verify", str(out), "--expect", sha.upper(), "--json"])
    report = json.loads(got.output)
    assert got.exit_code == 0, got.output
    assert report["anchored"] is True and report["folder_code_trusted"] is True
    assert sorted(report["reloaded_runs"]) == runs and report["skipped"] == []

    # The user's own recipe file (its spec folder) is trusted without an anchor.
    code, text = _verify(out, "--recipes", str(recipe_campaign["recipes"]))
    assert code == 0 and "2 model(s) reloaded" in text, text
    assert "not reloaded" not in text


@pytest.mark.process
def test_your_own_recipe_with_another_sha256_fails_verify(recipe_campaign, tmp_path: Path) -> None:
    """``--recipes DIR`` whose file has changed since the models were made: no model of it is
    reloaded, and verify fails (exit 4) naming the file, not a quiet "verified"."""
    out, module = recipe_campaign["out"], recipe_campaign["module"]
    mine = tmp_path / "recipes"
    shutil.copytree(recipe_campaign["recipes"], mine)
    with open(mine / f"{module}.py", "a") as f:
        f.write("# edited since the campaign\n")
    sys.modules.pop(module, None)
    code, text = _verify(out, "--recipes", str(mine))
    assert code == 4, text
    assert "recipe_mismatch" in text and "another sha256" in text and "NOT verified" in text
