"""Reads that ride out a store outage: ``ReadWait`` retries a read that failed because the
store did not answer, with backoff, until it answers or a bound passes.

Writes never wait (the spool takes them); a read cannot be spooled, so a run that starts while
the S3 server restarts (its ``LATEST``, a checkpoint, a mirrored folder) waits for it instead
of failing. The wait is said once when it starts, with what waits and for how long at most,
and once when the store answers again; only when the bound passes does the read fail, with
``StoreUnreachable``, saying that nothing is lost and the campaign resumes when run again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from gpucampaign.folder.layout import SPOOL_DIR
from gpucampaign.storage.base import StorageError, StoreUnreachable

log = logging.getLogger(__name__)
T = TypeVar("T")

FIRST_WAIT_S = 1.0
MAX_STEP_S = 30.0


class ReadWait:
    """The outage policy of one store's reads.

    Args:
        url: The store, as said.
        bound_s: How long one read waits at most (0: it fails at once, as before).
        transient: Tells a failure worth waiting out (the store did not answer) from one
            that is not (access denied, a missing key, altered bytes).
        sleep: The wait between tries (tests pass their own clock).
        clock: Monotonic seconds.
    """

    def __init__(
        self,
        url: str,
        *,
        bound_s: float,
        transient: Callable[[StorageError], bool],
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self.bound_s = max(0.0, float(bound_s))
        self.transient = transient
        self._sleep = sleep
        self._clock = clock
        self._lock = threading.Lock()
        self._since: float | None = None  # when the store stopped answering (said once)

    def run(self, what: str, fn: Callable[[], T]) -> T:
        """``fn()``, tried again with backoff while it fails with a transient error, for at
        most ``bound_s`` seconds.

        Raises:
            StoreUnreachable: The store did not answer within the bound.
            StorageError: A failure that is not transient, at once.
        """
        deadline = self._clock() + self.bound_s
        step = FIRST_WAIT_S
        while True:
            try:
                value = fn()
            except StorageError as exc:
                if not self.bound_s or not self.transient(exc) or isinstance(exc, StoreUnreachable):
                    raise
                left = deadline - self._clock()
                if left <= 0:
                    raise self._gave_up(what, exc) from None
                self._say_waiting(what, exc)
                self._sleep(min(step, left))
                step = min(step * 2, MAX_STEP_S)
                continue
            self._say_back()
            return value

    def _say_waiting(self, what: str, exc: StorageError) -> None:
        with self._lock:
            if self._since is not None:
                return
            self._since = self._clock()
        log.warning(
            "store %s does not answer (%s): reading %s waits for it, retrying with backoff, "
            "up to %s (storage.read_wait_s); writes go on into the spool",
            self.url,
            exc,
            what,
            _say_s(self.bound_s),
        )

    def _say_back(self) -> None:
        with self._lock:
            since, self._since = self._since, None
        if since is not None:
            log.warning(
                "store %s answers again after %s: the reads go on",
                self.url,
                _say_s(self._clock() - since),
            )

    def _gave_up(self, what: str, exc: StorageError) -> StoreUnreachable:
        with self._lock:
            self._since = None  # the next read that meets the outage says it again
        return StoreUnreachable(
            f"store {self.url} did not answer for {_say_s(self.bound_s)} "
            f"(storage.read_wait_s) while reading {what}: {exc}. Nothing is lost: the "
            f"checkpoints saved so far are in the store or in OUT/{SPOOL_DIR}/. Once the store "
            "answers, run the same campaign again (same spec and --out) to resume; "
            "`campaign status OUT` says what is only on this machine."
        )


def _say_s(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"
