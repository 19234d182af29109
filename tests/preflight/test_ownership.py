"""The output folder is this tool's or nobody's: ``--out`` into a folder of the user's own
files, the spec's folder or a folder above the spec is refused before anything is written (exit
2, one paragraph naming the first foreign entry and the fix), and the user's files stay as they
were, byte for byte, name for name, mtime for mtime; a folder this tool started is taken
again."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpucampaign.cli import app
from gpucampaign.cli.scaffold import init_campaign
from gpucampaign.core.errors import FolderError
from gpucampaign.folder.layout import OWNER_FILE, SPEC_COPY
from gpucampaign.folder.lock import writer_lock
from gpucampaign.preflight import open_campaign, start_folder
from tests.helpers.noprefect import PrefectWouldStart, refuse_prefect

MTIME_NS = 1_600_000_000_000_000_000  # a fixed past mtime: any rewrite moves it


@pytest.fixture(autouse=True)
def no_prefect(monkeypatch: pytest.MonkeyPatch) -> None:
    refuse_prefect(monkeypatch)


def walk(root: Path) -> dict[str, tuple[str, bytes | None, int]]:
    """Every entry under ``root``: its kind, its bytes (files) and its mtime."""
    seen: dict[str, tuple[str, bytes | None, int]] = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        kind = "dir" if p.is_dir() else "file"
        seen[p.relative_to(root).as_posix()] = (
            kind,
            p.read_bytes() if kind == "file" else None,
            st.st_mtime_ns,
        )
    return seen


def user_folder(root: Path, *, spec: Path) -> Path:
    """A folder of the user's own: notes, data, a backup of the spec (even one named like the
    campaign's copy), every mtime fixed."""
    (root / "data").mkdir(parents=True)
    (root / "report.md").write_text("my notes: do not lose\n")
    (root / "data" / "keep.txt").write_text("keep me\n")
    (root / "campaign.yaml.bak").write_bytes(spec.read_bytes())
    (root / SPEC_COPY).write_bytes(spec.read_bytes())
    for p in [*root.rglob("*"), root]:
        os.utime(p, ns=(MTIME_NS, MTIME_NS), follow_symlinks=False)
    return root


def run(spec: Path, out: Path) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["run", str(spec), "--out", str(out)])
    if isinstance(result.exception, PrefectWouldStart):
        return -1, result.output
    return result.exit_code, " ".join(result.output.split())


def test_a_folder_that_is_not_the_tools_is_left_byte_for_byte(tmp_path: Path) -> None:
    spec = init_campaign(tmp_path / "project")
    mine = user_folder(tmp_path / "mine", spec=spec)
    project = spec.parent
    for p in [*project.rglob("*"), project]:
        os.utime(p, ns=(MTIME_NS, MTIME_NS), follow_symlinks=False)
    before = {"mine": walk(mine), "project": walk(project)}

    def unchanged() -> None:
        assert walk(mine) == before["mine"]
        assert walk(project) == before["project"]

    code, text = run(spec, mine)
    assert code == 2 and "Traceback" not in text, text
    assert "'campaign.yaml.bak'" in text and "4 in all" in text and "give a new --out" in text
    unchanged()

    code, text = run(spec, project)  # the spec's own folder
    assert code == 2 and "the spec's own folder" in text, text
    unchanged()

    code, text = run(spec, tmp_path)  # a folder above the spec
    assert code == 2 and "a folder above the spec" in text, text
    unchanged()

    with pytest.raises(FolderError, match="did not write"):
        open_campaign(spec, mine)
    unchanged()

    # Accepted: a new folder beside them, started as a run starts it (the lock, then the
    # owner mark first); taken again on a rerun, and the user's files are still untouched.
    other = tmp_path / "out" / "digits"
    with writer_lock(other):
        start_folder(open_campaign(spec, other))
    assert (other / OWNER_FILE).is_file() and (other / SPEC_COPY).read_bytes() == spec.read_bytes()
    assert run(spec, other)[0] == -1  # past every check: Prefect would start
    unchanged()


def test_an_empty_folder_and_a_lock_left_by_an_interrupted_start_are_accepted(
    tmp_path: Path,
) -> None:
    spec = init_campaign(tmp_path / "project")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run(spec, empty)[0] == -1
    with writer_lock(empty):  # its released lock stays behind: still the tool's folder
        pass
    assert run(spec, empty)[0] == -1
    (empty / ".lock").write_text("my own lock notes\n")  # not the tool's lock record
    code, text = run(spec, empty)
    assert code == 2 and "'.lock'" in text, text


@pytest.mark.parametrize(
    "mark",
    ["{}", '{"campaign": "digits"}', '{"format": "gpucampaign.folder/0", "campaign": "x"}'],
    ids=["empty", "no-format", "another-format"],
)
def test_a_mark_that_is_not_the_tools_format_does_not_make_the_folder_its(
    tmp_path: Path, mark: str
) -> None:
    """A user's folder holding a file named like the owner mark, whose content is not the
    tool's mark (a JSON object of another format), is still the user's: refused, untouched."""
    spec = init_campaign(tmp_path / "project")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me\n")
    (mine / OWNER_FILE).write_text(mark)
    for p in [*mine.rglob("*"), mine]:
        os.utime(p, ns=(MTIME_NS, MTIME_NS), follow_symlinks=False)
    before = walk(mine)
    code, text = run(spec, mine)
    assert code == 2 and "holds files this tool did not write" in text, text
    assert walk(mine) == before
