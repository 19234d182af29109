"""Child process of the kill tests: train the control run of a spec and SIGKILL itself at the
Nth call of one chosen point, given as ``FAULT_KILL=<point>:<N>`` (no variable: no kill).

Usage: ``python tests/helpers/killrun.py BASE`` where ``BASE/spec.json`` holds the spec and the
campaign layout is ``BASE/out/{checkpoints, runs/<run_id>}``. Prints one JSON line when it
finishes.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path


def die() -> None:
    """SIGKILL: no handler, no cleanup, no flush; exactly what a lost machine does."""
    os.kill(os.getpid(), signal.SIGKILL)


class Countdown:
    """Calls ``die`` on the Nth ``tick``."""

    def __init__(self, n: int) -> None:
        self.left = n

    def tick(self) -> None:
        self.left -= 1
        if self.left == 0:
            die()


def wait_for(path: Path, *, timeout_s: float = 60.0) -> None:
    """Wait until ``path`` exists: a save written in the background has committed."""
    import time

    deadline = time.monotonic() + timeout_s
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.01)


def install(point: str, n: int, *, latest: Path) -> None:
    """Wrap the function that ``point`` names so the process dies at its Nth call."""
    from gpucampaign.checkpoint import manager as checkpoint
    from gpucampaign.checkpoint import tensorfiles
    from gpucampaign.folder import layout, metrics
    from gpucampaign.storage import base as storage

    count = Countdown(n)
    if point == "train-step":
        # Mid-epoch, after the first save: at the Nth train row as the rows are written. The
        # loop defers train rows (their losses stay on the device) and writes them in batches:
        # the rows before the Nth are written, then the process dies, so the file has trained
        # through step N-1 when it dies, as a kill between two steps leaves it.
        write_rows = metrics.MetricsLog._write

        def rows_then_die(self, rows):
            for i, row in enumerate(rows):
                if row.get("kind") == "train":
                    if count.left == 1:  # die mid-epoch once the first save has committed
                        write_rows(self, rows[:i])
                        wait_for(latest)
                    count.tick()
            return write_rows(self, rows)

        metrics.MetricsLog._write = rows_then_die
    elif point == "inside-write":  # half a buffer written, no fsync, no rename
        # N counts checkpoint files (model, state, meta of each save), not chunks: how many
        # chunks a file takes depends on how it is written (torch.save streams many). The model
        # and state files of one save are written at once by two threads, so their chunks
        # interleave: a file is counted when its first chunk arrives, whatever came before.
        import threading

        write_all = tensorfiles._write_all
        seen: list[object] = []  # the file objects met so far, kept alive so ids stay unique
        lock = threading.Lock()

        def half_then_die(f, chunk):
            with lock:
                if not any(f is s for s in seen):
                    seen.append(f)
                    if count.left == 1:
                        f.write(chunk[: max(1, len(chunk) // 2)])
                    count.tick()
            return write_all(f, chunk)

        tensorfiles._write_all = half_then_die
    elif point == "after-rename":  # the step folder is in place, LATEST not moved yet
        verify = checkpoint.CheckpointManager._verify_stored

        def verified_then_die(self, *args, **kwargs):
            verify(self, *args, **kwargs)
            count.tick()

        checkpoint.CheckpointManager._verify_stored = verified_then_die
    elif point == "inside-latest":  # LATEST's temp file written and fsynced, not renamed
        replace = os.replace

        def replace_or_die(src, dst, *args, **kwargs):
            if Path(dst).name == layout.CHECKPOINT_LATEST:
                count.tick()
            return replace(src, dst, *args, **kwargs)

        os.replace = replace_or_die
    elif point == "prune":  # one file of an old checkpoint deleted, the rest still there
        delete = storage.LocalStore.delete

        def deleted_then_die(self, key):
            delete(self, key)
            count.tick()

        storage.LocalStore.delete = deleted_then_die
    elif point == "restore":  # while the checkpoint is being read back
        load = checkpoint.CheckpointManager.load

        def die_in_load(self, *args, **kwargs):
            count.tick()
            return load(self, *args, **kwargs)

        checkpoint.CheckpointManager.load = die_in_load
    else:
        raise SystemExit(f"unknown kill point {point!r}")


def main(base: Path) -> None:
    from gpucampaign.config import parse_spec
    from gpucampaign.data.corpus import load_corpus
    from gpucampaign.engine.loop import train_run
    from gpucampaign.folder.layout import RunFolder
    from gpucampaign.storage import LocalStore

    spec = parse_spec(json.loads((base / "spec.json").read_text(encoding="utf-8")))
    kill = os.environ.get("FAULT_KILL")
    if kill:
        point, _, n = kill.partition(":")
        latest = base / "out" / "checkpoints" / spec.resolve_run("control").run_id / "LATEST"
        install(point, int(n), latest=latest)
    corpus = load_corpus(base / spec.corpus.path, corpus_spec=spec.corpus)
    res = train_run(
        spec,
        run=spec.resolve_run("control"),
        corpus=corpus,
        store=LocalStore(base / "out" / "checkpoints"),
        run_folder=RunFolder.of(base / "out", spec.resolve_run("control").run_id),
    )
    print(json.dumps({"steps_done": res.steps_done, "resumed_from_step": res.resumed_from_step}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
