"""The folder does not choose which installed code runs: a recipe is resolved to a file and
hashed before anything is imported; no recorded sha256 means nothing is trusted; a package's
``__main__`` or a file without the recipe's class is never imported; a dotted name's package
is not run before its file's hash is checked."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpucampaign.cli import app
from tests.helpers import reseal


def _name(out: Path, closed: dict, recipe: str, sha: str | None) -> None:
    """The attack: the control's model names ``recipe`` (with ``sha`` as its recorded
    sha256, or none), the manifest re-hashed to match."""
    cfg_path = out / "runs" / closed["run_ids"]["control"] / "model" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["recipe"] = cfg["run_config"]["recipe"] = recipe
    cfg.pop("recipe_sha256", None)
    if sha is not None:
        cfg["recipe_sha256"] = sha
    cfg_path.write_text(json.dumps(cfg, indent=2))
    reseal(out)


def _predict(out: Path, *args: str) -> tuple[int, str]:
    got = CliRunner().invoke(app, ["predict", str(out), "control", *args])
    return got.exit_code, " ".join(got.output.split())


def _venv_main_sha() -> str:
    import importlib.util

    found = importlib.util.find_spec("venv")
    assert found is not None and found.origin
    return hashlib.sha256((Path(found.origin).parent / "__main__.py").read_bytes()).hexdigest()


@pytest.mark.parametrize("trust", [False, True], ids=["untrusted", "trust-folder-code"])
def test_no_recorded_sha256_trusts_nothing(out: Path, closed: dict, monkeypatch, trust) -> None:
    """``venv.__main__:X`` with no ``recipe_sha256``: refused in one paragraph naming the
    field, exit 2, and ``venv`` never imported."""
    for name in [m for m in sys.modules if m == "venv" or m.startswith("venv.")]:
        monkeypatch.delitem(sys.modules, name)
    _name(out, closed, "venv.__main__:X", None)
    code, text = _predict(out, *(["--trust-folder-code"] if trust else []))
    assert code == 2, text
    assert "recipe_sha256" in text and "Traceback" not in text
    assert "venv" not in sys.modules and "venv.__main__" not in sys.modules


def test_a_packages_main_with_its_own_sha256_is_never_imported(
    out: Path, closed: dict, monkeypatch
) -> None:
    """The folder records the real sha256 of ``venv/__main__.py`` (anyone can compute it): the
    file matches, and is still refused before it is imported."""
    for name in [m for m in sys.modules if m == "venv" or m.startswith("venv.")]:
        monkeypatch.delitem(sys.modules, name)
    _name(out, closed, "venv.__main__:X", _venv_main_sha())
    code, text = _predict(out)
    assert code == 2, text
    assert "__main__" in text and "Traceback" not in text
    assert "venv" not in sys.modules and "venv.__main__" not in sys.modules


def test_a_dotted_recipe_name_runs_no_package_before_its_hash_is_checked(
    out: Path, closed: dict, tmp_path: Path, monkeypatch
) -> None:
    """``--recipes DIR`` holding a package whose ``__init__`` has a side effect, and a module
    of another sha256 than recorded: refused as not trusted, the package never run."""
    pkg_name = "sideeffect_pkg_46"
    recipes = tmp_path / "recipes"
    (recipes / pkg_name).mkdir(parents=True)
    marker = tmp_path / "package-ran"
    (recipes / pkg_name / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    (recipes / pkg_name / "mod.py").write_text(
        "from gpucampaign.builtin.tabular import MLP as Planted\n"
    )
    monkeypatch.setattr(sys, "path", list(sys.path))
    _name(out, closed, f"{pkg_name}.mod:Planted", "0" * 64)
    code, text = _predict(out, "--recipes", str(recipes))
    assert not marker.exists(), text
    assert code == 2 and "another sha256" in text, text
    sys.modules.pop(pkg_name, None)


def test_a_file_without_the_recipes_class_is_never_imported(
    out: Path, closed: dict, tmp_path: Path, monkeypatch
) -> None:
    """The user's own helper script in ``--recipes DIR``, named with its real sha256 and a class
    it does not define: refused before it runs."""
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    marker = tmp_path / "helper-ran"
    helper = recipes / "my_helper_46.py"
    helper.write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    _name(out, closed, "my_helper_46:Anything", hashlib.sha256(helper.read_bytes()).hexdigest())
    code, text = _predict(out, "--recipes", str(recipes))
    assert not marker.exists(), text
    assert code == 2 and "defines no class 'Anything'" in text, text
