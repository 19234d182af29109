"""RELOAD.md's commands, followed literally in a fresh shell from another folder, write nothing
into the output folder: `campaign verify` still passes afterwards."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpucampaign.verify.checks import verify_output
from tests.helpers import build_closed_folder

BLOCK = re.compile(r"```(bash|python)\n(.*?)```", re.S)


@pytest.mark.process
@pytest.mark.timeout(600)
def test_every_reload_md_command_leaves_the_folder_verified(tmp_path: Path):
    out = build_closed_folder(tmp_path / "campaign")["out"]
    blocks = BLOCK.findall((out / "RELOAD.md").read_text())
    assert [kind for kind, _ in blocks] == ["bash", "bash", "bash", "python"]
    elsewhere, preds = tmp_path / "elsewhere", tmp_path / "predictions"
    elsewhere.mkdir()
    preds.mkdir()
    bindir = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "OUT": str(out),
        "PRED_DIR": str(preds),
        "PATH": bindir + os.pathsep + os.environ.get("PATH", ""),
    }
    for kind, code in blocks:
        args = ["bash", "-c", code] if kind == "bash" else [sys.executable, "-c", code]
        done = subprocess.run(
            args, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, (code, done.stdout[-2000:], done.stderr[-2000:])
    assert list(preds.glob("*.csv")), "the prediction went to the folder the reader chose"
    assert list(elsewhere.iterdir()) == []
    report = verify_output(out, reload=True)
    assert report.verified, report.problems
