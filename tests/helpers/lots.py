"""Dated lots for the lot-end tests: the spec's ``packages`` and a clock for the deadline hook.

``lot_packages`` gives a first lot that ends a given number of seconds after ``now`` and,
optionally, a second one, open since an hour before ``now``, that ends days later. ``LotClock``
stands in for ``engine/lotend.py``'s clock: it moves one second at each read (about one step of
a tiny run), so a lot ``n`` seconds long ends after about ``n`` steps, whatever the machine's
speed. ``lot_clock`` installs it for a test (no ``GPUCAMPAIGN_LOT``, no lot ended before).
``FromFirstRead`` is the real clock started at the first run's first look at it: real seconds,
without the campaign's start-up (slow on a busy machine) eating into a short lot.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest

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


class LotClock:
    """The deadline hook's clock: starts at ``start`` and moves one second at each read."""

    def __init__(self, start: datetime) -> None:
        self.start = start
        self.t = start
        self.reads: list[datetime] = []

    def __call__(self) -> datetime:
        self.t += timedelta(seconds=1)
        self.reads.append(self.t)
        return self.t


def lot_clock(monkeypatch: pytest.MonkeyPatch, start: datetime) -> Iterator[LotClock]:
    """Install a ``LotClock`` for one test (the body of a fixture: ``yield from`` it)."""
    clock = LotClock(start)
    monkeypatch.setattr(lotend, "_now", clock)
    monkeypatch.delenv(LOT_ENV, raising=False)
    lotend.forget_ended_lots()
    yield clock
    lotend.forget_ended_lots()


class FromFirstRead:
    """The real clock, its origin moved: the first read is ``start``, and time runs on in real
    seconds from there. A lot that ends ``n`` seconds after ``start`` then ends ``n`` real
    seconds after the first run asked the time, however long the campaign's start took."""

    def __init__(self, start: datetime) -> None:
        self.start = start
        self.first: datetime | None = None

    def __call__(self) -> datetime:
        return self.at(datetime.now(self.start.tzinfo))

    def at(self, real: datetime) -> datetime:
        """A real moment on this clock (the first read fixes the shift)."""
        if self.first is None:
            self.first = real
        return self.start + (real - self.first)
