"""The live view of a campaign: one line per training phase, read from the output folder.

The training loop writes ``runs/<run_id>/progress.json`` (``folder/progress.py``) wherever it
runs: in the process of ``campaign run``, in a worker's flow-run process, on another host
with the folder. ``LiveView`` reads those files and renders them, so ``campaign run`` and
``campaign watch OUT`` show the same thing: with rich, one live line per running phase, each
printed for good when its phase ends, when a terminal is attached; plain lines otherwise (CI,
a worker's log), a phase's line at most once per ``every_s`` and once when it ends.

A live line fits the terminal's width (the parts a narrow one has no room for are left out:
the rate first, then the lot's time, then the metric), so it never wraps; and the live lines
are taken off the screen before any log line is written to the terminal (they come back at
the next poll), so no stale copy of them stays above the log. A run that resumes an
interrupted one says so once: ``resuming RUN from step N (checkpoint ...)``.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from gpucampaign.core import clock
from gpucampaign.core.errors import InputError
from gpucampaign.core.text import printable
from gpucampaign.folder.progress import read_all_progress, render_line, render_parts, updated_at

PLAIN_EVERY_S = 30.0
POLL_S = 0.25
_ENDED = ("done", "stopped")
#: The parts a narrow terminal leaves out of a live line, the first first.
_DROPPED_FIRST = ("goodput", "rate", "lot", "metric", "loss")
#: The campaign's goodput is read from the folder's records at most this often.
GOODPUT_EVERY_S = 15.0


def fit_line(parts: list[tuple[str, str]], width: int) -> str:
    """The parts joined as ``render_line`` joins them, in at most ``width`` characters: the
    parts of ``_DROPPED_FIRST`` left out until it fits, then the end cut (``…``)."""
    kept = list(parts)
    for name in _DROPPED_FIRST:
        if len("  ".join(t for _, t in kept)) <= width:
            break
        kept = [(n, t) for n, t in kept if n != name]
    line = "  ".join(t for _, t in kept)
    return line if len(line) <= width else line[: max(0, width - 1)] + "…"


def resume_line(record: dict[str, Any]) -> str | None:
    """``resuming RUN from step N (checkpoint ...)`` for a record of a resumed call, else None."""
    step = record.get("resumed_from")
    if isinstance(step, bool) or not isinstance(step, int):
        return None
    run = printable(str(record.get("run") or record.get("run_id", "?")))[:80]
    where = printable(str(record.get("checkpoint") or ""))[:300]
    return f"resuming {run} from step {step}" + (f" (checkpoint {where})" if where else "")


def _key(record: dict[str, Any]) -> tuple[str, str]:
    return (str(record.get("run_id")), str(record.get("phase")))


class LiveView:
    """Renders the progress records of an output folder, newer than ``since``.

    Args:
        out: The output folder.
        console: Where the lines go (a terminal gets rich's live lines).
        ends_at: The rental's end (lots with ``starts_at``), shown as the time left.
        every_s: Plain mode: the most often a running phase's line is repeated.
        since: Unix time; older records (an earlier campaign run) are not shown.
        live: Force the rich live display on or off (default: when ``console`` is a terminal).
    """

    def __init__(
        self,
        out: str | Path,
        *,
        console: Console,
        ends_at: datetime | None = None,
        every_s: float = PLAIN_EVERY_S,
        since: float = 0.0,
        live: bool | None = None,
    ) -> None:
        self.out = Path(out)
        self.console = console
        self.ends_at = ends_at
        self.every_s = every_s
        self.since = since
        self.live = console.is_terminal if live is None else live
        self.seen: dict[tuple[str, str], dict[str, Any]] = {}
        self.printed_at: dict[tuple[str, str], float] = {}
        self.ended: set[tuple[str, str]] = set()
        self.skipped: set[str] = set()  # the unreadable progress files already named
        self.resumed: set[str] = set()  # the run IDs whose resume was said
        self._display: Live | None = None
        self._entered = False
        self._lock = threading.RLock()  # the display, between the poller and log lines
        self._handlers: list[logging.Handler] = []
        self._goodput: tuple[float, str | None] = (-float("inf"), None)

    def _goodput_part(self) -> list[tuple[str, str]]:
        """``goodput N%``: the campaign's so far, read again every ``GOODPUT_EVERY_S`` (the
        timeline and the runs' metrics are read whole), nothing before its plan is written."""
        at, text = self._goodput
        if clock.monotonic() - at >= GOODPUT_EVERY_S:
            # the close's modules load at the first line, not with the live view
            from gpucampaign.close.goodput import live_goodput

            try:
                g = live_goodput(self.out)
            except (InputError, OSError):  # a folder being written: the next read says it
                g = None
            share = None if g is None else g["goodput"]
            text = None if share is None else f"goodput {100 * share:.3g}%"
            self._goodput = (clock.monotonic(), text)
        return [] if text is None else [("goodput", text)]

    def _line(self, record: dict[str, Any]) -> str:
        return "  ".join(
            [render_line(record, ends_at=self.ends_at), *(t for _, t in self._goodput_part())]
        )

    def _live_line(self, record: dict[str, Any]) -> str:
        # One column short of the width: a line that fills it leaves some terminals' cursor
        # past the edge, and the next redraw a row lower.
        parts = render_parts(record, ends_at=self.ends_at) + self._goodput_part()
        return fit_line(parts, self.console.width - 1)

    def poll(self) -> None:
        """Read the records once and show what changed."""
        with self._lock:
            self._poll()

    def _poll(self) -> None:
        now = time.monotonic()
        skipped: list[str] = []
        records = read_all_progress(self.out, skipped=skipped)
        for line in skipped:
            if line not in self.skipped:
                self.skipped.add(line)
                self._print(f"note: {line}")
        for rec in records:
            key = _key(rec)
            if updated_at(rec) < self.since or key in self.ended:
                continue
            if self.seen.get(key) == rec:
                continue
            self.seen[key] = rec
            said = resume_line(rec)
            if said is not None and key[0] not in self.resumed:
                self.resumed.add(key[0])
                self._print(said)
            if rec.get("state") in _ENDED:
                self.ended.add(key)
                self._print(self._line(rec))
            elif not self.live and now - self.printed_at.get(key, -float("inf")) >= self.every_s:
                self.printed_at[key] = now
                self._print(self._line(rec))
        running = [r for k, r in self.seen.items() if k not in self.ended]
        if self._entered and self.live and running and self._display is None:
            self._show()  # again, after a log line took it off
        if self._display is not None:
            self._display.update(Group(*(Text(self._live_line(r)) for r in running)))

    def _print(self, line: str) -> None:
        target = self._display.console if self._display is not None else self.console
        target.print(line, highlight=False, markup=False, soft_wrap=True)

    def _show(self) -> None:
        self._display = Live(Group(), console=self.console, refresh_per_second=8, transient=True)
        self._display.start()

    def _hide(self) -> None:
        """Take the live lines off the screen (transient: erased, the cursor where they began)."""
        if self._display is not None:
            self._display.stop()
            self._display = None

    def _before_log(self, emit: Callable[[logging.LogRecord], None]) -> Callable[..., None]:
        def emit_below_nothing(record: logging.LogRecord) -> None:
            with self._lock:
                self._hide()
                emit(record)

        return emit_below_nothing

    def __enter__(self) -> LiveView:
        with self._lock:
            self._entered = True
            if self.live:
                # Before the display starts: it replaces sys.stderr while it shows.
                for handler in _terminal_handlers():
                    handler.emit = self._before_log(handler.emit)  # type: ignore[method-assign]
                    self._handlers.append(handler)
                self._show()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._poll()
            self._hide()
            self._entered = False
            for handler in self._handlers:
                vars(handler).pop("emit", None)  # the class's own emit again
            self._handlers.clear()


def _terminal_handlers() -> list[logging.Handler]:
    """The logging handlers that write to this process's stdout or stderr (Prefect's console
    handler among them), on the root logger and every named one."""
    streams = {id(s) for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)}
    loggers = [logging.getLogger()] + [
        lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)
    ]
    found: list[logging.Handler] = []
    for lg in loggers:
        for h in lg.handlers:
            if isinstance(h, logging.StreamHandler) and id(h.stream) in streams:
                if h not in found and "emit" not in vars(h):
                    found.append(h)
    return found


def follow(view: LiveView, *, until: Callable[[], bool], poll_s: float = POLL_S) -> None:
    """Poll ``view`` until ``until()`` is true (checked after each poll)."""
    with view:
        while True:
            view.poll()
            if until():
                return
            time.sleep(poll_s)


class Background:
    """``LiveView`` polled on a daemon thread while the campaign runs in this process."""

    def __init__(self, view: LiveView, *, poll_s: float = POLL_S) -> None:
        self.view, self.poll_s = view, poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="campaign-progress", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.view.poll()
            except Exception:  # a live view never stops a campaign
                continue

    def __enter__(self) -> Background:
        self.view.__enter__()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.view.__exit__(*exc)
