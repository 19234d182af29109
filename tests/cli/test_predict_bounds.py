"""``campaign predict`` and ``python -m gpucampaign.predictions predict`` on odd paths: each
refused at once in one paragraph naming the option (exit 2), before any model is loaded and
without reading or writing anything: a FIFO, a device or a large sparse file as ``--input``,
``--to`` an existing file without ``--force``, a folder, or a file inside the output folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpucampaign.cli import app
from gpucampaign.close import predictions
from gpucampaign.close.predictions import MAX_INPUT_BYTES


@pytest.fixture
def out(tmp_path: Path) -> Path:
    """Any folder: the paths are refused before the folder is read."""
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "manifest.json").write_text("{}")
    return folder


def _both(out: Path, *args: str) -> list[tuple[int, str]]:
    """The exit code and the words said by each entry (the CLI, ``python -m``)."""
    cli = CliRunner().invoke(app, ["predict", str(out), "control", *args])
    said = [(cli.exit_code, " ".join(cli.output.split()))]
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = predictions.main(["predict", str(out), "control", *args])
    return [*said, (code, " ".join(err.getvalue().split()))]


def _refused(found: list[tuple[int, str]], *words: str) -> None:
    for code, said in found:
        assert code == 2 and "Traceback" not in said, said
        assert all(w in said for w in words), said


def test_a_fifo_a_device_or_a_huge_sparse_input_is_refused_unread(out: Path, tmp_path: Path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    _refused(_both(out, "--input", str(fifo)), "--input", "not a regular file")
    _refused(_both(out, "--input", "/dev/zero"), "--input", "not a regular file")
    inside = tmp_path / "folder"
    inside.mkdir()
    (inside / "a.csv").write_text("x\n")
    os.mkfifo(inside / "b.csv")
    _refused(_both(out, "--input", str(inside)), "--input", "b.csv", "not a regular file")
    sparse = tmp_path / "sparse.csv"
    with open(sparse, "wb") as f:
        f.truncate(MAX_INPUT_BYTES + 1)
    _refused(_both(out, "--input", str(sparse)), "--input", str(MAX_INPUT_BYTES))


def test_to_refuses_an_existing_file_a_folder_and_the_output_folder(out: Path, tmp_path: Path):
    kept = tmp_path / "kept.csv"
    kept.write_text("mine\n")
    _refused(_both(out, "--to", str(kept)), "--to", "existing file", "--force")
    assert kept.read_text() == "mine\n"
    _refused(_both(out, "--to", str(tmp_path)), "--to", "a folder")
    before = (out / "manifest.json").read_text()
    _refused(_both(out, "--to", str(out / "manifest.json"), "--force"), "--to", "sealed")
    assert (out / "manifest.json").read_text() == before
