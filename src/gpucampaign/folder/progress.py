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

import json
import os
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpucampaign.folder.layout import CHECK_PROGRESS_FILE, PROGRESS_FILE, RUNS_DIR

WRITE_EVERY_S = 0.5
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


def read_progress(run_dir: str | Path, *, name: str = PROGRESS_FILE) -> dict[str, Any] | None:
    """The run folder's progress record, or None when it has none (or it cannot be read)."""
    try:
        data = json.loads((Path(run_dir) / name).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_all_progress(out: str | Path) -> list[dict[str, Any]]:
    """Every run's progress record in an output folder, the most recently updated last."""
    runs = Path(out) / RUNS_DIR
    found = [
        p
        for d in sorted(runs.glob("*"))
        for name in (PROGRESS_FILE, CHECK_PROGRESS_FILE)
        if (p := read_progress(d, name=name)) is not None
    ]
    return sorted(found, key=lambda r: float(r.get("updated_at") or 0.0))


def say_duration(seconds: float | None) -> str:
    """``'42s'``, ``'3m05s'``, ``'2h07m'``, ``'3d04h'``; ``'?'`` when unknown."""
    if seconds is None or seconds != seconds or seconds < 0:
        return "?"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def render_line(
    record: dict[str, Any], *, ends_at: datetime | None = None, now: datetime | None = None
) -> str:
    """One phase's line, e.g. ``train control  230/460  loss 0.1234  accuracy 0.9611 (step
    207)  85.2 steps/s  ETA 3s  lot 2d03h left``; ``ends_at`` is the rental's end."""
    phase, run = record.get("phase", "train"), record.get("run") or record.get("run_id", "?")
    step, target = record.get("step", 0), record.get("target_steps", record.get("planned_steps"))
    parts = [f"{phase} {run}", f"{step}/{target}"]
    if record.get("phase") == "pilot" and record.get("planned_steps") != target:
        parts[-1] += f" (of {record.get('planned_steps')})"
    loss = record.get("loss")
    parts.append(f"loss {loss:.4f}" if isinstance(loss, int | float) else "loss -")
    metric, value = record.get("metric"), record.get("metric_value")
    if metric:
        at = record.get("metric_step")
        shown = f"{value:.4f} (step {at})" if isinstance(value, int | float) else "- (no eval yet)"
        parts.append(f"{metric} {shown}")
    rate = record.get("steps_per_s")
    parts.append(f"{rate:.1f} steps/s" if isinstance(rate, int | float) else "- steps/s")
    state = record.get("state", "running")
    if state == "running":
        parts.append(f"ETA {say_duration(record.get('eta_s'))}")
    else:
        parts.append(f"{state} in {say_duration(record.get('elapsed_s'))}")
    if ends_at is not None:
        left = (ends_at - (now or datetime.now(UTC))).total_seconds()
        parts.append(f"lot {say_duration(left)} left" if left >= 0 else "lot ended")
    return "  ".join(parts)


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
    asked with ``force``): the loop asks ``due`` at every step and builds a record only then."""

    def __init__(self, run_dir: str | Path, *, every_s: float = WRITE_EVERY_S) -> None:
        self.run_dir = Path(run_dir)
        self.every_s = every_s
        self.last = -float("inf")
        self.record: dict[str, Any] = {}  # the last record written

    def due(self) -> bool:
        """Whether ``update`` would write now without ``force``."""
        return time.monotonic() - self.last >= self.every_s

    def update(self, record: dict[str, Any], *, force: bool = False) -> bool:
        """Write ``record`` when due; returns whether it was written."""
        now = time.monotonic()
        if not force and now - self.last < self.every_s:
            return False
        self.last = now
        self.record = {**record, "updated_at": time.time()}
        try:
            write_progress(self.run_dir, self.record)
        except (OSError, ValueError):
            return False  # a live view is never worth stopping a training for
        return True


def evaluation_table(
    rows: Sequence[dict[str, Any]], *, metric: str | None, planned_steps: int, split: str = "val"
) -> list[dict[str, Any]]:
    """One row per evaluation on ``split`` in a run's ``metrics.jsonl`` rows, oldest first:
    ``step``, ``train_loss`` (of that step), ``metric`` (the decision metric's name),
    ``value`` (its value), ``elapsed`` (training and evaluation time of the run up to that
    evaluation, summed from the recorded step and eval times, so a resumed run keeps counting)
    and ``eta`` (the rest of ``planned_steps`` at the step rate measured then).

    ``elapsed`` and ``eta`` are rendered like ``say_duration``; numbers stay numbers.
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
                    "elapsed": say_duration(spent),
                    "eta": say_duration((planned_steps - step) / rate if rate else None)
                    if step < planned_steps
                    else "done",
                }
            )
    return table
