"""Stops and interruptions read as what they are in the terminal: no Prefect ERROR line for an
interruption (the task Cancelled, the phases waiting on it NotReady). That a log line is never
glued into the live line is tests/cli/test_live_line.py's."""

from __future__ import annotations

import logging

from gpucampaign.cli.runner import ExpectedStops
from gpucampaign.core.interrupt import Interrupted


def _record(level: int, msg: str, exc: BaseException | None = None) -> logging.LogRecord:
    info = (type(exc), exc, None) if exc is not None else None
    return logging.LogRecord("prefect.task_runs", level, __file__, 1, msg, None, info)


def test_an_interruption_is_no_prefect_error_line():
    keep = ExpectedStops().filter
    cancelled = (
        "Finished in state Cancelled('interrupted by SIGINT at step 206 (checkpoint saved); "
        "rerun to resume')"
    )
    not_ready = (
        "Finished in state NotReady(\"Upstream task run '01a2' did not reach a 'COMPLETED' "
        'state.", type=PENDING)'
    )
    assert not keep(_record(logging.ERROR, cancelled))
    assert not keep(_record(logging.ERROR, not_ready))
    assert not keep(_record(logging.ERROR, "Task run failed", Interrupted("SIGINT", step=3)))
    crash = "Finished in state Failed('Task run encountered an exception RuntimeError: boom')"
    assert keep(_record(logging.ERROR, crash))  # a real failure stays an ERROR line
