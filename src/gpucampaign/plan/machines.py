"""The campaign's machines: one per lot, each with its GPUs; the plan's GPU lanes belong to them.

A package of ``packages`` with ``count: N`` is N lots, and each lot is one rented machine (a
B200 lot is one machine with two GPUs). The planner numbers GPU lanes across every machine
(``gpu0``, ``gpu1`` ...); a machine owns a run of them, and a lane's place on its machine is
said as ``lot 2 / gpu0``: the machine's number (its lot's place among the lots, from 1) and
the GPU's index on that machine, the ``cuda:`` index its worker sees. Each machine has the
work queue its worker polls (``lot-<number>``, or the package's ``work_queue``) and the GPU
limit of its own GPUs (``<lock>:<number>``). Pure functions; no Prefect.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpucampaign.config import CampaignSpec
from gpucampaign.plan.tariffs import ResolvedPackage

__all__ = [
    "Machine",
    "lane_machine",
    "machine_limit",
    "machine_of_lane",
    "lot_machines",
    "one_process_line",
]

#: A machine's work queue when its package names none: ``lot-2``.
LOT_QUEUE = "lot-{number}"

_GPU_LANE = re.compile(r"gpu(\d+)")


@dataclass(frozen=True)
class Machine:
    """One lot's machine: its number among the lots (from 1), the package it comes from (its
    place in ``packages``, from 1), its GPU model, the plan's GPU lanes it owns and the work
    queue its worker polls."""

    number: int
    package: int
    gpu: str
    lanes: tuple[int, ...]
    work_queue: str

    @property
    def name(self) -> str:
        """``lot 2``: how the plan, the report and the logs name the machine."""
        return f"lot {self.number}"

    def gpu_index(self, lane: int) -> int:
        """The index on this machine (its ``cuda:`` index) of the plan's GPU lane ``lane``."""
        return self.lanes.index(lane)

    def label(self, lanes: Sequence[int]) -> str:
        """``lot 2 / gpu0`` (``lot 1 / gpu0+gpu1`` for a step on both GPUs of a lot)."""
        return f"{self.name} / " + "+".join(f"gpu{self.gpu_index(lane)}" for lane in lanes)

    def gpu_limit(self, lock: str) -> str:
        """The GPU limit of this machine's GPUs, ``gpu:2`` for the lock named ``gpu``."""
        return machine_limit(lock, lot=self.number)

    def to_dict(self) -> dict[str, Any]:
        """The ``machines[]`` entry of ``campaign plan --json``."""
        return {
            "lot": self.number,
            "package": self.package,
            "gpu": self.gpu,
            "gpus": len(self.lanes),
            "lanes": [f"gpu{lane}" for lane in self.lanes],
            "work_queue": self.work_queue,
        }


def machine_limit(lock: str, *, lot: int) -> str:
    """The GPU limit of machine ``lot``'s GPUs: ``gpu:2`` for the lock named ``gpu``."""
    return f"{lock}:{lot}"


def lot_machines(spec: CampaignSpec, packages: Sequence[ResolvedPackage]) -> tuple[Machine, ...]:
    """The spec's machines, lots in the order of ``packages``, lanes numbered as the planner
    numbers them (``packages`` resolved from the spec's, one for one).

    A package's ``work_queue`` names the queue of its lots' workers (several lots of it share
    that queue, as the lot's end hands over to it); a lot of a package without one has its
    own, ``lot-<number>``.
    """
    machines: list[Machine] = []
    lane = 0
    for place, (given, resolved) in enumerate(zip(spec.packages, packages, strict=True), 1):
        for _ in range(resolved.count):
            number = len(machines) + 1
            queue = given.work_queue or LOT_QUEUE.format(number=number)
            lanes = tuple(range(lane, lane + resolved.gpus_per_lot))
            machines.append(Machine(number, place, resolved.gpu, lanes, queue))
            lane += resolved.gpus_per_lot
    return tuple(machines)


def machine_of_lane(machines: Sequence[Machine], lane: int) -> Machine | None:
    """The machine that owns the plan's GPU lane ``lane`` (None: no machine has it)."""
    return next((m for m in machines if lane in m.lanes), None)


def lane_machine(machines: Sequence[Machine], lane: str) -> str:
    """A plan step's lane as its machine says it: ``gpu1`` -> ``lot 2 / gpu0``;
    ``gpu0+gpu1`` -> ``lot 1 / gpu0+gpu1``; a human or host lane -> ``""``."""
    numbers = [int(m.group(1)) for part in lane.split("+") if (m := _GPU_LANE.fullmatch(part))]
    machine = machine_of_lane(machines, numbers[0]) if numbers else None
    if machine is None or any(n not in machine.lanes for n in numbers):
        return ""
    return machine.label(numbers)


def one_process_line(machines: Sequence[Machine], *, distributed: bool) -> str | None:
    """The line ``campaign plan`` and ``campaign run`` say about where the machines' lanes run,
    None for a campaign of one machine.

    Args:
        machines: The plan's machines.
        distributed: True when each machine's lanes run on that machine (a Prefect server and
            an ``s3://`` store); False when every lane runs in this one process.
    """
    if len(machines) < 2:
        return None
    names = ", ".join(f"{m.name} (queue {m.work_queue})" for m in machines)
    if distributed:
        return (
            f"{len(machines)} machines: {names}; each runs its lanes where a worker of its "
            "queue runs (`campaign worker --lot K` on that machine)."
        )
    return (
        f"{len(machines)} machines planned ({names}), run here as lanes of one process on this "
        "machine: with a Prefect server and storage.url: s3://... each lot's lanes run on its "
        "own machine."
    )
