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

BLOCK = re.compile(r"```(bash|python)\n(.*?)```", re.S)


@pytest.mark.process
@pytest.mark.timeout(600)
def test_every_reload_md_command_leaves_the_folder_verified(out: Path, tmp_path: Path):
    """On a private copy (``out``) of the session's closed folder."""
    preds = _run_blocks(out, tmp_path)
    assert list(preds.glob("*.csv")), "the prediction went to the folder the reader chose"
    report = verify_output(out, reload=True)
    assert report.verified, report.problems


def _run_blocks(out: Path, tmp_path: Path) -> Path:
    """Every code block of ``out/RELOAD.md``, run as written from another folder; the folder
    the predictions went to."""
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
    blocks = BLOCK.findall((out / "RELOAD.md").read_text())
    assert [kind for kind, _ in blocks] == ["bash", "bash", "bash", "python"]
    for kind, code in blocks:
        args = ["bash", "-c", code] if kind == "bash" else [sys.executable, "-c", code]
        done = subprocess.run(
            args, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, (code, done.stdout[-2000:], done.stderr[-2000:])
    assert list(elsewhere.iterdir()) == []
    return preds


@pytest.mark.process
@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", ["images", "npy"])
def test_reload_md_runs_as_written_for_a_recipe_on_a_folder_or_npy_corpus(
    tmp_path: Path, kind: str
):
    """An image-folder corpus once failed with "corpus file 'data/images' is missing" and an
    .npy corpus with UnicodeDecodeError; the commands name the real runs, no placeholder."""
    from tests.helpers.recipefolder import build_recipe_folder

    built = build_recipe_folder(tmp_path / "campaign", kind)
    out = built["out"]
    text = (out / "RELOAD.md").read_text()
    assert "<" not in text and "unknown" not in text  # no placeholder
    shown = re.search(r"campaign predict \"\$OUT\" (\S+)", text).group(1)
    assert built["run_ids"][shown] in text
    preds = _run_blocks(out, tmp_path)
    written = (preds / f"{shown}.csv").read_text().splitlines()
    assert written[0].startswith("id,split,label,prediction")
    # every example of the corpus, in the order the recipe's splits hold them
    n = 32 if kind == "images" else 48
    assert len(written) == n + 1
    assert verify_output(out, reload=True).verified
