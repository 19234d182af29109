"""The MLflow tracker of a training call, as a hook (``engine/hooks.py``; ``tracking/``).

Every row written to the run's ``metrics.jsonl`` goes to the run's ``RunTracker`` as well, and
the MLflow run ID goes into every checkpoint's meta. When the call ends (``on_close``) the MLflow
run ends: FINISHED when the run completed or its pilot stop was
reached, KILLED when a stop was requested (or ``resume: inference`` ended the run after a cut),
FAILED otherwise (a stop rule, an error). Only rank 0 of a data-parallel run tracks.
"""

from __future__ import annotations

from typing import Any

from gpucampaign.engine.hooks import Hook, HookArgs, RunView
from gpucampaign.tracking import META_KEY, RunTracker


class Tracker(Hook):
    """The hook that hands a call's ``metrics.jsonl`` rows to its ``RunTracker``."""

    def __init__(self, r: RunView, tracker: RunTracker) -> None:
        self.r = r
        self.tracker = tracker
        self._interrupted = False

    @classmethod
    def for_run(cls, r: RunView, args: HookArgs) -> Tracker | None:
        """The started tracker of this call, or None when tracking is off (or on a
        data-parallel run's other ranks: rank 0 writes the records)."""
        if not r.dist.is_main:
            return None
        tracker = RunTracker.for_run(
            r.spec,
            run=r.resolved,
            run_folder=r.run_folder,
            restored_meta=args.restored_meta,
            restored_step=r.step,
        )
        if tracker is None:
            return None
        if tracker.mlflow_run_id is not None:
            r.put_checkpoint_meta(META_KEY, tracker.mlflow_run_id)
        return cls(r, tracker)

    def on_rows(self, rows: list[dict[str, Any]]) -> None:
        # Every row: the deferred train rows (in batches) and the others.
        for row in rows:
            self.tracker.write(row)
            # A stop request, or `resume: inference` ending the run at its last checkpoint.
            self._interrupted |= row.get("kind") in ("interrupt", "inference_restart")
        if self.tracker.mlflow_run_id is not None:  # read on this thread, by the next save
            self.r.put_checkpoint_meta(META_KEY, self.tracker.mlflow_run_id)

    def on_close(self) -> None:
        r = self.r
        if r.run_folder.result.exists():
            status = "FINISHED"
        elif self._interrupted:
            status = "KILLED"
        elif r.target < r.planned and r.step >= r.target:
            status = "FINISHED"  # the pilot's stop: a later call continues the same run
        else:
            status = "FAILED"
        self.tracker.close(status)
