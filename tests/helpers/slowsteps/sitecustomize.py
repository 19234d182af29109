"""Imported at the start of every Python process whose path holds this folder (the ranks of a
data-parallel run, which the test cannot reach otherwise): with ``GPUCAMPAIGN_TEST_STEP_SLEEP_S``
set, each training step's metrics row waits that long, so a signal can land mid-run. The
numbers of the run do not change."""

import os

_SLEEP = float(os.environ.get("GPUCAMPAIGN_TEST_STEP_SLEEP_S") or 0)
if _SLEEP > 0:
    import time

    from gpucampaign.folder import metrics

    _write = metrics.MetricsLog.write

    def _slow_write(self, row):  # type: ignore[no-untyped-def]
        if row.get("kind") == "train":
            time.sleep(_SLEEP)
        return _write(self, row)

    metrics.MetricsLog.write = _slow_write  # type: ignore[method-assign]
