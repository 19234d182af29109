"""One running copy of a campaign across hosts: the campaign lock.

A campaign on an S3 store can run on any host of the pool (a relaunch after a crash moves it),
and each host has its own output folder, so the folder's writer lock cannot see a copy on
another host. The campaign flow therefore holds, for its whole life, the one slot of a Prefect
global concurrency limit named after the campaign and its store (``campaign:<name>:<key>``),
on the server every host shares, with a lease renewed while it runs. A second copy (a host
revived while another holds the campaign, a deployment run by hand twice) waits up to two
leases, then refuses with a message that names the copies holding it; a holder killed with its
machine gives the slot back when its lease expires, before the relaunch automation starts the
next copy. With a local store the folder's writer lock is the guard, and a flow without a
server of its own (``campaign run``'s temporary one) has nothing shared to hold.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from uuid import UUID

from prefect import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterId,
    FlowRunFilterState,
    FlowRunFilterStateType,
    FlowRunFilterTags,
)
from prefect.client.schemas.objects import StateType
from prefect.context import FlowRunContext
from prefect.exceptions import ObjectAlreadyExists

from gpucampaign.config import CampaignSpec
from gpucampaign.core import clock
from gpucampaign.core.storageurl import is_s3, normal_url
from gpucampaign_prefect.orchestration.gpu_lock import drop_dead_rows, embedded_api
from gpucampaign_prefect.orchestration.leases import SlotHeld, release_slots, renewed, try_slot


class CampaignHeld(RuntimeError):
    """Another copy of the campaign holds it (the message names it and says what to do)."""


def lock_name(cs: CampaignSpec) -> str:
    """The campaign lock's global concurrency limit: the campaign's name and its store (its
    normal spelling: a trailing slash names the same store, so the same lock)."""
    key = hashlib.sha256(normal_url(cs.storage.url).encode()).hexdigest()[:10]
    return f"campaign:{cs.name}:{key}"


def _acquire(name: str, *, wait_s: float, lease_s: float) -> UUID:
    """The lock's slot with its lease (its ID), waiting up to ``wait_s`` on ``core.clock``'s
    time: one try at a time, then the pause the server asks for, as Prefect's own wait does;
    the wait is ours so that a test drives it (``core/clock.py``) instead of waiting two leases
    of wall time for a refusal.

    Raises:
        TimeoutError: the slot stayed held for all of ``wait_s``.
    """
    deadline = clock.monotonic() + wait_s
    while True:
        try:
            return try_slot(name, lease_s=lease_s)
        except SlotHeld as held:
            left = deadline - clock.monotonic()
            if left <= 0:
                raise TimeoutError(f"the slot of '{name}' stayed held for {wait_s:.0f} s") from None
            clock.sleep(min(left, held.retry_after_s))


def _holders(tag: str) -> str:
    """The running copies of the campaign (flow run names and IDs), but this one."""
    me = FlowRunContext.get()
    mine = me.flow_run.id if me is not None and me.flow_run is not None else None
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                tags=FlowRunFilterTags(all_=[tag]),
                state=FlowRunFilterState(
                    type=FlowRunFilterStateType(any_=[StateType.RUNNING, StateType.PENDING])
                ),
            ),
            limit=10,
        )
    named = [f"'{r.name}' ({r.id})" for r in runs if r.id != mine]
    return ", ".join(named) if named else "a copy whose lease has not expired yet"


@contextmanager
def campaign_lock(
    cs: CampaignSpec, *, tag: str, lease_s: float, wait_s: float | None = None
) -> Iterator[str]:
    """Hold the campaign lock for the block (S3 store, shared server); yields its name ('' when
    there is nothing to hold).

    Args:
        cs: the campaign (its name and store name the lock).
        tag: the campaign's flow-run tag, which names the copies holding it in a refusal.
        lease_s: the lease, renewed while the block runs.
        wait_s: longest wait for the lock (default two leases: a dead holder's comes back).

    Raises:
        CampaignHeld: another copy held it for all of ``wait_s``.
    """
    wait_s = 2 * lease_s if wait_s is None else wait_s
    if not is_s3(cs.storage.url) or embedded_api():
        yield ""
        return
    name = lock_name(cs)
    with get_client(sync_client=True) as client:
        try:
            client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))
        except ObjectAlreadyExists:
            pass
    try:
        lease_id = _acquire(name, wait_s=wait_s, lease_s=lease_s)
    except TimeoutError:
        raise CampaignHeld(
            f"campaign '{cs.name}' (store {cs.storage.url}) is running elsewhere: "
            f"{_holders(tag)} holds its lock '{name}'; this copy waited {wait_s:.0f} s "
            "and refuses, so that two copies never train it at once. Nothing was written. "
            "Cancel the other copy first if this one should run; a copy that died gives the "
            "lock back when its lease expires."
        ) from None
    try:
        # A renewal that fails is logged, not raised: a server out for a while must not end a
        # campaign (its GPU phases hold their slots strictly and stop on their own).
        with renewed(lease_id, lease_s=lease_s, stop_on_failure=False):
            yield name
    finally:
        release_slots(lease_id)


def close_dead_copies(tag: str) -> list[str]:
    """Close what the crashed flow runs of the campaign left open: their task runs still
    Running become Crashed, those Pending or Scheduled Cancelled, and their ``gpu-slot`` tags
    go (the dead-run automation sets only the flow run Crashed). Run by the copy that holds
    the campaign, so none of them still works; best effort. The names of the runs closed."""
    closed: list[str] = []
    try:
        _close_dead(tag, closed)
    except Exception as exc:  # the UI's view, never a reason to stop the campaign
        logging.getLogger(__name__).warning("crashed copies not closed: %s", exc)
    return closed


def _close_dead(tag: str, closed: list[str]) -> None:
    from prefect.client.schemas.filters import (
        TaskRunFilter,
        TaskRunFilterState,
        TaskRunFilterStateType,
    )
    from prefect.states import Cancelled, Crashed

    open_states = [StateType.RUNNING, StateType.PENDING, StateType.SCHEDULED]
    with get_client(sync_client=True) as client:
        dead = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                tags=FlowRunFilterTags(all_=[tag]),
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.CRASHED])),
            ),
            limit=50,
        )
        for run in dead:
            tasks = client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])),
                task_run_filter=TaskRunFilter(
                    state=TaskRunFilterState(type=TaskRunFilterStateType(any_=open_states))
                ),
            )
            why = f"its flow run '{run.name}' crashed (its process or machine died)"
            for t in tasks:
                started = t.state is not None and t.state.type == StateType.RUNNING
                state: Any = Crashed(message=why) if started else Cancelled(message=why)
                client.set_task_run_state(t.id, state, force=True)
            kept = [t for t in run.tags or [] if not t.startswith("gpu-slot:")]
            if tasks or kept != list(run.tags or []):
                client.update_flow_run(run.id, tags=kept)
                closed.append(run.name)
        if dead:  # the GPU lock's holders tables name no crashed run
            drop_dead_rows(client, [run.id for run in dead])
