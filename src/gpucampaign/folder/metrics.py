"""A run's ``metrics.jsonl``: the rows a training call writes, and their reader.

Each row has a ``kind``: ``train`` (step, epoch, loss, lr, step_s, samples_per_s), ``eval``
(split, the metrics, eval_s, final), ``checkpoint`` (step, costs, interval) or ``restore``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpucampaign.core.files import jsonl_lines, read_jsonl, write_jsonl

# A training step's row, written at every step: its fields (``engine/loop.py``'s) and its
# JSON line, the bytes ``jsonl_line`` writes for it (keys sorted, floats by ``float.__repr__``),
# without the encoder's work per key; any other row, or a value of another kind, goes to it.
TRAIN_FIELDS = frozenset(("kind", "step", "epoch", "lr", "step_s", "samples_per_s", "loss"))
_INF = float("inf")

if TYPE_CHECKING:  # torch is imported where values are fetched: the CLI's readers of a
    # folder (`--help`, `status`, `verify`) do not pay its import (about 1.3 s a process)
    import torch

_repr = float.__repr__


def metrics_lines(rows: list[dict[str, Any]]) -> str:
    """The JSONL lines of ``rows``: ``jsonl_lines(rows)``, the same bytes (a train row whose
    numbers are finite floats and ints by a template: its floats' text is most of its cost)."""
    lines: list[str] = []
    for row in rows:
        if row.keys() == TRAIN_FIELDS and row["kind"] == "train":
            step, epoch = row["step"], row["epoch"]
            loss, lr, step_s, rate = row["loss"], row["lr"], row["step_s"], row["samples_per_s"]
            if (
                type(step) is int
                and type(epoch) is int
                and type(loss) is float
                and type(lr) is float
                and type(step_s) is float
                and type(rate) is float
                and -_INF < loss + lr + step_s + rate < _INF  # each finite (and no NaN)
            ):
                lines.append(
                    f'{{"epoch": {epoch}, "kind": "train", "loss": {_repr(loss)}, '
                    f'"lr": {_repr(lr)}, "samples_per_s": {_repr(rate)}, "step": {step}, '
                    f'"step_s": {_repr(step_s)}}}\n'
                )
                continue
        lines.append(jsonl_lines([row]))
    return "".join(lines)


class MetricsLog:
    """Append-only ``metrics.jsonl``; floats are written exactly (a read gives them back).

    A row can wait (``defer``) with some of its values still on the device (a step's loss): it
    is written at the next flush, its values fetched with every other waiting row's in one
    transfer, so the training loop never waits for the device at a step. A row given to
    ``write`` while rows wait waits behind them: the file's rows keep the order they were given
    in.

    The training loop flushes itself (``fetch``, its hooks' check of each row, ``write_rows``)
    and hands the rows written to its hooks (``take_written``); nothing here calls a hook.

    Args:
        path: The file.
        check: Called by ``flush`` with each row once its values are fetched, before it is
            written; when it raises, the rows before it are written, it and the rest are
            dropped.
        every: The log is ``full`` once this many rows wait.
        flush_when_full: ``defer`` flushes a full log itself (else the caller flushes when
            ``full``: the training loop, which checks each row first).
        through_step: A resume's step: the rows of later steps are dropped from the file
            before it opens (``truncate_metrics``); None keeps every row.
    """

    def __init__(
        self,
        path: Path,
        *,
        check: Callable[[dict[str, Any]], None] | None = None,
        every: int = 1,
        flush_when_full: bool = True,
        through_step: int | None = None,
    ) -> None:
        self.path = path
        if through_step is not None:  # a resume: the rows after its step go first
            truncate_metrics(path, through_step=through_step)
        self._f = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()
        self._check = check
        self._auto = flush_when_full
        self._every = max(1, every)
        # The rows waiting, in order; each deferred value as its row and key, and the values
        # (detached) in the same order: one stack of them at the fetch, nothing per row.
        self._waiting: list[dict[str, Any]] = []
        self._slots: list[tuple[dict[str, Any], str]] = []
        self._values: list[torch.Tensor] = []
        self._written: list[dict[str, Any]] = []  # written and not taken yet (take_written)
        self.last_deferred: dict[str, Any] | None = None  # the last deferred row written
        self.full = False  # as many rows wait as may (``every``)

    def defer(self, row: dict[str, Any], **values: torch.Tensor) -> None:
        """Queue ``row``; each of ``values`` (a scalar tensor, detached here) becomes its field
        of that name at the next flush."""
        for key, value in values.items():
            self._slots.append((row, key))
            self._values.append(value.detach())
        self._queue(row)
        if self._auto and self.full:
            self.flush()

    def defer_value(self, row: dict[str, Any], key: str, value: torch.Tensor) -> None:
        """``defer(row, key=value)`` in fewer Python calls (the training loop's, at every step;
        it flushes a full log itself)."""
        self._slots.append((row, key))
        self._values.append(value.detach())
        waiting = self._waiting
        waiting.append(row)
        self.full = len(waiting) >= self._every
        if self._auto and self.full:
            self.flush()

    def _queue(self, row: dict[str, Any]) -> None:
        self._waiting.append(row)
        # An attribute, not a property: the loop reads it at every step.
        self.full = len(self._waiting) >= self._every

    @property
    def waiting(self) -> int:
        """Rows deferred and not written yet."""
        return len(self._waiting)

    def fetch(self) -> list[dict[str, Any]]:
        """The waiting rows, their values fetched (one transfer), taken off the queue: the
        caller writes those it keeps (``write_rows``)."""
        if not self._waiting:
            return []
        rows, self._waiting = self._waiting, []
        self.full = False
        if self._values:
            import torch  # already loaded by whoever deferred a tensor

            slots, values = self._slots, self._values
            self._slots, self._values = [], []
            # Each row its own dict, given to defer: filled in place, in the order given.
            for (row, key), value in zip(slots, torch.stack(values).tolist(), strict=True):
                row[key] = value
        return rows

    def flush(self) -> None:
        """Fetch the waiting rows' values (one transfer), check and write them."""
        rows = self.fetch()
        good = rows
        try:
            for i, row in enumerate(rows):
                good = rows[:i]
                if self._check is not None:
                    self._check(row)
            good = rows
        finally:
            self.write_rows(good)

    def write(self, row: dict[str, Any]) -> None:
        """Append one row: at once when none waits, else behind the waiting ones (flushed, not
        fsynced: ``sync`` before a checkpoint commits)."""
        if self._waiting:
            self._queue(row)
        else:
            self._write([row])

    def write_rows(self, rows: list[dict[str, Any]]) -> None:
        """Append rows already fetched (``fetch``), in order."""
        self._write(rows)
        for row in reversed(rows):  # the last train row: usually the last row
            if row.get("kind") == "train":
                self.last_deferred = row
                break

    def _write(self, rows: list[dict[str, Any]]) -> None:
        if rows:
            self._f.write(metrics_lines(rows))
            self._f.flush()
            self._written.extend(rows)

    def take_written(self) -> list[dict[str, Any]]:
        """The rows written since the last call, in order (the loop hands them to its hooks)."""
        if not self._written:
            return []
        rows, self._written = self._written, []
        return rows

    def sync(self) -> None:
        """Make every row given so far durable (the waiting ones flushed first)."""
        self.flush()
        os.fsync(self._f.fileno())

    def sync_later(self) -> Callable[[], None]:
        """``sync``'s flush now, its fsync handed back: a call that makes the rows given so far
        durable from another thread (a background save, before it commits), on a descriptor of
        its own, so the file may be closed meanwhile; the call closes it."""
        self.flush()
        fd = os.dup(self._f.fileno())

        def durable() -> None:
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

        return durable

    def close(self) -> None:
        """Flush the waiting rows and close the file (closed even when the flush raises); a
        second call does nothing."""
        if self._f.closed:
            return
        try:
            self.flush()
        finally:
            self._f.close()

    @property
    def closed(self) -> bool:
        return self._f.closed


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All rows of a ``metrics.jsonl`` (empty list when absent)."""
    return read_jsonl(path)


def truncate_metrics(path: Path, *, through_step: int) -> None:
    """Keep only rows of steps <= ``through_step`` (a resume continues from there)."""
    write_jsonl(path, [r for r in read_metrics(path) if r.get("step", 0) <= through_step])
