"""The live progress of a training call: ``runs/<run_id>/progress.json``.

The training loop's live view hook (``engine/live.py``) rewrites it about once a second
(``ProgressFile``); anything that can read the output folder renders it: ``campaign run`` in
its own terminal, ``campaign watch OUT`` from another one or another machine with the folder.
One JSON object, replaced atomically (a temp name, then a rename: a reader never sees half of
it), never part of the manifest.

Fields: ``run_id``, ``run``, ``phase`` (``pilot`` when the call stops before its planned
steps, else ``train``), ``step``, ``target_steps``, ``planned_steps``, ``loss``, ``metric``
(the decision metric's name), ``metric_value`` and ``metric_step`` (its value on ``val`` at
the last evaluation), ``steps_per_s`` and ``eta_s`` (from the measured step times of the
recent steps), ``elapsed_s``, ``state`` (``running``; ``done`` once the call reached its
target; ``stopped`` by a stop rule, an interruption or an error), ``updated_at`` (Unix time).
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
import threading
import time
import unicodedata
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpucampaign.core.text import printable
from gpucampaign.folder.layout import CHECK_PROGRESS_FILE, PROGRESS_FILE, RUNS_DIR

WRITE_EVERY_S = 0.5
#: The most bytes of a progress record read (the loop writes a few hundred): a larger file,
#: a FIFO, a device or a link planted in its place is skipped, never read.
MAX_PROGRESS_BYTES = 64 * 1024
#: The most characters of one field shown on a progress line.
MAX_FIELD_CHARS = 80
RECENT_STEPS = 50  # the step times an ETA is measured from: recent, so it follows the machine


def step_rate(step_times: Sequence[float]) -> float | None:
    """Steps per second over the recent measured step times; None before the first step."""
    recent = [t for t in step_times[-RECENT_STEPS:] if t > 0]
    return len(recent) / sum(recent) if recent else None


def write_progress(
    run_dir: str | Path, record: dict[str, Any], *, name: str = PROGRESS_FILE
) -> None:
    """Replace ``run_dir/<name>`` with ``record`` (no fsync: it is rewritten anyway)."""
    path = Path(run_dir) / name
    tmp = path.with_name(f".{name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, allow_nan=False, default=str))
    os.replace(tmp, path)


class ProgressUnreadable(ValueError):
    """A progress file that is not a record the loop writes (why is the message)."""


def load_progress(path: str | Path) -> dict[str, Any] | None:
    """The progress record at ``path``, None when there is none.

    It is opened without following a link and without blocking (a FIFO planted in its place
    never hangs the reader), and read only when it is a regular file of at most
    ``MAX_PROGRESS_BYTES``.

    Raises:
        ProgressUnreadable: The file is not such a record (the message says why).
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ProgressUnreadable("is a link (not followed)") from None
        raise ProgressUnreadable(f"cannot be opened ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ProgressUnreadable("is not a regular file")
        if info.st_size > MAX_PROGRESS_BYTES:
            raise ProgressUnreadable(f"is larger than {MAX_PROGRESS_BYTES} bytes")
        raw = os.read(fd, MAX_PROGRESS_BYTES + 1)
    except OSError as exc:
        raise ProgressUnreadable(f"cannot be read ({exc.strerror})") from None
    finally:
        os.close(fd)
    if len(raw) > MAX_PROGRESS_BYTES:
        raise ProgressUnreadable(f"is larger than {MAX_PROGRESS_BYTES} bytes")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        return None  # being replaced, or torn: the next poll reads it again
    if not isinstance(data, dict):
        raise ProgressUnreadable("is not a JSON object")
    return data


def read_progress(run_dir: str | Path, *, name: str = PROGRESS_FILE) -> dict[str, Any] | None:
    """The run folder's progress record, or None when it has none (or it cannot be read)."""
    try:
        return load_progress(Path(run_dir) / name)
    except ProgressUnreadable:
        return None


def updated_at(record: dict[str, Any]) -> float:
    """A record's ``updated_at`` as a finite number (0 when it is missing or not one)."""
    value = record.get("updated_at")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    value = float(value)
    return value if math.isfinite(value) else 0.0


def read_all_progress(out: str | Path, *, skipped: list[str] | None = None) -> list[dict[str, Any]]:
    """Every run's progress record in an output folder, the most recently updated last.

    A progress file that cannot be a record (a FIFO, a device, a link, an oversized file) is
    left out; ``skipped``, when given, receives one line naming it and why.
    """
    runs = Path(out) / RUNS_DIR
    found = []
    for d in sorted(runs.glob("*")):
        for name in (PROGRESS_FILE, CHECK_PROGRESS_FILE):
            try:
                record = load_progress(d / name)
            except ProgressUnreadable as exc:
                if skipped is not None:
                    where = printable(f"{RUNS_DIR}/{d.name}/{name}")[:200]
                    skipped.append(f"{where} {exc}: left out of the live view")
                continue
            if record is not None:
                found.append(record)
    return sorted(found, key=updated_at)


def say_seconds(seconds: float | None) -> str:
    """``'42s'``, ``'3m05s'``, ``'2h07m'``, ``'3d04h'``; ``'?'`` when unknown."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        return "?"
    if not 0 <= seconds < 1e12:  # NaN, the infinities and integers past a float too
        return "?"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _shown(value: Any) -> str:
    """A record's field as printed: no terminal escape, control or direction-override
    character (the file is anyone's who can write the folder), at most ``MAX_FIELD_CHARS``."""
    text = printable(str(value)[: 4 * MAX_FIELD_CHARS])
    kept = []
    for c in text:
        kind = unicodedata.category(c)
        if kind[0] == "Z":  # separators: a line or paragraph break among them
            kept.append(" ")
        elif kind[0] != "C":  # format (direction overrides), unassigned, private, surrogates
            kept.append(c)
    return "".join(kept)[:MAX_FIELD_CHARS]


def _number(value: Any, spec: str) -> str | None:
    """``value`` formatted with ``spec`` when it is a finite number, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer too large for a float
        return None
    return format(number, spec) if math.isfinite(number) else None


def render_line(
    record: dict[str, Any], *, ends_at: datetime | None = None, now: datetime | None = None
) -> str:
    """One phase's line, e.g. ``train control  230/460  loss 0.1234  accuracy 0.9611 (step
    207)  85.2 steps/s  ETA 3s  lot 2d03h left``; ``ends_at`` is the rental's end. Every
    field is shown without control characters, whatever the file holds."""
    return "  ".join(text for _, text in render_parts(record, ends_at=ends_at, now=now))


def render_parts(
    record: dict[str, Any], *, ends_at: datetime | None = None, now: datetime | None = None
) -> list[tuple[str, str]]:
    """``render_line``'s parts, named (``what``, ``step``, ``loss``, ``metric``, ``rate``,
    ``state``, ``lot``), in their order: a narrow terminal leaves some out."""
    phase = _shown(record.get("phase", "train"))
    run = _shown(record.get("run") or record.get("run_id", "?"))
    step = _shown(record.get("step", 0))
    target = _shown(record.get("target_steps", record.get("planned_steps")))
    steps = f"{step}/{target}"
    if record.get("phase") == "pilot" and _shown(record.get("planned_steps")) != target:
        steps += f" (of {_shown(record.get('planned_steps'))})"
    parts = [("what", f"{phase} {run}"), ("step", steps)]
    loss = _number(record.get("loss"), ".4f")
    parts.append(("loss", f"loss {loss}" if loss is not None else "loss -"))
    metric, value = record.get("metric"), _number(record.get("metric_value"), ".4f")
    if metric:
        at = _shown(record.get("metric_step"))
        shown = f"{value} (step {at})" if value is not None else "- (no eval yet)"
        parts.append(("metric", f"{_shown(metric)} {shown}"))
    rate = _number(record.get("steps_per_s"), ".1f")
    parts.append(("rate", f"{rate} steps/s" if rate is not None else "- steps/s"))
    state = record.get("state", "running")
    if state == "running":
        parts.append(("state", f"ETA {say_seconds(record.get('eta_s'))}"))
    else:
        parts.append(("state", f"{_shown(state)} in {say_seconds(record.get('elapsed_s'))}"))
    if ends_at is not None:
        left = (ends_at - (now or datetime.now(UTC))).total_seconds()
        parts.append(("lot", f"lot {say_seconds(left)} left" if left >= 0 else "lot ended"))
    return parts


def relay_check_progress(workdir: Path, run_dir: Path, *, state: str | None = None) -> None:
    """Copy the newest progress record a restart check's new process wrote under ``workdir``
    to ``run_dir/progress-restart.json`` as phase ``restart-check`` (``state`` overrides its
    state: the end of the check)."""
    found = [p for p in Path(workdir).rglob(PROGRESS_FILE) if p.is_file()]
    newest = max(found, key=lambda p: p.stat().st_mtime, default=None)
    record = read_progress(newest.parent) if newest is not None else None
    previous = read_progress(run_dir, name=CHECK_PROGRESS_FILE) or {}
    if record is None and state is None:
        return
    merged = {**previous, **(record or {}), "phase": "restart-check", "updated_at": time.time()}
    if state is not None:
        merged["state"] = state
    merged.setdefault("run_id", Path(run_dir).name)
    try:
        write_progress(run_dir, merged, name=CHECK_PROGRESS_FILE)
    except (OSError, ValueError):
        return


class ProgressFile:
    """Writes a training call's progress record at most once per ``every_s`` (and always when
    asked with ``force``): the loop asks ``due`` at every step and builds a record only then.

    The writes run on a thread of their own: the loop hands the record over and goes on. A
    write can wait on the disk (its rename behind the journal's commit of the checkpoint just
    saved: 80-330 ms in 3 or 4 of 80 demo calls, where a write takes 0.1 ms), and a live view
    is never worth holding a training step for. Records handed over faster than they are
    written are coalesced: the newest is written. ``flush`` waits until the last one handed
    over is on disk; ``close`` flushes and ends the thread (the call's last record, its
    state, is on disk when the call returns)."""

    def __init__(self, run_dir: str | Path, *, every_s: float = WRITE_EVERY_S) -> None:
        self.run_dir = Path(run_dir)
        self.every_s = every_s
        self.last = -float("inf")
        self.record: dict[str, Any] = {}  # the last record handed over
        self._cond = threading.Condition()
        self._waiting: dict[str, Any] | None = None  # handed over, not yet being written
        self._writing = False
        self._closed = False
        self._thread: threading.Thread | None = None  # started by the first record

    def due(self) -> bool:
        """Whether ``update`` would write now without ``force``."""
        return time.monotonic() - self.last >= self.every_s

    def update(self, record: dict[str, Any], *, force: bool = False) -> bool:
        """Hand ``record`` to the writer when due; returns whether it was handed over."""
        now = time.monotonic()
        if self._closed or (not force and now - self.last < self.every_s):
            return False
        self.last = now
        self.record = {**record, "updated_at": time.time()}
        with self._cond:
            self._waiting = self.record
            self._cond.notify_all()
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._write_each, name=f"progress of {self.run_dir.name}", daemon=True
            )
            self._thread.start()
        return True

    def _write_each(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._waiting is not None or self._closed)
                if self._waiting is None:
                    return  # closed, nothing left to write
                record, self._waiting, self._writing = self._waiting, None, True
            try:
                write_progress(self.run_dir, record)
            except Exception:  # a live view is never worth stopping a training
                pass  # for, nor this thread, which ``flush`` waits on: the next may land
            finally:
                with self._cond:
                    self._writing = False
                    self._cond.notify_all()

    def flush(self) -> None:
        """Wait until the last record handed over is written (or failed to be)."""
        if self._thread is None:
            return
        with self._cond:
            self._cond.wait_for(lambda: self._waiting is None and not self._writing)

    def close(self) -> None:
        """Write what is waiting and end the writer's thread; later updates write nothing."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()


