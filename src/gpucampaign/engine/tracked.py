"""The loop's metrics log, also fed to MLflow when tracking is on (``tracking/mlflow.py``).

``track_metrics`` swaps the run's ``metrics.jsonl`` log for one that hands every row to the
run's ``RunTracker`` as well, and puts the MLflow run ID into every checkpoint's meta. Closing
the log (the loop always does, in its ``finally``) ends the MLflow run: FINISHED when the run
completed or its pilot stop was reached, KILLED when a stop was requested (or ``resume:
inference`` ended the run after a cut), FAILED otherwise (a stop rule, an error).
"""

from __future__ import annotations

from typing import Any

from gpucampaign.checkpoint.manager import LoadedCheckpoint
from gpucampaign.engine.setup import LiveRun
from gpucampaign.folder.metrics import MetricsLog
from gpucampaign.folder.runresult import RESULT_FILE
from gpucampaign.tracking import META_KEY, RunTracker


class TrackedLog(MetricsLog):
    """``metrics.jsonl`` whose rows also go to the run's tracker."""

    def __init__(self, r: LiveRun, tracker: RunTracker) -> None:
        log = r.mlog  # its check and batch size go on: the same file, also tracked
        super().__init__(log.path, check=log._check, every=log._every)
        log.close()
        self._r = r
        self.tracker = tracker
        self._interrupted = False

    def _write(self, rows: list[dict[str, Any]]) -> None:
        # Every row goes through here: the deferred train rows (in batches) and the others.
        super()._write(rows)
        for row in rows:
            self.tracker.write(row)
            # A stop request, or `resume: inference` ending the run at its last checkpoint.
            self._interrupted |= row.get("kind") in ("interrupt", "inference_restart")
        if self.tracker.mlflow_run_id is not None:  # read on this thread, by the next save
            self._r.checkpoint_meta[META_KEY] = self.tracker.mlflow_run_id

    def close(self) -> None:
        super().close()
        r = self._r
        if (r.out_dir / RESULT_FILE).exists():
            status = "FINISHED"
        elif self._interrupted:
            status = "KILLED"
        elif r.target < r.planned and r.state.global_step >= r.target:
            status = "FINISHED"  # the pilot's stop: a later call continues the same run
        else:
            status = "FAILED"
        self.tracker.close(status)


def track_metrics(r: LiveRun, ck: LoadedCheckpoint | None) -> None:
    """Track the run in MLflow when tracking is on; nothing otherwise (nor on a data-parallel
    run's other ranks: rank 0 writes the records)."""
    if not r.dist.is_main:
        return
    tracker = RunTracker.for_run(
        r.spec,
        run=r.resolved,
        out_dir=r.out_dir,
        restored_meta=ck.meta if ck is not None else None,
        restored_step=r.state.global_step,
    )
    if tracker is None:
        return
    if tracker.mlflow_run_id is not None:
        r.checkpoint_meta[META_KEY] = tracker.mlflow_run_id
    r.mlog = TrackedLog(r, tracker)
