"""The GPU lock: a Prefect global concurrency limit shared by every GPU phase.

``ensure_gpu_limit`` runs once at flow start (creates the limit, clears a stale slot);
``gpu_slot`` wraps the machine-busy part of a phase. Never hold a slot while waiting for a person.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from time import monotonic
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import (
    GlobalConcurrencyLimitCreate,
    GlobalConcurrencyLimitUpdate,
)
from prefect.client.schemas.filters import (
    FlowFilter,
    FlowFilterName,
    FlowRunFilter,
    FlowRunFilterId,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.concurrency.sync import concurrency
from prefect.context import FlowRunContext
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
from prefect.settings import get_current_settings

#: Flows of this project that may hold the GPU lock.
OUR_FLOWS: tuple[str, ...] = ("campaign", "restart-verification")

# Prefix of the infrastructure_pid we stamp on in-process flow runs, so a later run can tell
# a live holder from one killed with its process (embedded mode leaves it Running forever).
_STAMP = "gpucampaign"


@dataclass(frozen=True)
class SlotHold:
    """What ``gpu_slot`` yields: the lock held and how long it took to get it."""

    name: str
    waited_s: float


def embedded_api() -> bool:
    """True when this process talks to its own temporary (ephemeral) Prefect server.

    That is the case where a killed holder's slot never comes back by itself: the server dies
    with the process and its leases with it. With ``PREFECT_API_URL`` set, a long-lived server
    returns an expired lease within its ``lease_s``.
    """
    return not get_current_settings().api.url


def ensure_gpu_limit(
    name: str, slots: int, *, clear_stale: bool, flow_names: Iterable[str] = OUR_FLOWS
) -> str:
    """Create the GPU global concurrency limit when missing; optionally clear a stale slot.

    Call it at flow start. An existing limit keeps its size: the operator sized it for the host
    (``infra/stack.sh``), and a campaign must not resize a lock other campaigns share.

    Stale slots: when the limit shows active slots while no other flow run of ``flow_names``
    is alive, those slots belong to a killed holder; with ``clear_stale`` they are set back
    to 0. A Running flow run counts as alive unless it was stamped by this function on this
    host with a process ID that no longer exists. Pass ``clear_stale=embedded_api()``: on a
    long-lived server the lease of a dead holder expires and its slot comes back on its own,
    and clearing it first would free that slot twice.

    Args:
        name: name of the global concurrency limit (``spec.gpu_lock.name``).
        slots: size when the limit is created (GPUs of the committed lots).
        clear_stale: clear active slots that no live flow run of ours can hold.
        flow_names: the flows whose runs may hold the lock.

    Returns:
        A message for the flow log when something was created, cleared or looks stale;
        an empty string otherwise.

    Raises:
        ValueError: if ``slots`` < 1.
    """
    if slots < 1:
        raise ValueError(f"GPU lock '{name}' needs at least 1 slot, got {slots}")
    current = _current_flow_run_id()
    with get_client(sync_client=True) as client:
        if current is not None:
            _stamp(client, current)
        try:
            limit = client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            try:
                client.create_global_concurrency_limit(
                    GlobalConcurrencyLimitCreate(name=name, limit=slots)
                )
                return f"GPU lock: created global concurrency limit '{name}' with {slots} slot(s)"
            except ObjectAlreadyExists:  # another flow created it meanwhile
                limit = client.read_global_concurrency_limit_by_name(name)
        if limit.active_slots <= 0:
            return ""
        alive = [r for r in _running_runs(client, flow_names, exclude=current) if _alive(r)]
        if alive:
            names = ", ".join(r.name for r in alive[:5])
            return (
                f"GPU lock '{name}': {limit.active_slots}/{limit.limit} slot(s) held while "
                f"{len(alive)} other flow run(s) run ({names}); waiting for them"
            )
        if not clear_stale:
            return (
                f"GPU lock '{name}': {limit.active_slots}/{limit.limit} slot(s) held by no running "
                "flow run of ours; the server returns them when their lease expires"
            )
        client.update_global_concurrency_limit(name, GlobalConcurrencyLimitUpdate(active_slots=0))
        return (
            f"GPU lock '{name}': cleared {limit.active_slots} stale slot(s) left by a killed "
            "holder (no other flow run of ours is running)"
        )


@contextmanager
def gpu_slot(name: str, *, timeout_s: float, lease_s: float) -> Iterator[SlotHold]:
    """Hold one slot of the GPU lock for the machine-busy part of a phase.

    ``strict=True``: a missing limit is an error, never a silent run without a lock. The lease
    is renewed while the block runs; a holder killed with its process loses the slot after
    ``lease_s`` on a long-lived server.

    Args:
        name: name of the global concurrency limit.
        timeout_s: longest wait for a free slot.
        lease_s: lease of the held slot (Prefect renews it while the block runs).

    Yields:
        A ``SlotHold`` with the seconds spent waiting for the slot.

    Raises:
        TimeoutError: no slot came free within ``timeout_s``.
        prefect.concurrency._asyncio.ConcurrencySlotAcquisitionError: the limit does not exist.
    """
    t0 = monotonic()
    with concurrency(
        name, occupy=1, strict=True, timeout_seconds=timeout_s, lease_duration=lease_s
    ):
        yield SlotHold(name=name, waited_s=monotonic() - t0)


def _current_flow_run_id() -> UUID | None:
    ctx = FlowRunContext.get()
    return ctx.flow_run.id if ctx is not None and ctx.flow_run is not None else None


def _stamp(client, flow_run_id: UUID) -> None:
    """Mark an in-process flow run with host and PID (a worker run already has its own)."""
    run = client.read_flow_run(flow_run_id)
    if not run.infrastructure_pid:
        client.update_flow_run(
            flow_run_id, infrastructure_pid=f"{_STAMP}:{socket.gethostname()}:{os.getpid()}"
        )


def _running_runs(client, flow_names: Iterable[str], *, exclude: UUID | None) -> list[FlowRun]:
    return client.read_flow_runs(
        flow_filter=FlowFilter(name=FlowFilterName(any_=list(flow_names))),
        flow_run_filter=FlowRunFilter(
            state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.RUNNING])),
            id=FlowRunFilterId(not_any_=[exclude]) if exclude is not None else None,
        ),
        limit=200,
    )


def _alive(run: FlowRun) -> bool:
    """Whether a Running flow run may still hold a slot (unknown counts as alive)."""
    parts = (run.infrastructure_pid or "").split(":")
    if len(parts) != 3 or parts[0] != _STAMP or parts[1] != socket.gethostname():
        return True
    try:
        os.kill(int(parts[2]), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError):
        return True
    return True
