"""Graceful interruption: a process-wide stop request, set by SIGINT or SIGTERM.

A signal handler only records the request; the training loop reads it at its next step
boundary, saves a checkpoint and raises ``Interrupted``. The first signal also arms a grace
timer: when the process has not finished stopping by then, it ends anyway (after the force
callbacks, which stop the child processes). A second Ctrl-C ends the process at once.

Signal handlers run in the main thread; the work runs in any thread: the request is a plain
flag under a lock, read without waiting.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

DEFAULT_GRACE_S = 20.0
#: The conventional exit codes of a process ended by a signal: 128 + the signal number.
EXIT_CODES: dict[str, int] = {"SIGINT": 130, "SIGTERM": 143}


class _Pending:
    """The pending stop request's reason (None: none), an attribute a loop reads at every step
    without a call (``PENDING.reason``); ``request_stop`` and ``clear_stop`` set it."""

    __slots__ = ("reason",)

    def __init__(self) -> None:
        self.reason: str | None = None


_lock = threading.Lock()
#: The stop request of this process (``stop_requested()`` returns its reason).
PENDING = _Pending()
_grace_s: float = DEFAULT_GRACE_S
_force_callbacks: list[Callable[[], None]] = []
_timer: threading.Timer | None = None
_depth = 0  # graceful_signals blocks active in the main thread


class Interrupted(Exception):
    """The work stopped on request, after saving what it could.

    Attributes:
        reason: ``SIGINT``, ``SIGTERM`` or another short word (``cancelled``).
        step: The last step saved, when a training run stopped.
    """

    def __init__(self, reason: str, *, step: int | None = None, detail: str = "") -> None:
        self.reason = reason
        self.step = step
        text = f"interrupted by {reason}"
        if step is not None:
            text += f" at step {step} (checkpoint saved)"
        super().__init__(f"{text}: {detail}" if detail else text)

    @property
    def exit_code(self) -> int:
        """130 for SIGINT, 143 for SIGTERM, 1 otherwise."""
        return exit_code(self.reason)

    def __reduce__(self) -> tuple[Any, ...]:
        # Prefect pickles task exceptions into their states: keep the keyword argument.
        return (_rebuild, (self.reason, self.step, str(self)))


def _rebuild(reason: str, step: int | None, text: str) -> Interrupted:
    exc = Interrupted(reason, step=step)
    exc.args = (text,)
    return exc


def exit_code(reason: str) -> int:
    """The exit code for a stop ``reason``: 130 (SIGINT), 143 (SIGTERM), else 1."""
    return EXIT_CODES.get(reason, 1)


def request_stop(reason: str) -> None:
    """Ask the running work to stop at its next safe point (the first reason is kept)."""
    with _lock:
        if PENDING.reason is None:
            PENDING.reason = reason


def stop_requested() -> str | None:
    """The reason of the pending stop request, or None."""
    return PENDING.reason


def clear_stop() -> None:
    """Forget the stop request and disarm the grace timer (a new start of the work)."""
    global _timer
    with _lock:
        PENDING.reason = None
        if _timer is not None:
            _timer.cancel()
            _timer = None


def raise_if_stopped(*, what: str = "") -> None:
    """Raise ``Interrupted`` when a stop was requested: work not yet started stays undone.

    Raises:
        Interrupted: A stop request is pending.
    """
    reason = PENDING.reason
    if reason is not None:
        raise Interrupted(reason, detail=f"{what} not started" if what else "")


def on_force(callback: Callable[[], None]) -> None:
    """Call ``callback`` before the process ends without finishing its stop (grace or 2nd ^C)."""
    with _lock:
        _force_callbacks.append(callback)


def _force_exit(reason: str, message: str) -> None:
    """Run the force callbacks and end the process now, with the reason's exit code."""
    sys.stderr.write(f"\n{message}\n")
    sys.stderr.flush()
    for callback in list(_force_callbacks):
        with contextlib.suppress(Exception):
            callback()
    os._exit(exit_code(reason))


def _handle(signum: int, frame: Any) -> None:
    """The signal handler: record the request, arm the grace timer; a 2nd SIGINT ends now."""
    global _timer
    name = signal.Signals(signum).name
    if PENDING.reason is not None:
        if name == "SIGINT":
            _force_exit(name, "second Ctrl-C: stopping now, without waiting for a checkpoint")
        return
    request_stop(name)
    sys.stderr.write(
        f"\n{name} received: saving a checkpoint at the next step boundary, then stopping "
        f"(at most {_grace_s:g} s; press Ctrl-C again to stop at once)\n"
    )
    sys.stderr.flush()
    with _lock:
        if _timer is None:
            _timer = threading.Timer(
                _grace_s,
                _force_exit,
                args=(
                    name,
                    f"{name}: not stopped within the grace of {_grace_s:g} s; "
                    "ending now (the last saved checkpoint is kept)",
                ),
            )
            _timer.daemon = True
            _timer.start()


def handled_outside() -> bool:
    """Whether an outer ``graceful_signals`` (``campaign run``'s) also handles the signals:
    the process is ours, and a SIGTERM is a stop request rather than an end to pass on."""
    return _depth > 1


@contextlib.contextmanager
def graceful_signals(*, grace_s: float | None = None) -> Iterator[dict[int, Any]]:
    """Handle SIGINT and SIGTERM as stop requests while the block runs (main thread only).

    Args:
        grace_s: Seconds a stop may take before the process ends anyway (kept when None).

    Yields:
        The handlers that were installed before, by signal number (empty off the main thread).
    """
    global _grace_s, _depth
    if grace_s is not None:
        if grace_s <= 0:
            raise ValueError(f"grace_s must be > 0 (got {grace_s})")
        _grace_s = grace_s
    previous: dict[int, Any] = {}
    main = threading.current_thread() is threading.main_thread()
    if main:
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, _handle)
        _depth += 1
    try:
        yield previous
    finally:
        if main:
            _depth -= 1
        for signum, handler in previous.items():
            if handler is not None:  # None: a handler not installed from Python
                signal.signal(signum, handler)
