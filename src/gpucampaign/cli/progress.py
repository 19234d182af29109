"""The live view of a campaign: one line per training phase, read from the output folder.

The training loop writes ``runs/<run_id>/progress.json`` (``folder/progress.py``) wherever it
runs: in the process of ``campaign run``, in a worker's flow-run process, on another host
with the folder. ``LiveView`` reads those files and renders them, so ``campaign run`` and
``campaign watch OUT`` show the same thing: with rich, one live line per running phase, each
printed for good when its phase ends, when a terminal is attached; plain lines otherwise (CI,
a worker's log), a phase's line at most once per ``every_s`` and once when it ends.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from gpucampaign.folder.progress import read_all_progress, render_line, updated_at

PLAIN_EVERY_S = 30.0
POLL_S = 0.25
_ENDED = ("done", "stopped")


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
        self._display: Live | None = None
        self._above: list[tuple[logging.Handler, _LogsAboveLive]] = []

    def _line(self, record: dict[str, Any]) -> str:
        return render_line(record, ends_at=self.ends_at)

    def poll(self) -> None:
        """Read the records once and show what changed."""
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
            if rec.get("state") in _ENDED:
                self.ended.add(key)
                self._print(self._line(rec))
            elif not self.live and now - self.printed_at.get(key, -float("inf")) >= self.every_s:
                self.printed_at[key] = now
                self._print(self._line(rec))
        if self._display is not None:
            running = [r for k, r in self.seen.items() if k not in self.ended]
            self._display.update(Group(*(Text(self._line(r)) for r in running)))

    def _print(self, line: str) -> None:
        target = self._display.console if self._display is not None else self.console
        target.print(line, highlight=False, markup=False, soft_wrap=True)

    def __enter__(self) -> LiveView:
        if self.live:
            self._display = Live(
                Group(), console=self.console, refresh_per_second=8, transient=True
            )
            self._display.start()
            self._above = _LogsAboveLive.install(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.poll()
        if self._display is not None:
            _LogsAboveLive.remove(self._above)
            self._above = []
            self._display.stop()
            self._display = None

    def print_above(self, text: str) -> bool:
        """Print a whole line above the live lines; False when no live display is up."""
        display = self._display
        if display is None:
            return False
        display.console.print(Text(text), highlight=False, soft_wrap=True)
        return True


class _LogsAboveLive(logging.Filter):
    """On a log handler that writes to a stream: while the live lines are shown, a log line is
    printed above them (a whole line of its own) instead of written into the line being
    redrawn."""

    def __init__(self, view: LiveView, handler: logging.Handler) -> None:
        super().__init__()
        self.view, self.handler = view, handler

    def filter(self, record: logging.LogRecord) -> bool:
        """False once the record is printed above the live lines."""
        try:
            return not self.view.print_above(self.handler.format(record))
        except Exception:  # a log line is never lost to the live view
            return True

    @classmethod
    def install(cls, view: LiveView) -> list[tuple[logging.Handler, _LogsAboveLive]]:
        """Put the filter on every stream handler of the loggers in use (Prefect's console
        handlers among them, never its handler that sends logs to the server)."""
        loggers = [logging.getLogger()] + [
            lg
            for lg in logging.Logger.manager.loggerDict.values()
            if isinstance(lg, logging.Logger)
        ]
        done: list[tuple[logging.Handler, _LogsAboveLive]] = []
        for handler in {id(h): h for lg in loggers for h in lg.handlers}.values():
            if isinstance(handler, logging.StreamHandler) and not isinstance(
                handler, logging.FileHandler
            ):
                flt = cls(view, handler)
                handler.addFilter(flt)
                done.append((handler, flt))
        return done

    @staticmethod
    def remove(installed: list[tuple[logging.Handler, _LogsAboveLive]]) -> None:
        """Take the filters ``install`` put back off."""
        for handler, flt in installed:
            handler.removeFilter(flt)


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
