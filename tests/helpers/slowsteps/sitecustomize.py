"""Imported at the start of every Python process whose path holds this folder (the ranks of a
data-parallel run, which the test cannot reach otherwise): with ``GPUCAMPAIGN_TEST_STEP_SLEEP_S``
set, each training step's metrics row waits that long when it is queued (``defer``), so a signal
can land mid-run. The numbers of the run do not change."""

import os

_SLEEP = float(os.environ.get("GPUCAMPAIGN_TEST_STEP_SLEEP_S") or 0)
if _SLEEP > 0:
    import time

    from gpucampaign.folder import metrics

    _defer = metrics.MetricsLog.defer

    def _slow_defer(self, row, **values):  # type: ignore[no-untyped-def]
        if row.get("kind") == "train":
            time.sleep(_SLEEP)
        return _defer(self, row, **values)

    metrics.MetricsLog.defer = _slow_defer  # type: ignore[method-assign]
