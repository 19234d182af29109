"""Dated lots for the lot-end tests: the spec's ``packages`` and a clock for the deadline hook.

``lot_packages`` gives a first lot that ends a given number of seconds after ``now`` and,
optionally, a second one, open since an hour before ``now``, that ends days later. ``LotClock``
is the product's clock (``core/clock.py``) driven by the test: it moves one second at each read
of the moment (about one step of a tiny run), so a lot ``n`` seconds long ends after about ``n``
steps, whatever the machine's speed. ``lot_clock`` installs it for a test (no
``GPUCAMPAIGN_LOT``, no lot ended before). ``FromFirstRead`` is the real clock started at the
first run's first look at it: real seconds, without the campaign's start-up (slow on a busy
machine) eating into a short lot.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest

from gpucampaign.core.clock import DrivenClock, use_clock
from gpucampaign.engine import lotend
from gpucampaign.plan.lots import LOT_ENV

#: Each lot's length in days (a length of the catalog).
LOT_DAYS = 3


def lot_packages(
    *, now: datetime, first_ends_in_s: float, second: bool, gpu: str = "rtx4090"
) -> list[dict[str, Any]]:
    """The spec's ``packages``: lot 1 ends ``first_ends_in_s`` after ``now``; with ``second``,
    lot 2 opened an hour before ``now`` and ends days after lot 1."""
    first = now - timedelta(days=LOT_DAYS) + timedelta(seconds=first_ends_in_s)
    lots = [{"gpu": gpu, "days": LOT_DAYS, "starts_at": first.isoformat()}]
    if second:
        start = now - timedelta(hours=1)
        lots.append({"gpu": gpu, "days": LOT_DAYS, "starts_at": start.isoformat()})
    return lots


class LotClock(DrivenClock):
    """The product's clock, driven: starts at ``start`` and moves one second at each read of
    the moment (``reads``: the moments read); ``advance`` moves it on."""

    def __init__(self, start: datetime) -> None:
        super().__init__(start, tick_s=1.0)


def lot_clock(monkeypatch: pytest.MonkeyPatch, start: datetime) -> Iterator[LotClock]:
    """Install a ``LotClock`` for one test (the body of a fixture: ``yield from`` it)."""
    monkeypatch.delenv(LOT_ENV, raising=False)
    lotend.forget_ended_lots()
    with use_clock(LotClock(start)) as clock:
        yield clock
    lotend.forget_ended_lots()


class FromFirstRead:
    """The real clock, its origin moved: the first read is ``start``, and time runs on in real
    seconds from there. A lot that ends ``n`` seconds after ``start`` then ends ``n`` real
    seconds after the first run asked the time, however long the campaign's start took."""

    def __init__(self, start: datetime) -> None:
        self.start = start
        self.first: datetime | None = None

    def now(self) -> datetime:
        """The moment on this clock (the first call fixes the shift)."""
        return self.at(datetime.now(self.start.tzinfo))

    def monotonic(self) -> float:
        """Real monotonic seconds."""
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        """A real sleep."""
        time.sleep(seconds)

    def at(self, real: datetime) -> datetime:
        """A real moment on this clock (the first read fixes the shift)."""
        if self.first is None:
            self.first = real
        return self.start + (real - self.first)
