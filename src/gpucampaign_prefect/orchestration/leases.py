"""The GPU lock's lease on a Prefect global concurrency limit: taken, renewed, released.

Prefect's public ``prefect.concurrency.sync.concurrency`` takes slots under a lease, renews the
lease while its block runs and releases it, but keeps the lease's ID to itself. The GPU lock
needs that ID: its holder record names it, so that a waiter can release the lease of a holder
whose process died (``gpu_lock.free_dead_holders``: on a shared server the slot would stay
taken until the lease expires, and embedded, for ever). So the lease is taken and renewed here
through the two private functions the public one is made of, each called in one function below
with its reason; the release is the client's public call. The campaign lock takes its one slot
one try at a time (``try_slot``), so that its wait runs on ``core.clock``'s time, which a test
drives, instead of Prefect's own sleeps.

Each try for a slot is ours (``_quick_try``): the embedded server's SQLite takes one writer at
a time, and a slot's write that meets another one (the server recording the phase that just
ended) is answered 503, after which Prefect's client sleeps a fixed 2 s before asking again (even
with its retries set to 0): about 2 s lost at most GPU handovers. Ours asks again within
milliseconds; anything else it does not expect goes to Prefect's own call, as before. The tries
of one process for one limit are made one at a time, as Prefect's own acquisition service makes
them: the threads of a parallel phase asking at once would otherwise keep the server busy.

Checked against Prefect 3.9.1: on an upgrade, compare ``acquire_slots`` and ``renewed`` with
``prefect/concurrency/_sync.py``'s ``concurrency`` (which the public one calls).
"""

from __future__ import annotations

import threading
import time
from contextlib import AbstractContextManager
from uuid import UUID

import httpx
from prefect.client.base import PrefectHttpxSyncClient
from prefect.client.orchestration import get_client
from prefect.concurrency._leases import maintain_concurrency_lease
from prefect.concurrency._sync import acquire_concurrency_slots_with_lease
from prefect.concurrency.asyncio import ConcurrencySlotAcquisitionError
from prefect.concurrency.context import ConcurrencyContext

_TRYING: dict[str, threading.Lock] = {}
_TRYING_GUARD = threading.Lock()


def _one_at_a_time(name: str) -> threading.Lock:
    """The lock under which this process makes its tries for the limit ``name``."""
    with _TRYING_GUARD:
        return _TRYING.setdefault(name, threading.Lock())


#: How long a busy server (503) is asked again, every ``BUSY_PAUSE_S``, before the call goes to
#: Prefect's client and its backoff (2 s, then 4, ...). A SQLite write lasts milliseconds.
BUSY_WINDOW_S = 2.0
BUSY_PAUSE_S = 0.02


