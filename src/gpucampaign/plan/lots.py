"""The lot a machine trains on, when it ends, and the margin kept before that end.

A lot with ``starts_at`` is open from then until ``starts_at + days``; after that its machine
is taken away. The machine a run trains on belongs to one lot: the one named by the
``GPUCAMPAIGN_LOT`` environment variable of its worker (its number among the lots, from 1, a
package of ``count: N`` being N lots, as ``plan.machines`` numbers them; or its
``order_ref``), else the open lot that ends first (a campaign on one pool of lots). The
run keeps a margin before that end: the time to finish the step in progress, to save and
upload a checkpoint, to read it back (the proof it is off the machine) and to copy the output
folder, all measured by this campaign, with a safety factor, widened by the spec's
``checkpoint.lot_end_margin_minutes``. Pure functions; no Prefect.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from gpucampaign.config import CampaignSpec, SpecError
from gpucampaign.plan.rental import iso

#: The worker's environment variable naming the lot its machine belongs to.
LOT_ENV = "GPUCAMPAIGN_LOT"
#: The name of the worker whose flow runs run on this machine (``campaign worker`` sets it).
WORKER_ENV = "GPUCAMPAIGN_WORKER"
#: The measured costs are multiplied by this (a save slows down when the disk is busy).
SAFETY = 2.0
#: The least margin before the factor: the measures of a tiny model say almost nothing.
FLOOR_S = 5.0
#: A save not yet measured (the first pilot) is taken to move its bytes at this rate (a slow
#: upload), plus ``UNMEASURED_SAVE_S``.
UNMEASURED_BYTES_PER_S = 20e6
UNMEASURED_SAVE_S = 2.0


@dataclass(frozen=True)
class Lot:
    """One dated lot: its number among the lots (from 1, as ``plan.machines`` numbers them),
    its window, its name and the work queue of its machine's worker (None: any worker)."""

    number: int
    starts_at: datetime
    ends_at: datetime
    order_ref: str | None = None
    work_queue: str | None = None

    def is_open(self, now: datetime) -> bool:
        """Whether ``now`` falls in the lot's window."""
        return self.starts_at <= now < self.ends_at

    @property
    def label(self) -> str:
        """``lot 2 (order ABC, ends 2026-03-02T09:00:00Z)``."""
        ref = f"order {self.order_ref}, " if self.order_ref else ""
        return f"lot {self.number} ({ref}ends {iso(self.ends_at)})"


def dated_lots(spec: CampaignSpec) -> list[Lot]:
    """The spec's lots that carry ``starts_at``, in the spec's order, numbered among all its
    lots (a package of ``count: 2`` is two lots, two machines, one after the other)."""
    lots: list[Lot] = []
    number = 0
    for p in spec.packages:
        for _ in range(p.count):
            number += 1
            if p.starts_at is not None and p.ends_at is not None:
                lots.append(
                    Lot(
                        number=number,
                        starts_at=p.starts_at,
                        ends_at=p.ends_at,
                        order_ref=p.order_ref,
                        work_queue=p.work_queue,
                    )
                )
    return lots


def _has_undated(spec: CampaignSpec) -> bool:
    """True when a lot of the spec has no ``starts_at`` (that lot has no end)."""
    return any(p.starts_at is None for p in spec.packages)


def _pinned_number(spec: CampaignSpec, env: Mapping[str, str]) -> int | None:
    """The lot number ``GPUCAMPAIGN_LOT`` names (its number, or a dated lot's order_ref), None
    when unset.

    Raises:
        SpecError: It names no lot of the spec.
    """
    value = (env.get(LOT_ENV) or "").strip()
    if not value:
        return None
    for lot in dated_lots(spec):
        if lot.order_ref is not None and value == lot.order_ref:
            return lot.number
    lots = sum(p.count for p in spec.packages)
    if value.isdigit() and 1 <= int(value) <= lots:
        return int(value)
    raise SpecError(
        f"{LOT_ENV}={value!r} names no lot of the spec's 'packages' ({lots} lot(s)): give the "
        "lot's number (1 for the first; a package of count: 2 is two lots, numbered on) or a "
        "dated lot's order_ref, or unset it to train on the open lot that ends first.",
        field="packages",
    )


def pin_lane_lot(spec: CampaignSpec, *, lot: int, env: MutableMapping[str, str]) -> int:
    """The machine this process is when it trains lot ``lot``'s lane: the lot its worker was
    pinned to (``campaign worker --lot K``: the machine says best where it runs; the lots of a
    package may share one work queue), else ``lot``, then pinned (``GPUCAMPAIGN_LOT`` set), so
    its timeline rows and its lot's end are that lot's. A worker started without a pin (a
    plain ``prefect worker start`` on lot K's queue) took the open lot that ends first before.

    Raises:
        SpecError: ``GPUCAMPAIGN_LOT`` names no lot of the spec.
    """
    pinned = _pinned_number(spec, env)
    if pinned is None:
        env[LOT_ENV] = str(lot)
        return lot
    return pinned


def pinned_lot(spec: CampaignSpec, env: Mapping[str, str]) -> Lot | None:
    """The dated lot ``GPUCAMPAIGN_LOT`` names (None when unset, or when it names a lot
    without ``starts_at``: that machine has no end).

    Raises:
        SpecError: It names no lot of the spec.
    """
    number = _pinned_number(spec, env)
    return next((lot for lot in dated_lots(spec) if lot.number == number), None)


