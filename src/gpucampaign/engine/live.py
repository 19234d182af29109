"""The live view of a training call, as a hook (``engine/hooks.py``): ``progress.json``
(``folder/progress.py``), the call's ``progress`` callback and the progress bar.

A step never waits for it: at each step it asks whether the file is due (about twice a second)
and builds a record only then, after an evaluation, every ~2% of the run when there is a
``progress`` callback, and at the target. The record's state is ``running``, ``done`` once the
call reached its target, ``stopped`` when anything else ended it. A call that resumes an
interrupted one (its ``in_progress.json`` was left) says so in every record it writes:
``resumed_from`` (the checkpoint's step) and ``checkpoint`` (which one, and when it was saved).
"""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime
from typing import Any

from gpucampaign.config.parts import report_every
from gpucampaign.engine.hooks import Hook, HookArgs, RunView, StopRequest
from gpucampaign.engine.parts import progress_bar
from gpucampaign.folder.layout import checkpoint_step_dir
from gpucampaign.folder.progress import ProgressFile, step_rate


class ProgressHook(Hook):
    """Writes the live record, moves the bar, calls ``progress``."""

    def __init__(self, r: RunView, args: HookArgs) -> None:
        self.r = r
        self.progress = args.progress
        self.show_progress = args.show_progress
        self.every = report_every(r.planned)  # the progress callback's steps: ~2% of the run
        self.file: ProgressFile | None = None  # from the loop's start
        self.bar: Any = None
        self._evaluated = False
        self._due = False
        self._tell = False  # the progress callback's step, nothing else due
        # Built before the loop writes its own mark: one found now is an interrupted call's.
        interrupted = r.run_folder.in_progress.is_file()
        self.resumed = (
            resumed_fields(r, args.restored_meta)
            if interrupted and r.resumed_from is not None
            else {}
        )

    @classmethod
    def for_run(cls, r: RunView, args: HookArgs) -> ProgressHook:
        """Every call has a live view."""
        return cls(r, args)

    def on_start(self) -> StopRequest | None:
        r = self.r
        self.bar = progress_bar(self.show_progress, r.run_id, r.planned, r.step)
        self.file = ProgressFile(r.run_folder.path)
        self.file.update({**live_record(r, loss=None), **self.resumed}, force=True)
        return None

    def after_eval(self, metrics: dict[str, float]) -> StopRequest | None:
        self._evaluated = True  # shown after this step's save
        return None

    def wants_rows(self) -> bool:
        """Due now (after an evaluation, by the clock, at the target): the waiting rows are
        written first, so the record shows the last loss. The ``progress`` callback's steps
        alone (each ~2% of the run) write nothing: the callback gets the record of the rows
        written so far (``after_step``). Written at each of them, the rows and the record cost
        the demo's training calls a tenth of their time or more: 50 writes of the rows and the
        file a run, each 0.4-0.5 ms and leaving the next step about 0.2 ms slower (its caches
        cold), on steps of 0.6 ms."""
        assert self.file is not None  # on_start came first
        step = self.r.step
        self._due = self._evaluated or self.file.due() or step == self.r.target
        self._evaluated = False
        self._tell = self.progress is not None and step % self.every == 0
        return self._due

    def after_step(self) -> StopRequest | None:
        if self._due:
            t0 = time.perf_counter()
            self.report()
            self.r.add_report(time.perf_counter() - t0)
        elif self._tell:
            row = self.r.last_train_row or {}
            self._tell_progress(live_record(self.r, loss=row.get("loss")), row)
        return None

    def next_step(self, step: int) -> int:
        """The target, and each ~2% of the run with a ``progress`` callback: the clock (
        ``next_time``) and an evaluation (any event) make the others due."""
        if self.progress is None:
            return max(self.r.target, step + 1)
        return min(max(self.r.target, step + 1), (step // self.every + 1) * self.every)

    def next_time(self) -> float:
        """When the file is due again (about twice a second)."""
        assert self.file is not None  # on_start came first
        return self.file.last + self.file.every_s

    def report(self) -> None:
        """Show where the run is: the bar, the live file and ``progress`` (every ~2% of the run
        and at the target)."""
        r = self.r
        assert self.file is not None
        row = r.last_train_row or {}
        record = live_record(r, loss=row.get("loss"))
        if self.bar is not None:
            self.bar.update(self.bar.task_ids[0], completed=r.step)
        self.file.update({**record, **self.resumed}, force=True)
        if self.progress is not None and (r.step % self.every == 0 or r.step == r.target):
            self._tell_progress(record, row)

    def _tell_progress(self, record: dict[str, Any], row: dict[str, Any]) -> None:
        """Call ``progress`` with ``record``, the epoch, the learning rate and the fraction."""
        r = self.r
        assert self.progress is not None
        self.progress(
            {**record, "epoch": r.epoch, "lr": row.get("lr", r.lr), "fraction": r.step / r.planned}
        )

    def after_train(self) -> None:
        self._state("done")

    def on_close(self) -> None:
        try:
            if self.file is not None and self.file.record.get("state") != "done":
                self._state("stopped")  # a stop rule, an interruption, an error
        finally:
            if self.file is not None:
                self.file.close()  # the call's last record on disk before the call returns
            if self.bar is not None:
                self.bar.stop()

    def _state(self, state: str) -> None:
        assert self.file is not None
        record = live_record(self.r, loss=self.file.record.get("loss"), state=state)
        self.file.update({**record, **self.resumed}, force=True)


def resumed_fields(r: RunView, meta: dict[str, Any] | None) -> dict[str, Any]:
    """``resumed_from`` and ``checkpoint`` (its folder in the store, and when it was saved)."""
    step = r.resumed_from
    assert step is not None
    where = f"{checkpoint_step_dir(step)} in {r.store.url}/{r.run_id}"
    created = (meta or {}).get("created_unix")
    if isinstance(created, int | float):
        where += f", saved {datetime.fromtimestamp(created, UTC):%Y-%m-%d %H:%M:%S} UTC"
    return {"resumed_from": step, "checkpoint": where}


def live_record(r: RunView, *, loss: float | None, state: str = "running") -> dict[str, Any]:
    """The run's live progress record (``folder/progress.py``): step, loss, the decision
    metric at the last evaluation, the measured rate and the ETA to this call's target."""
    step = r.step
    rate = step_rate(r.step_times)
    rule = r.spec.decision_rule
    metric = rule.metric if rule else None
    at, values = r.last_eval if r.last_eval is not None else (None, {})
    value = values.get(metric) if metric else None
    finite = loss is not None and math.isfinite(loss)
    return {
        "run_id": r.run_id,
        "run": r.run,
        "phase": "pilot" if r.target < r.planned else "train",
        "state": state,
        "step": step,
        "target_steps": r.target,
        "planned_steps": r.planned,
        "loss": loss if finite else None,
        "metric": metric,
        "metric_value": value if value is not None and math.isfinite(value) else None,
        "metric_step": at,
        "steps_per_s": rate,
        "eta_s": (r.target - step) / rate if rate else None,
        "elapsed_s": time.perf_counter() - r.t_call,
    }
