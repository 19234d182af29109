"""The tool as a renter installs it: the wheel, installed (not editable) into a fresh virtual
environment, runs a whole campaign from a folder of the renter's own, with no checkout on the
path and with modules of their own named ``tasks`` and ``flows`` beside them.

The fresh environment takes its dependencies (torch, prefect, ...) from the environment that
runs the tests, through a path file that names its site-packages: nothing is downloaded, and
that environment's own ``gpucampaign`` (an editable install of the checkout, say) comes after
the wheel's and is never used (the test checks where each module was imported from).
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.slow, pytest.mark.process, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
#: What the wheel is built from: the project file and the package sources (src/ links the textlm
#: example's recipe, copied below).
SOURCES = ("pyproject.toml", "README.md", "src")


def _build_wheel(tmp: Path) -> Path:
    """``pip wheel --no-deps`` of a copy of the checkout (the build writes nothing here)."""
    tree = tmp / "source"
    tree.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for name in SOURCES:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, tree / name, symlinks=True, ignore=ignore)
        else:
            shutil.copy2(src, tree / name)
    (tree / "examples" / "textlm").mkdir(parents=True)
    shutil.copy2(ROOT / "examples" / "textlm" / "textlm.py", tree / "examples" / "textlm")
    built = tmp / "wheel"
    _ok(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
        + ["--wheel-dir", str(built), str(tree)]
    )
    (wheel,) = built.glob("gpucampaign-*.whl")
    return wheel


def _fresh_venv(tmp: Path, wheel: Path) -> Path:
    """A new virtual environment holding the wheel; its ``bin`` folder."""
    venv = tmp / "venv"
    _ok([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    _ok(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps"]
        + ["--no-index", str(wheel)]
    )
    purelib = _ok([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"])
    # Plain path lines: the folders are appended to sys.path, their own .pth files (an
    # editable install of the checkout) are not read.
    deps = "\n".join(site.getsitepackages()) + "\n"
    (Path(purelib.strip()) / "_test_dependencies.pth").write_text(deps, encoding="utf-8")
    return venv / "bin"


def _ok(cmd: list[str], **kw: object) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)  # type: ignore[call-overload]
    assert done.returncode == 0, (
        f"{cmd}: {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return str(done.stdout)


def test_the_installed_wheel_runs_a_campaign_from_the_users_own_folder(tmp_path: Path) -> None:
    wheel = _build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as z:
        tops = {n.split("/")[0] for n in z.namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {
        "gpucampaign",
        "gpucampaign_prefect",
    }
    bin_dir = _fresh_venv(tmp_path, wheel)

    user = tmp_path / "renter"
    (user / "flows").mkdir(parents=True)
    (user / "tasks.py").write_text("raise ImportError('the renter tasks.py was imported')\n")
    (user / "flows" / "__init__.py").write_text("raise ImportError('the renter flows/')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env |= {"PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"}
    env |= {"PREFECT_HOME": str(tmp_path / "prefect-home")}

    def campaign(*args: str) -> str:
        return _ok([str(bin_dir / "campaign"), *args], cwd=user, env=env)

    where = _ok(
        [
            str(bin_dir / "python"),
            "-c",
            "import gpucampaign, gpucampaign_prefect.flows.campaign as c; "
            "print(gpucampaign.__file__); print(c.__file__)",
        ],
        cwd=user,
        env=env,
    )
    venv = str(bin_dir.parent)
    assert all(line.startswith(venv) for line in where.split()), where

    campaign("init", "mine")
    campaign("init", "--example", "textlm", "words")  # the recipe file comes from the wheel
    assert (user / "words" / "textlm.py").read_bytes() == (
        ROOT / "examples" / "textlm" / "textlm.py"
    ).read_bytes()
    spec = user / "mine" / "campaign.yaml"
    data = yaml.safe_load(spec.read_text())
    data["control"] = {**data["control"], "epochs": 2}
    data["pilot"] = {"steps": 5}
    spec.write_text(yaml.safe_dump(data, sort_keys=False))

    assert "fits" in campaign("plan", "mine/campaign.yaml")
    ran = campaign("run", "mine/campaign.yaml", "--out", "out")
    assert "output folder verified" in ran
    assert (user / "out" / "manifest.json").is_file()  # where the user stands, not elsewhere
    assert "verified" in campaign("verify", "out")
    assert "identical" in campaign("restart-check", "mine/campaign.yaml", "--steps", "20")
