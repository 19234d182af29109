"""The time the product waits on, in one place: the current moment, monotonic seconds, sleeps.

Code whose behaviour turns on elapsed time that a test would otherwise wait out (the lot's end,
the store's outage back-off, the spool's drain) reads ``now()``, ``monotonic()`` and
``sleep()`` from here. Nothing drives them in production: they are the real clock
(``datetime.now(UTC)``, ``time.monotonic``, ``time.sleep``).

A test drives them in one of two ways:

- in its own process, by installing a ``DrivenClock`` with ``use_clock`` (a fixture): time
  moves only when the test (``advance``), a read (``tick_s``) or a sleep moves it, so a lot
  that ends in an hour ends in as many reads as the test says, and a back-off of a minute
  takes none of the test's time;
- across processes (a flow run a real Prefect worker starts), by naming a file in the
  environment variable ``GPUCAMPAIGN_TEST_CLOCK_FILE`` of that process: its clock is the real
  one plus the offset in seconds the file holds, read at each use, and ``shift_clock`` moves it
  on. A sleep on that clock wakes when the shifted time reaches its end, so a test that shifts
  the clock ends a wait at once. Unset (always, outside tests), the real clock is used.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Protocol, TypeVar

#: The environment variable that names a shifted clock's offset file; only tests set it.
CLOCK_FILE_ENV = "GPUCAMPAIGN_TEST_CLOCK_FILE"
#: How often a sleep on a shifted clock looks at the file again (real seconds).
SHIFTED_POLL_S = 0.05


class Clock(Protocol):
    """What the product asks of a clock."""

    def now(self) -> datetime:
        """The current moment, timezone-aware (UTC)."""
        ...

    def monotonic(self) -> float:
        """Seconds that never go back, for deadlines and durations."""
        ...

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` on this clock."""
        ...


class RealClock:
    """The machine's clock: what the product uses unless a test drives it."""

    def now(self) -> datetime:
        """``datetime.now(UTC)``."""
        return datetime.now(UTC)

    def monotonic(self) -> float:
        """``time.monotonic()``."""
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        """``time.sleep(seconds)``."""
        time.sleep(max(0.0, seconds))


class ShiftedClock:
    """The real clock plus an offset in seconds read from ``path`` at each use (a missing or
    unreadable file: no offset). Another process moves it with ``shift_clock``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def offset_s(self) -> float:
        """The offset the file holds now."""
        try:
            return float(self.path.read_text().strip() or 0.0)
        except (OSError, ValueError):
            return 0.0

    def now(self) -> datetime:
        """The real moment, shifted."""
        return datetime.now(UTC) + timedelta(seconds=self.offset_s())

    def monotonic(self) -> float:
        """Real monotonic seconds, shifted."""
        return time.monotonic() + self.offset_s()

    def sleep(self, seconds: float) -> None:
        """Wait until the shifted clock has moved ``seconds`` (a shift ends the wait early)."""
        end = self.monotonic() + seconds
        while (left := end - self.monotonic()) > 0:
            time.sleep(min(left, SHIFTED_POLL_S))


def shift_clock(path: Path, *, by_s: float) -> float:
    """Move the shifted clock of ``path`` on by ``by_s`` seconds (the test's side); the new
    offset. The file is replaced whole, so a reader never sees half a number."""
    offset = ShiftedClock(path).offset_s() + by_s
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(repr(offset))
    os.replace(tmp, path)
    return offset


class DrivenClock:
    """A clock only the test moves, for one process.

    Args:
        start: The moment of its first reading (timezone-aware).
        tick_s: How far each ``now()`` moves it first (a read stands for some work: one
            second a read makes a lot of ``n`` seconds end after ``n`` reads, whatever the
            machine's speed).
    """

    def __init__(self, start: datetime, *, tick_s: float = 0.0) -> None:
        self.start = start
        self.tick_s = tick_s
        self.elapsed_s = 0.0
        self.reads: list[datetime] = []
        self.slept: list[float] = []

    def now(self) -> datetime:
        """``start`` plus the time moved so far (one ``tick_s`` more than the last read)."""
        self.elapsed_s += self.tick_s
        moment = self.start + timedelta(seconds=self.elapsed_s)
        self.reads.append(moment)
        return moment

    def monotonic(self) -> float:
        """The seconds moved so far."""
        return self.elapsed_s

    def sleep(self, seconds: float) -> None:
        """Moves the clock ``seconds`` on at once; recorded in ``slept``."""
        self.slept.append(seconds)
        self.elapsed_s += max(0.0, seconds)

    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` on."""
        self.elapsed_s += seconds


C = TypeVar("C", bound=Clock)

_REAL = RealClock()
_installed: list[Clock] = []


def current() -> Clock:
    """The clock in force: the one a test installed, else a shifted clock when
    ``GPUCAMPAIGN_TEST_CLOCK_FILE`` is set, else the real clock."""
    if _installed:
        return _installed[-1]
    # Read at each use, never at import: a flow-run process gets it from its worker's job.
    path = os.environ.get(CLOCK_FILE_ENV)
    return ShiftedClock(Path(path)) if path else _REAL


def now() -> datetime:
    """The current moment (UTC) on the clock in force."""
    return current().now()


def monotonic() -> float:
    """Monotonic seconds on the clock in force."""
    return current().monotonic()


def sleep(seconds: float) -> None:
    """Wait ``seconds`` on the clock in force."""
    current().sleep(seconds)


@contextmanager
def use_clock(clock: C) -> Iterator[C]:
    """Install ``clock`` for this process while the block runs (a test's fixture)."""
    _installed.append(clock)
    try:
        yield clock
    finally:
        _installed.remove(clock)
