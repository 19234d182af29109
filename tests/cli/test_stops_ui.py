"""Stops and interruptions read as what they are in the terminal: no Prefect ERROR line for an
interruption (the task Cancelled, the phases waiting on it NotReady), and a log line printed
whole, above the live lines, never glued into the line being redrawn."""

from __future__ import annotations

import io
import logging
import time

from rich.console import Console

from gpucampaign.cli.progress import LiveView
from gpucampaign.cli.runner import ExpectedStops
from gpucampaign.core.interrupt import Interrupted
from gpucampaign.folder.progress import write_progress
from tests.cli.test_watch import campaign_folder, record


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


def test_a_log_line_is_printed_whole_above_the_live_line(tmp_path):
    out = campaign_folder(tmp_path)
    screen, direct = io.StringIO(), io.StringIO()
    logger = logging.getLogger("tests.stops_ui")
    handler = logging.StreamHandler(direct)
    logger.addHandler(handler)
    try:
        view = LiveView(
            out, console=Console(file=screen, width=200, force_terminal=True), live=True
        )
        with view:
            write_progress(out / "runs" / "control-0123456789", record(100))
            view.poll()
            time.sleep(0.2)
            logger.warning("a line of its own")
        # Shown through the live display (which clears its lines first), not written into
        # the line being redrawn.
        assert direct.getvalue() == ""
        assert "a line of its own\n" in screen.getvalue()
        logger.warning("after the live view")  # the handler is as it was
        assert direct.getvalue() == "after the live view\n"
    finally:
        logger.removeHandler(handler)
