"""A schedule: the planner's steps placed on lanes, and the words it shares with its callers.

Step tiers and their rank, the kinds of lane, the float tolerance on hours and how hours are
shown; :class:`ScheduledStep` (one step on its lane) and :class:`Schedule` (all of them and
their span).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

TIER_RANK = {"essential": 0, "useful": 1, "exploratory": 2}
EPS = 1e-9
# The kinds of lane, by index: a GPU step takes a GPU lane, a human step a human lane, any
# other machine step a host lane (host lanes are not scarce: a new one opens when all are busy).
POOLS = ("gpu", "human", "host")
GPU_POOL, HUMAN_POOL, HOST_POOL = 0, 1, 2


def round_hours(x: float) -> float:
    """Hours for presentation: drop float noise such as 47.99999999."""
    return round(x, 6) + 0.0


def say_hours(x: float) -> str:
    """Hours in a sentence: ``78``, ``6.5``."""
    return f"{round_hours(x):g}"


@dataclass(frozen=True)
class ScheduledStep:
    """One step placed on a lane."""

    name: str
    kind: str
    resource: str | None
    tier: str
    lane: str
    start_hours: float
    end_hours: float
    hours: float
    run: str | None = None
    phase: str | None = None
    after: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The ``steps[]`` entry of ``campaign plan --json``."""
        d = asdict(self)
        for k in ("start_hours", "end_hours", "hours"):
            d[k] = round_hours(d[k])
        d["after"] = list(self.after)
        return d


@dataclass(frozen=True)
class Schedule:
    """The kept steps on their lanes and the span they make."""

    span: float
    steps: tuple[ScheduledStep, ...]