def acquire_slots(name: str, *, slots: int, timeout_s: float | None, lease_s: float) -> UUID:
    """Take ``slots`` slots of the global concurrency limit ``name`` under a lease (strict: a
    missing limit is an error, never a run without a lock); its lease ID.

    Args:
        name: the global concurrency limit.
        slots: the slots taken together.
        timeout_s: longest wait for them (None: no end).
        lease_s: the lease's duration (renew it with ``renewed``).

    Raises:
        TimeoutError: the slots did not come free within ``timeout_s``.
        prefect.concurrency.asyncio.ConcurrencySlotAcquisitionError: the limit does not exist.
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        try:
            quick = _quick_try(name, slots=slots, lease_s=lease_s)
        except SlotHeld as held:  # wait as the server asks, as Prefect's own call does
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(
                    f"the slot(s) of '{name}' stayed held for {timeout_s:g} second(s)"
                ) from None
            time.sleep(held.retry_after_s if left is None else min(left, held.retry_after_s))
            continue
        if quick is not None:
            return quick
        break
    left = None if deadline is None else max(0.0, deadline - time.monotonic())
    # Private (prefect.concurrency._sync, Prefect 3.9.1): the public `concurrency` takes its
    # slots with this very call (waiting out a full limit as the server says) and keeps the
    # lease ID it returns; the holder record needs that ID.
    granted = acquire_concurrency_slots_with_lease(
        [name], slots, timeout_seconds=left, lease_duration=lease_s, strict=True
    )
    return granted.lease_id


class SlotHeld(Exception):
    """The slot is held by another lease; the server asks for a pause before the next try.

    Attributes:
        retry_after_s: The pause the server asked for (its ``Retry-After``).
    """

    def __init__(self, retry_after_s: float) -> None:
        super().__init__(f"held; retry after {retry_after_s:g} s")
        self.retry_after_s = retry_after_s


def try_slot(name: str, *, lease_s: float) -> UUID:
    """One try for one slot of ``name`` under a lease (strict), no wait; its lease ID.

    Raises:
        SlotHeld: the slot is held (the server's 423), with the pause it asks for.
        prefect.concurrency.asyncio.ConcurrencySlotAcquisitionError: the limit does not exist.
    """
    quick = _quick_try(name, slots=1, lease_s=lease_s)
    if quick is not None:
        return quick
    # Private (prefect.concurrency._sync, Prefect 3.9.1), as in `acquire_slots`: with
    # max_retries=0 a held slot raises at once, its cause the server's 423 response.
    try:
        granted = acquire_concurrency_slots_with_lease(
            [name], 1, max_retries=0, lease_duration=lease_s, strict=True
        )
    except Exception as exc:  # Prefect wraps the server's 423 (held) in its own error
        held = exc.__cause__
        if not (isinstance(held, httpx.HTTPStatusError) and held.response.status_code == 423):
            raise
        raise SlotHeld(float(held.response.headers.get("Retry-After", 1.0))) from None
    return granted.lease_id


def _quick_try(name: str, *, slots: int, lease_s: float) -> UUID | None:
    """One try for ``slots`` slots of ``name`` under a lease (strict), a busy server (503) asked
    again every ``BUSY_PAUSE_S`` for up to ``BUSY_WINDOW_S``; its lease ID, or None when the
    answer is for Prefect's own call to handle (still busy, a transport error, another status).

    Raises:
        SlotHeld: the slots are held (the server's 423), with the pause it asks for.
        prefect.concurrency.asyncio.ConcurrencySlotAcquisitionError: the limit does not exist.
    """
    body = {"names": [name], "slots": slots, "mode": "concurrency", "lease_duration": lease_s}
    with _one_at_a_time(name), get_client(sync_client=True) as client:
        deadline = time.monotonic() + BUSY_WINDOW_S
        # private: Prefect's httpx client (its URL, auth, TLS, transport); a later Prefect
        # without it gets Prefect's own call, 2 s pauses and all, not an error
        http = getattr(client, "_client", None)
        if not isinstance(http, httpx.Client):
            return None
        while True:
            request = http.build_request(
                "POST", "/v2/concurrency_limits/increment-with-lease", json=body
            )
            if isinstance(http, PrefectHttpxSyncClient) and http.enable_csrf_support:
                # as Prefect's own send does for a write
                http._add_csrf_headers(request)
            try:
                # httpx's own send, below Prefect's retrying one (private, Prefect 3.9.1): that
                # one sleeps 2 s after a 503 whatever its retry setting.
                response = httpx.Client.send(http, request)
            except httpx.HTTPError:
                return None
            if response.status_code != 503 or time.monotonic() >= deadline:
                break
            time.sleep(BUSY_PAUSE_S)
    if response.status_code == 423:
        raise SlotHeld(float(response.headers.get("Retry-After", 1.0)))
    if response.status_code != 200:
        return None
    limits = response.json().get("limits")
    if not limits:  # strict, as Prefect's call with strict=True says it
        raise ConcurrencySlotAcquisitionError(
            f"Concurrency limits {[name]!r} must be created before acquiring slots"
        )
    lease = UUID(response.json()["lease_id"])
    if (ctx := ConcurrencyContext.get()) is not None:
        # As Prefect's call does: a lease granted to a task or flow run that ends before it is
        # released (cancelled, failed) is released when the run's context exits.
        ctx.cleanup_lease_ids.append(lease)
    return lease


def renewed(
    lease_id: UUID, *, lease_s: float, stop_on_failure: bool
) -> AbstractContextManager[None]:
    """Renew the lease ``lease_id`` while the block runs (every three quarters of ``lease_s``).

    ``stop_on_failure``: a renewal that fails for good cancels the block (its slots are no
    longer reserved); otherwise it is logged and the block goes on.
    """
    # Private (prefect.concurrency._leases, Prefect 3.9.1): the public `concurrency` renews its
    # lease with this; nothing public renews a lease known by its ID, and only this cancels the
    # block when a renewal fails.
    return maintain_concurrency_lease(
        lease_id, lease_s, raise_on_lease_renewal_failure=stop_on_failure
    )


def release_slots(lease_id: UUID) -> None:
    """Give back the slots held under the lease ``lease_id`` (the client's public call)."""
    with get_client(sync_client=True) as client:
        client.release_concurrency_slots_with_lease(lease_id)
