"""The working folder and the output folder are never on the import path, by any entry.

Each of the two layers is tested alone, so that one cannot mask the other:

- the package's own guard (``gpucampaign.__init__``): ``python -m gpucampaign.X`` run from
  inside an output folder drops the working folder from ``sys.path`` before anything else is
  imported. Shown on ``python -m gpucampaign.predictions`` (no reload child at all), whose own
  module imports ``csv`` and ``json``, which a planted ``csv.py``/``json.py`` would shadow;
- the reload child's launch (``reload_in_fresh_process``): ``-P``, ``PYTHONSAFEPATH`` and no
  empty ``PYTHONPATH`` entry. Shown by running the child's exact interpreter line and
  environment with ``-c`` in place of the module, so the package's guard never runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import reseal

REPO = Path(__file__).resolve().parents[2]
#: Modules Python does import on these paths (not at its start): the planted copies shadow them.
SHADOWED = ("csv", "json")


def _plant(where: Path, marker: Path) -> None:
    for name in SHADOWED:
        (where / f"{name}.py").write_text(
            f"with open({str(marker)!r}, 'a') as f:\n    f.write({name!r} + ' ran\\n')\n"
            "raise SystemExit('planted module ran')\n"
        )


def _env() -> dict[str, str]:
    path = [os.environ.get("PYTHONPATH"), str(REPO / "src"), str(REPO)]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, path))}


def _run(args: list[str], *, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=300
    )


@pytest.mark.process
@pytest.mark.parametrize("command", ["reload-check", "predict"])
def test_python_m_predictions_from_inside_the_folder_imports_none_of_it(
    out: Path, closed: dict, tmp_path: Path, faults, command: str
) -> None:
    """The planted modules sit at the folder's top (re-hashed into the manifest) and in another
    working folder; neither is imported, and the command does its work."""
    marker = tmp_path / "code-ran"
    _plant(out, marker)
    reseal(out)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _plant(elsewhere, marker)
    rid = closed["run_ids"]["control"]
    tail = ["--json"] if command == "reload-check" else []
    for cwd, folder in ((out, "."), (elsewhere, str(out))):
        proc = _run(["-m", "gpucampaign.predictions", command, folder, rid, *tail], cwd=cwd)
        faults.code_attempt(ran=marker.exists())
        assert not marker.exists(), marker.read_text() + proc.stderr
        assert proc.returncode == 0, proc.stderr
        assert "Traceback" not in proc.stderr


@pytest.mark.process
def test_python_m_cli_verify_from_inside_the_folder_imports_none_of_it(
    out: Path, tmp_path: Path, faults
) -> None:
    """``python -m gpucampaign.cli verify .`` with a planted ``csv.py``/``json.py`` at the
    folder's top, re-hashed into the manifest: verified, and nothing planted ran."""
    marker = tmp_path / "code-ran"
    _plant(out, marker)
    reseal(out)
    proc = _run(["-m", "gpucampaign.cli", "verify", "."], cwd=out)
    faults.code_attempt(ran=marker.exists())
    assert not marker.exists(), marker.read_text() + proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert "model(s) reloaded" in proc.stdout


def test_the_reload_childs_launch_alone_keeps_the_working_folder_off_the_path(
    out: Path, closed: dict, tmp_path: Path, monkeypatch, faults
) -> None:
    """The child's interpreter line and environment, exactly as ``reload_in_fresh_process``
    starts it from inside the folder, with a ``PYTHONPATH`` that ends in an empty entry (the
    working folder, to Python); ``-c`` in place of the module so only the launch is tested."""
    from gpucampaign.close import predictions

    marker = tmp_path / "code-ran"
    _plant(out, marker)
    seen: dict = {}
    run = subprocess.run  # the real one: the capture below replaces it module-wide

    def capture(cmd, **kw):
        seen.update(cmd=list(cmd), env=kw["env"])
        return subprocess.CompletedProcess(cmd, 0, stdout="{}", stderr="")

    monkeypatch.chdir(out)
    monkeypatch.setenv("PYTHONPATH", _env()["PYTHONPATH"] + os.pathsep)
    monkeypatch.setattr(predictions.subprocess, "run", capture)
    predictions.reload_in_fresh_process(out, [closed["run_ids"]["control"]])
    cmd = seen["cmd"]
    launch = cmd[: cmd.index("-m")]
    probe = "import sys, csv, json; print(csv.__file__, json.__file__)"
    proc = run([*launch, "-c", probe], cwd=out, env=seen["env"], capture_output=True, text=True)
    faults.code_attempt(ran=marker.exists())
    assert not marker.exists() and proc.returncode == 0, proc.stderr
    assert str(out) not in proc.stdout