def evaluation_table(
    rows: Sequence[dict[str, Any]], *, metric: str | None, planned_steps: int, split: str = "val"
) -> list[dict[str, Any]]:
    """One row per evaluation on ``split`` in a run's ``metrics.jsonl`` rows, oldest first:
    ``step``, ``train_loss`` (of that step), ``metric`` (the decision metric's name),
    ``value`` (its value), ``elapsed`` (training and evaluation time of the run up to that
    evaluation, summed from the recorded step and eval times, so a resumed run keeps counting)
    and ``eta`` (the rest of ``planned_steps`` at the step rate measured then).

    ``elapsed`` and ``eta`` are rendered like ``say_seconds``; numbers stay numbers.
    """
    table: list[dict[str, Any]] = []
    loss_at: dict[int, float] = {}
    times: list[float] = []
    spent = 0.0
    for row in rows:
        kind = row.get("kind")
        if kind == "train":
            step_s = row.get("step_s")
            if isinstance(step_s, int | float) and step_s > 0:
                times.append(float(step_s))
                spent += float(step_s)
            if isinstance(row.get("loss"), int | float):
                loss_at[int(row.get("step", 0))] = float(row["loss"])
        elif kind == "eval":
            spent += float(row.get("eval_s") or 0.0)
            if row.get("split") != split:
                continue
            step = int(row.get("step", 0))
            rate = step_rate(times)
            value = row.get(metric) if metric else None
            if table and table[-1]["step"] == step:  # the final evaluation of the last step
                table.pop()
            table.append(
                {
                    "step": step,
                    "train_loss": loss_at.get(step),
                    "metric": metric or "",
                    "value": value if isinstance(value, int | float) else None,
                    "elapsed": say_seconds(spent),
                    "eta": say_seconds((planned_steps - step) / rate if rate else None)
                    if step < planned_steps
                    else "done",
                }
            )
    return table
