"""Reads that ride out a store outage: ``ReadWait`` retries a read that failed because the
store did not answer, with backoff, until it answers or a bound passes.

Writes never wait (the spool takes them); a read cannot be spooled, so a run that starts while
the S3 server restarts (its ``LATEST``, a checkpoint, a mirrored folder) waits for it instead
of failing. The wait is said once when the outage starts, with what waits and for how long at
most, and once when the store answers again (``outage.Outages``: once for the process, however
many stores and tasks wait); only when the bound passes does the read fail, with
``StoreUnreachable``, saying that nothing is lost and the campaign resumes when run again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from gpucampaign.core import clock as clocks
from gpucampaign.folder.layout import SPOOL_DIR
from gpucampaign.storage.base import StorageError, StoreUnreachable
from gpucampaign.storage.outage import OUTAGES, Outages, say_s

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
        sleep: The wait between tries (``core.clock``'s, which a test drives).
        clock: Monotonic seconds (``core.clock``'s).
        outages: Where the outage is said, once for every store of the process.
    """

    def __init__(
        self,
        url: str,
        *,
        bound_s: float,
        transient: Callable[[StorageError], bool],
        sleep: Callable[[float], None] = clocks.sleep,
        clock: Callable[[], float] = clocks.monotonic,
        outages: Outages = OUTAGES,
    ) -> None:
        self.url = url
        self.bound_s = max(0.0, float(bound_s))
        self.transient = transient
        self._sleep = sleep
        self._clock = clock
        self.outages = outages

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
        self.outages.down(
            self.url,
            what=f"reading {what}",
            error=exc,
            then=(
                f"waits for it, retrying with backoff, up to {say_s(self.bound_s)} "
                "(storage.read_wait_s); writes go on into the spool"
            ),
        )

    def _say_back(self) -> None:
        self.outages.back(self.url)

    def _gave_up(self, what: str, exc: StorageError) -> StoreUnreachable:
        # The outage stays open: the read that next meets it waits without saying it again.
        return StoreUnreachable(
            f"store {self.url} did not answer for {say_s(self.bound_s)} "
            f"(storage.read_wait_s) while reading {what}: {exc}. Nothing is lost: the "
            f"checkpoints saved so far are in the store or in OUT/{SPOOL_DIR}/. Once the store "
            "answers, run the same campaign again (same spec and --out) to resume; "
            "`campaign status OUT` says what is only on this machine."
        )
