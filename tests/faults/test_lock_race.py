"""The one-writer lock raced after a crash: a stale lock left, several processes start at once.

Each trial leaves the lock file as a crashed holder leaves it (the record of a PID that no
longer runs on this host; in every other trial its lock is also still held, by the child the
dead holder left behind) and then releases three processes together (a barrier) into
``writer_lock`` on that folder. Each winner holds the folder until every process has tried, so
exactly one may win; the others are refused naming the winner.
"""

from __future__ import annotations

import fcntl
import json
import multiprocessing
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpucampaign.folder.layout import LOCK_FILE
from gpucampaign.folder.lock import FolderLocked, read_holder, writer_lock

TRIALS = 200
RACERS = 3
WAIT_S = 60


def _racer(folders: list[str], start: Any, tried: Any, results: Any) -> None:
    """One contender: for each trial, take the folder's lock at the barrier; a winner holds it
    until every contender has tried."""
    for trial, folder in enumerate(folders):
        start.wait(WAIT_S)
        try:
            with writer_lock(folder) as note:
                results.put((trial, os.getpid(), "won", note or ""))
                tried.wait(WAIT_S)
        except FolderLocked as exc:
            results.put((trial, os.getpid(), "refused", str(exc)))
            tried.wait(WAIT_S)


def _dead_pid() -> int:
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    return int(done.stdout)


@pytest.mark.slow  # 200 trials of forked processes, ~2 s (make test runs it)
def test_a_stale_lock_raced_by_several_starts_has_exactly_one_writer(tmp_path, faults):
    dead = _dead_pid()
    stale = {"pid": dead, "host": socket.gethostname(), "since": "2026-01-01T00:00:00Z"}
    folders: list[Path] = []
    orphans: list[int] = []  # the dead holder's child: an open lock file, still locked
    for trial in range(TRIALS):
        folder = tmp_path / f"out{trial}"
        folder.mkdir()
        (folder / LOCK_FILE).write_text(json.dumps(stale) + "\n")
        if trial % 2:
            fd = os.open(folder / LOCK_FILE, os.O_RDWR)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            orphans.append(fd)
        folders.append(folder)
    ctx = multiprocessing.get_context("fork")  # spawn re-imports torch in each: 20 s, not 2
    start, tried = ctx.Barrier(RACERS), ctx.Barrier(RACERS)
    results = ctx.Queue()
    racers = [
        ctx.Process(target=_racer, args=([str(f) for f in folders], start, tried, results))
        for _ in range(RACERS)
    ]
    try:
        for racer in racers:
            racer.start()
        got = [results.get(timeout=WAIT_S) for _ in range(TRIALS * RACERS)]
    finally:
        for racer in racers:
            racer.join(WAIT_S)
            if racer.is_alive():
                racer.kill()
        for fd in orphans:
            os.close(fd)
    assert all(racer.exitcode == 0 for racer in racers)
    trials = [[r for r in got if r[0] == trial] for trial in range(TRIALS)]
    doubles = [(trial, seen) for trial, seen in enumerate(trials) if _winners(seen) != 1]
    assert not doubles, (
        f"{len(doubles)} of {TRIALS} trials had not exactly one writer: {doubles[:3]}"
    )
    for folder, seen in zip(folders, trials, strict=True):
        (_, pid, _, note), *_ = (r for r in seen if r[2] == "won")
        assert f"from PID {dead} " in note and "gone" in note, note
        faults.add("stale_locks_taken_over")
        for _, _, _, message in (r for r in seen if r[2] == "refused"):
            assert f"PID {pid} on host {socket.gethostname()}" in message, message
            faults.add("two_writers_refused")
        assert read_holder(folder) == {}  # the winner's end cleared its record


def _winners(seen: list[tuple[int, int, str, str]]) -> int:
    return sum(1 for r in seen if r[2] == "won")
