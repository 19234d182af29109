"""Imported at the start of every Python process whose path holds this folder (the ranks of a
data-parallel run, which the test cannot reach otherwise): with ``GPUCAMPAIGN_TEST_STEP_SLEEP_S``
set, each training step's metrics row waits that long when it is queued (``defer``, or
``defer_value``: the loop's), so a signal
can land mid-run. With ``GPUCAMPAIGN_TEST_STEP_SLEEP_FILE`` also set, the wait is read from that
file at each step (while it holds a number), so a test ends the slowness of a running process
once what it needed the slowness for is seen. The numbers of the run do not change."""

import os

_SLEEP = float(os.environ.get("GPUCAMPAIGN_TEST_STEP_SLEEP_S") or 0)
_SLEEP_FILE = os.environ.get("GPUCAMPAIGN_TEST_STEP_SLEEP_FILE")


def _sleep_s() -> float:
    if _SLEEP_FILE:
        try:
            with open(_SLEEP_FILE) as f:
                return float(f.read().strip())
        except (OSError, ValueError):
            pass
    return _SLEEP


if _SLEEP > 0:
    import time

    from gpucampaign.folder import metrics

    _defer = metrics.MetricsLog.defer

    def _slow_defer(self, row, **values):  # type: ignore[no-untyped-def]
        if row.get("kind") == "train":
            time.sleep(_sleep_s())
        return _defer(self, row, **values)

    _defer_value = metrics.MetricsLog.defer_value

    def _slow_defer_value(self, row, key, value):  # type: ignore[no-untyped-def]
        if row.get("kind") == "train":
            time.sleep(_sleep_s())
        return _defer_value(self, row, key, value)

    metrics.MetricsLog.defer = _slow_defer  # type: ignore[method-assign]
    metrics.MetricsLog.defer_value = _slow_defer_value  # type: ignore[method-assign]