def machine_lot(
    spec: CampaignSpec, *, now: datetime, env: Mapping[str, str], ended: frozenset[int]
) -> Lot | None:
    """The lot this machine trains on: the pinned one, else the open lot that ends first
    among those not ``ended`` here already. None when no lot is dated or none is open, and on
    a machine pinned to a lot without ``starts_at``."""
    if _pinned_number(spec, env) is not None:
        return pinned_lot(spec, env)
    open_lots = [lot for lot in dated_lots(spec) if lot.is_open(now) and lot.number not in ended]
    return min(open_lots, key=lambda lot: lot.ends_at) if open_lots else None


def ended_lot(
    spec: CampaignSpec, *, now: datetime, env: Mapping[str, str], ended: frozenset[int]
) -> Lot | None:
    """The lot whose end stops this machine's work, once it has ended: the pinned lot when its
    end has passed; else, with no lot open for this machine (``machine_lot``), the last of the
    spec's lots that ended (here, ``ended``, or by the clock). None while a lot is open, before
    any lot ended, and for a spec with an undated lot (that one has no end).
    """
    if _pinned_number(spec, env) is not None:
        pinned = pinned_lot(spec, env)
        return pinned if pinned is not None and pinned.ends_at <= now else None
    lots = dated_lots(spec)
    if _has_undated(spec) or machine_lot(spec, now=now, env=env, ended=ended):
        return None
    over = [lot for lot in lots if lot.number in ended or lot.ends_at <= now]
    return max(over, key=lambda lot: lot.ends_at) if over else None


@dataclass(frozen=True)
class ThisMachine:
    """What a record says of the machine that wrote it: its lot's number (None when the spec
    has several lots and nothing says which), its host name and its worker's name (None
    outside ``campaign worker``)."""

    lot: int | None
    host: str
    worker: str | None


def this_machine(spec: CampaignSpec, *, now: datetime, env: Mapping[str, str]) -> ThisMachine:
    """The machine this process runs on: its lot is the one ``GPUCAMPAIGN_LOT`` names, else
    the open dated lot that ends first, else the spec's only lot.

    Raises:
        SpecError: ``GPUCAMPAIGN_LOT`` names no lot of the spec.
    """
    number = _pinned_number(spec, env)
    if number is None:
        lot = machine_lot(spec, now=now, env=env, ended=frozenset())
        lots = sum(p.count for p in spec.packages)
        number = lot.number if lot is not None else (1 if lots == 1 else None)
    return ThisMachine(
        lot=number, host=socket.gethostname(), worker=(env.get(WORKER_ENV) or "").strip() or None
    )


def refuse_ended_rental(spec: CampaignSpec, *, now: datetime) -> None:
    """Refuse a campaign every lot of which has ended (a campaign started after its rental).

    A lot without ``starts_at`` has no end: a spec with one such lot runs without a deadline
    (the lots then only price the campaign), and nothing is refused.

    Raises:
        SpecError: Every lot is dated and its end has passed; the message names the last end
            and now, and the two ways on.
    """
    lots = dated_lots(spec)
    if not lots or _has_undated(spec) or any(lot.ends_at > now for lot in lots):
        return
    last = max(lots, key=lambda lot: lot.ends_at)
    raise SpecError(
        f"field 'packages': every lot of the spec has ended; the last, {last.label}, ended at "
        f"{iso(last.ends_at)} and it is now {iso(now)}: its machines are gone, nothing would "
        "stop at their end. Give a lot that is open now (packages[].starts_at and days), or "
        "remove starts_at from packages to run without a deadline (the lots then only price "
        "the campaign).",
        field="packages",
    )


def next_lot(spec: CampaignSpec, *, now: datetime, after: Lot, margin_s: float) -> Lot | None:
    """A later lot whose window is open now with more than ``margin_s`` left, ending last."""
    later = [
        lot
        for lot in dated_lots(spec)
        if lot.number != after.number
        and lot.ends_at > after.ends_at
        and lot.is_open(now)
        and lot.ends_at - now > timedelta(seconds=margin_s)
    ]
    return max(later, key=lambda lot: lot.ends_at) if later else None


def unmeasured_save_s(state_bytes: int) -> float:
    """What a first save of ``state_bytes`` is taken to cost before one is measured."""
    return UNMEASURED_SAVE_S + state_bytes / UNMEASURED_BYTES_PER_S


def lot_margin_s(
    *,
    step_s: float | None,
    save_s: float,
    retrieve_s: float | None,
    mirror_s: float | None,
    extra_minutes: float,
) -> float:
    """Seconds kept before the lot's end: the step in progress, one save with its upload, its
    read-back and the folder's copy, as measured (a read-back not yet measured counts as
    much as the save), times ``SAFETY``, plus the spec's extra.
    """
    retrieve = save_s if retrieve_s is None else retrieve_s
    measured = (step_s or 0.0) + save_s + retrieve + (mirror_s or 0.0)
    return SAFETY * max(measured, FLOOR_S) + 60.0 * extra_minutes


def least_margin_s(spec: CampaignSpec) -> float:
    """The least margin a run keeps before its lot's end: nothing measured yet (the floor, the
    factor) plus the spec's ``checkpoint.lot_end_margin_minutes``."""
    return lot_margin_s(
        step_s=None,
        save_s=0.0,
        retrieve_s=0.0,
        mirror_s=None,
        extra_minutes=spec.checkpoint.lot_end_margin_minutes,
    )


def lot_has_time(spec: CampaignSpec, *, number: int, now: datetime) -> bool:
    """Whether machine ``number``'s lot can start a run now: open, with more than the least
    margin left (``least_margin_s``); a lot without ``starts_at`` has no end."""
    lot = next((lot for lot in dated_lots(spec) if lot.number == number), None)
    if lot is None:
        return True
    return lot.is_open(now) and (lot.ends_at - now).total_seconds() > least_margin_s(spec)
