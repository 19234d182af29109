"""Which run goes on which GPU lane, and in which order: the plan's placement, as the flow
submits it.

The campaign flow submits one chain per GPU lane; each chain starts its next phase when the
previous one ends. The chains follow the calendar the plan placed (``plan.json``): a run goes
on the lane of its training step, the restart check on the lane of its ``phase: restart``
step, each in the order the plan starts them there. Two rules of the flow come first on every
lane: the essential runs before the restart check, the restart check before the useful and
exploratory runs, so that a rental ending early has the essentials done. A run or a restart
check without a GPU step in the calendar goes on the lane with the shortest chain at its turn
(the lowest lane on a tie), after the placed ones of its group; with no GPU step at all that
deals the work round-robin.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection

from gpucampaign.config import CampaignSpec
from gpucampaign.plan.calendar import Plan

__all__ = ["RESTART_CHECK", "lane_chains", "lane_order", "planned_lanes"]

#: The restart check's place in a chain (every other entry is a run name).
RESTART_CHECK = None

_GPU_LANE = re.compile(r"gpu(\d+)")


def planned_lanes(plan: Plan) -> dict[str | None, tuple[int, float]]:
    """The GPU lane and start hour the plan gives each run's training and the restart check.

    A step of several GPUs (``gpu0+gpu1``) counts on its first lane; a run with several
    training steps on its earliest.

    Returns:
        ``{run: (lane, start_hours)}``, and ``{RESTART_CHECK: (lane, start_hours)}`` when the
        calendar has a GPU restart step.
    """
    placed: dict[str | None, tuple[int, float]] = {}
    for step in sorted(plan.steps, key=lambda s: s.start_hours):
        lane = _GPU_LANE.match(step.lane)
        if lane is None:
            continue
        if step.run is not None and step.phase is None:
            key: str | None = step.run
        elif step.phase == "restart":
            key = RESTART_CHECK
        else:
            continue
        placed.setdefault(key, (int(lane.group(1)), step.start_hours))
    return placed


def lane_order(
    plan: Plan, *, spec: CampaignSpec, dropped: Collection[str] = ()
) -> list[tuple[int, str | None]]:
    """The runs not dropped and the restart check on their GPU lanes, in submission order.

    Args:
        plan: The plan written at the start (its ``gpu_lanes`` and the lanes of its steps).
        spec: The campaign spec (its runs and their tiers).
        dropped: Runs the decision point dropped.

    Returns:
        ``(lane, item)`` pairs, ``item`` a run name or ``RESTART_CHECK``, lanes in
        ``range(max(1, plan.gpu_lanes))``. Each lane's items come in their chain's order, and
        every essential run before any restart check (which resumes the control's save).
    """
    kept = [r for r in spec.runs_by_tier() if r not in dropped]
    essential = set(spec.essential_runs())
    order: list[str | None] = [
        *(r for r in kept if r in essential),
        RESTART_CHECK,
        *(r for r in kept if r not in essential),
    ]
    placed = planned_lanes(plan)
    lanes = max(1, plan.gpu_lanes)
    dealt = [0] * lanes  # items per lane so far
    keyed: list[tuple[tuple[int, float, int], int, str | None]] = []
    for position, item in enumerate(order):
        group = 1 if item is RESTART_CHECK else 0 if item in essential else 2
        lane, start = placed.get(item, (-1, math.inf))
        if not 0 <= lane < lanes:
            lane, start = dealt.index(min(dealt)), math.inf
        dealt[lane] += 1
        keyed.append(((group, start, position), lane, item))
    return [(lane, item) for _, lane, item in sorted(keyed, key=lambda k: k[0])]


def lane_chains(
    plan: Plan, *, spec: CampaignSpec, dropped: Collection[str] = ()
) -> list[list[str | None]]:
    """The chain of each GPU lane (see ``lane_order``): run names and ``RESTART_CHECK``."""
    chains: list[list[str | None]] = [[] for _ in range(max(1, plan.gpu_lanes))]
    for lane, item in lane_order(plan, spec=spec, dropped=dropped):
        chains[lane].append(item)
    return chains


def machine_chains(
    plan: Plan, *, spec: CampaignSpec, dropped: Collection[str] = ()
) -> dict[int, list[list[str]]]:
    """The runs each machine trains when every lot's lanes run on its own machine: by lot
    number, one chain per GPU of the machine (its ``cuda:`` index), in ``lane_chains``' order.

    The restart check is left out: the campaign's flow runs it once the machines are done
    (it resumes the control's save from the store). A machine with no run is left out.
    """
    chains = lane_chains(plan, spec=spec, dropped=dropped)
    placed: dict[int, list[list[str]]] = {}
    for machine in plan.machines:
        mine = [
            [r for r in chains[lane] if r is not None]
            for lane in machine.lanes
            if lane < len(chains)
        ]
        if any(mine):
            placed[machine.number] = mine
    return placed
