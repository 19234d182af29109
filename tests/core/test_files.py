"""The file helpers: the per-process hash cache, the commit of a checkout."""

from __future__ import annotations

import hashlib
import os

import pytest

from gpucampaign.core import files
from gpucampaign.core.files import git_commit, sha256_file


def test_a_file_is_hashed_once_until_it_changes(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "_HASHED", {})
    path = tmp_path / "corpus.csv"
    path.write_bytes(b"a,b\n1,2\n")
    assert sha256_file(path) == hashlib.sha256(b"a,b\n1,2\n").hexdigest()
    assert files._HASHED == {}  # just written: within the racy window, never cached
    monkeypatch.setattr(files, "_RACY_NS", 0)
    digest = sha256_file(path)
    assert list(files._HASHED.values()) == [digest]
    key = next(iter(files._HASHED))
    files._HASHED[key] = "from-the-cache"
    assert sha256_file(path) == "from-the-cache"  # the second call does not read the file
    tmp = tmp_path / "new"
    tmp.write_bytes(b"a,b\n3,4\n")
    os.replace(tmp, path)  # same size, new inode: a miss
    assert sha256_file(path) == hashlib.sha256(b"a,b\n3,4\n").hexdigest()


@pytest.mark.process
def test_git_commit_of_a_file_no_checkout_tracks_is_none(tmp_path):
    """The library installed in a virtual environment inside the user's own repository: its
    files are not that repository's, so no commit of it is given as the library's."""
    import subprocess

    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / ".gitignore").write_text(".venv/\n")
    git("add", ".gitignore")
    git("-c", "user.name=u", "-c", "user.email=u@x", "commit", "-qm", "x")
    installed = tmp_path / ".venv" / "lib" / "gpucampaign" / "saveload.py"
    installed.parent.mkdir(parents=True)
    installed.write_text("")
    assert git_commit(installed.parent) is not None  # the user's repository answers
    assert git_commit(installed.parent, tracking=installed) is None
    tracked = tmp_path / ".gitignore"
    assert git_commit(tmp_path, tracking=tracked) == git_commit(tmp_path)


def test_a_file_replaced_now_is_fsynced_once_later(tmp_path, monkeypatch):
    """``replace_bytes`` renames into place without an fsync (a training loop's evaluation
    record, issue 47); ``sync_files`` fsyncs each file and its folder once, skips a file gone
    since, and empties the list."""
    synced: list[str] = []
    real = files.os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(files.os, "fsync", fsync)
    pending = [files.replace_bytes(tmp_path / "a" / f"s-{i}.npz", b"x" * i) for i in (1, 2, 3)]
    assert synced == [] and (tmp_path / "a" / "s-2.npz").read_bytes() == b"xx"
    assert not [p for p in (tmp_path / "a").iterdir() if p.name.startswith(files.TMP_PREFIX)]
    (tmp_path / "a" / "s-3.npz").unlink()
    files.sync_files(pending)
    assert pending == []
    assert synced == [str(tmp_path / "a" / n) for n in ("s-1.npz", "s-2.npz")] + [
        str(tmp_path / "a")
    ]


def test_model_folders_ask_git_once_a_process(tmp_path, monkeypatch):
    """The library's checkout state is asked once a process (three ``git`` processes each
    time, 6-15 ms at every run's end): every model folder of the process records the same
    commit, each its own copy of it."""
    import gpucampaign.modelfolder.saveload as saveload
    from gpucampaign.builtin import build_model
    from gpucampaign.config import RunConfig

    asked: list[str] = []

    def counted(cwd=None, *, tracking=None):
        asked.append(str(cwd))
        return "abc123-dirty"

    saveload._git_state.cache_clear()
    monkeypatch.setattr(saveload, "git_commit", counted)
    cfg = RunConfig()
    model = build_model(cfg, n_features=4, n_classes=3)
    infos = [
        saveload.save_model_dir(model, tmp_path / f"m{i}", config=cfg, n_features=4, n_classes=3)
        for i in range(3)
    ]
    saveload._git_state.cache_clear()  # the next test's process state, not this fake's
    assert len(asked) == 1
    assert [i["git"] for i in infos] == [{"commit": "abc123", "dirty": True}] * 3
    infos[0]["git"]["commit"] = "changed"
    assert infos[1]["git"]["commit"] == "abc123"
