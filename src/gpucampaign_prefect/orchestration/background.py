"""The UI's calls beside a training, never in its way: the artifacts and tags that show a
training in the Prefect UI are API round trips, made on a thread of their own, in order, so the
first training step does not wait for them and no step waits between two of them."""

from __future__ import annotations

import contextvars
import functools
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class UiCalls:
    """Calls run one after another on a daemon thread, in the Prefect context of the code that
    made this object (an artifact made there belongs to that flow or task run).

    A call that raises is logged (debug) and the next one runs: the UI's view is never a
    reason to fail a phase.
    """

    def __init__(self, name: str) -> None:
        self._context = contextvars.copy_context()
        self._calls: queue.SimpleQueue[Callable[[], Any] | None] = queue.SimpleQueue()
        self._closed = False
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> None:
        """Run ``fn(*args, **kwargs)`` after the calls submitted before it."""
        if not self._closed:
            self._calls.put(functools.partial(fn, *args, **kwargs))

    def drain(self, *, timeout_s: float) -> bool:
        """Wait until the calls submitted so far have run; False after ``timeout_s``.

        The embedded Prefect server keeps its database in SQLite, which takes one writer at a
        time: a write of the UI's that overlaps the GPU lock's release or its next acquisition
        makes that call fail with 503, and Prefect retries it about 2 s later. The lock's
        callers drain their UI calls before those calls.
        """
        if self._closed:
            self._thread.join(timeout_s)
            return not self._thread.is_alive()
        done = threading.Event()
        self.submit(done.set)
        return done.wait(timeout_s)

    def close(self, *, timeout_s: float) -> bool:
        """Run what was submitted, then end the thread; False when that took longer than
        ``timeout_s`` (the rest is left to the thread, which the process does not wait for)."""
        if not self._closed:
            self._closed = True
            self._calls.put(None)
        self._thread.join(timeout_s)
        done = not self._thread.is_alive()
        if not done:
            log.warning(
                "%s: the Prefect API did not take the UI's last updates within %.0f s; "
                "training is not affected",
                self._thread.name,
                timeout_s,
            )
        return done

    def _work(self) -> None:
        while (call := self._calls.get()) is not None:
            try:
                self._context.run(call)
            except Exception as exc:
                log.debug("%s: %s", self._thread.name, exc)
