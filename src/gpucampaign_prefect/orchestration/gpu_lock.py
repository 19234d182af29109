"""The GPU lock: a Prefect global concurrency limit shared by every GPU phase.

``ensure_gpu_limit`` runs once at flow start (creates the limit, marks our dead flow runs
Crashed, clears a stale slot); ``gpu_slot`` wraps the machine-busy part of a phase. Never hold
a slot while waiting for a person.

Every held slot has a holder record (``holders_dir``: one JSON file per lease, under the Prefect
home, beside the embedded database): lease, flow run, campaign, output folder, host, PID and,
in embedded mode, the PID of the holder's own Prefect server. A waiter reads them while it
waits: it names the holders in its log, and frees the slot of a holder on this host whose
process is gone. Embedded, that lease died with the holder's server, so nothing else would.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import socket
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from time import monotonic
from typing import Any
from uuid import UUID

from prefect import get_run_logger
from prefect.artifacts import create_table_artifact
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
from prefect.context import FlowRunContext, TaskRunContext
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
from prefect.settings import get_current_settings
from prefect.states import Crashed

from gpucampaign.folder.lock import pid_runs
from gpucampaign_prefect.orchestration.background import UiCalls
from gpucampaign_prefect.orchestration.embedded import adopted_api_url, adopted_server_pid
from gpucampaign_prefect.orchestration.leases import acquire_slots, release_slots, renewed

#: Flows of this project that may hold the GPU lock.
OUR_FLOWS: tuple[str, ...] = ("campaign", "lane", "restart-verification")

# Prefix of the infrastructure_pid we stamp on in-process flow runs, so a later run can tell
# a live holder from one killed with its process (embedded mode leaves it Running forever).
_STAMP = "gpucampaign"

#: The longest the release of a slot waits for the UI to show the holders (free again).
PUBLISH_WAIT_S = 30.0


@dataclass(frozen=True)
class SlotHold:
    """What ``gpu_slot`` yields: the lock held and how long it took to get it."""

    name: str
    waited_s: float


def embedded_api() -> bool:
    """True when this process talks to its own temporary (ephemeral) Prefect server.

    That is the case where a killed holder's slot never comes back by itself: the server dies
    with the process and its leases with it. With ``PREFECT_API_URL`` set, a long-lived server
    returns an expired lease within its ``lease_s``; the URL of the temporary server ``campaign
    run`` adopted (``embedded.adopted_api_url``) is still its own.
    """
    url = get_current_settings().api.url
    return not url or url == adopted_api_url()


def ensure_gpu_limit(
    name: str, slots: int, *, clear_stale: bool, flow_names: Iterable[str] = OUR_FLOWS
) -> str:
    """Create the GPU global concurrency limit when missing; optionally clear a stale slot.

    Call it at flow start. First, flow runs of ours left Running by a process that died on this
    host are marked Crashed, and the slots of dead holders (``free_dead_holders``) come back.
    An existing limit smaller than ``slots`` is raised to it (a data-parallel run takes its
    ``gpus`` slots at once, which a limit made by a one-GPU campaign would refuse for ever);
    a larger one keeps its size: it is never lowered under a campaign that holds its slots.

    Stale slots: when the limit shows active slots while no other flow run of ``flow_names``
    is alive, those slots belong to a killed holder; with ``clear_stale`` they are set back
    to 0. A Running flow run counts as alive unless it was stamped by this function on this
    host with a process ID that no longer exists. Pass ``clear_stale=embedded_api()``: on a
    long-lived server the lease of a dead holder expires and its slot comes back on its own,
    and clearing it first would free that slot twice.

    Args:
        name: name of the global concurrency limit (``spec.gpu_lock.name``).
        slots: the GPUs of the committed lots: the limit's size when it is created, and the
            least it is raised to when it exists.
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
                return (
                    f"GPU lock: created '{name}' on this Prefect server with {slots} slot(s), "
                    "one per GPU of the committed lots; every campaign's runs take them in turn"
                )
            except ObjectAlreadyExists:  # another flow created it meanwhile
                limit = client.read_global_concurrency_limit_by_name(name)
        raised = _raise_limit(client, name, limit.limit, slots)
        runs = _running_runs(client, flow_names, exclude=current)
        for run in runs:  # left Running by a killed process: never coming back
            if not _alive(run):
                _mark_crashed(client, run.id, "its process died (found at a later flow start)")
        alive = [r for r in runs if _alive(r)]
    freed = free_dead_holders(name)
    with get_client(sync_client=True) as client:
        limit = client.read_global_concurrency_limit_by_name(name)
        if limit.active_slots <= 0:
            return _joined(raised, _gave_back(name, freed))
        if alive:
            holders = "; ".join(h.says() for h in read_holders(name))
            names = ", ".join(r.name for r in alive[:5])
            return _joined(
                raised,
                f"GPU lock '{name}': {limit.active_slots}/{limit.limit} slot(s) held "
                + (f"by {holders} " if holders else "")
                + f"while {len(alive)} other flow run(s) run ({names}); waiting for them",
            )
        if not clear_stale:
            return _joined(
                raised,
                f"GPU lock '{name}': {limit.active_slots}/{limit.limit} slot(s) held by no running "
                "flow run of ours; the server returns them when their lease expires",
            )
        client.update_global_concurrency_limit(name, GlobalConcurrencyLimitUpdate(active_slots=0))
        return _joined(
            raised,
            f"GPU lock '{name}': cleared {limit.active_slots} stale slot(s) left by a killed "
            "holder (no other flow run of ours is running)",
        )


def _raise_limit(client: Any, name: str, size: int, slots: int) -> str:
    """Raise the limit ``name`` of ``size`` slots to ``slots`` when smaller (never lower it);
    what was done, for the flow log."""
    if size >= slots:
        return ""
    client.update_global_concurrency_limit(name, GlobalConcurrencyLimitUpdate(limit=slots))
    return (
        f"GPU lock: raised global concurrency limit '{name}' from {size} to {slots} slot(s), "
        "the GPUs of the committed lots"
    )


def _joined(*notes: str) -> str:
    return "; ".join(n for n in notes if n)


@dataclass(frozen=True)
class Holder:
    """Who holds one slot of the GPU lock: one record per lease, removed at its release."""

    lease_id: str
    limit: str
    host: str
    pid: int
    since: str
    campaign: str = ""
    out: str = ""
    flow_run: str | None = None
    server_pid: int | None = None  # the holder's embedded Prefect server; None: a shared one
    run: str = ""  # what holds it: ``<phase> of <run ID>``
    slots: int = 1  # a data-parallel run (gpus: N) holds N

    def says(self) -> str:
        """``campaign 'c' (output folder o, PID p on host h, since t)``."""
        where = f"output folder {self.out}, " if self.out else ""
        return (
            f"campaign '{self.campaign or '?'}' ({where}PID {self.pid} on host {self.host}, "
            f"since {self.since})"
        )

    def is_dead(self) -> bool:
        """True when the holder ran on this host and its process (and its own server) are gone.

        A holder elsewhere, or one whose PID still runs, counts as alive: its lease is the bound.
        """
        if self.host != socket.gethostname() or pid_runs(self.pid):
            return False
        return self.server_pid is None or not pid_runs(self.server_pid)


def holders_dir(name: str) -> Path:
    """The folder of the holder records of lock ``name`` on the current Prefect API."""
    settings = get_current_settings()
    api = "embedded" if embedded_api() else str(settings.api.url)
    key = hashlib.sha256(api.encode()).hexdigest()[:12]
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", name)
    return Path(settings.home) / "gpu-holders" / key / safe


def read_holders(name: str) -> list[Holder]:
    """The recorded holders of lock ``name`` (unreadable records are skipped)."""
    folder = holders_dir(name)
    found = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        with contextlib.suppress(OSError, ValueError, TypeError):
            found.append(Holder(**json.loads(path.read_text())))
    return found


def free_dead_holders(name: str, *, log: Callable[[str], Any] | None = None) -> list[Holder]:
    """Give back the slots of this host's dead holders of ``name``; mark their flow runs Crashed.

    A record is claimed by removing it, so two waiters never free the same slot twice. An
    embedded holder's lease died with its server: its slot is decremented. On a shared server
    the holder's lease itself is released (the server would otherwise expire it later).

    Returns:
        The holders whose slots were given back.
    """
    freed = []
    for holder in read_holders(name):
        if not holder.is_dead():
            continue
        try:
            (holders_dir(name) / f"{holder.lease_id}.json").unlink()
        except FileNotFoundError:  # another waiter claimed it
            continue
        with get_client(sync_client=True) as client:
            if holder.server_pid is None:
                client.release_concurrency_slots_with_lease(UUID(holder.lease_id))
            else:
                client.release_concurrency_slots(
                    names=[name], slots=holder.slots, occupancy_seconds=1.0
                )
            if holder.flow_run:
                _mark_crashed(client, UUID(holder.flow_run), f"its process (PID {holder.pid}) died")
        freed.append(holder)
        if log is not None:
            log(f"GPU lock '{name}': gave back the slot of {holder.says()}: its process is gone")
    if freed:  # the UI's table must stop naming them: its lease expired or is released now
        _publish_table(name, read_holders(name))
    return freed


def drop_dead_rows(client: Any, flow_run_ids: Iterable[str | UUID]) -> list[str]:
    """Write a new version of every GPU lock's holders table (any host's) that still names one
    of the crashed flow runs ``flow_run_ids``, without their rows: a holder killed with its
    machine never writes one, and its lease expires without a word. The keys rewritten."""
    from prefect.client.schemas.filters import ArtifactCollectionFilter, ArtifactCollectionFilterKey

    dead = {str(i) for i in flow_run_ids}
    tables = client.read_latest_artifacts(
        artifact_filter=ArtifactCollectionFilter(
            key=ArtifactCollectionFilterKey(like_="gpu-lock-%")
        )
    )
    rewritten = []
    for table in tables:
        rows = json.loads(table.data) if isinstance(table.data, str) else table.data
        if not isinstance(rows, list) or not any(
            isinstance(r, dict) and r.get("flow_run") in dead for r in rows
        ):
            continue
        kept = [r for r in rows if r.get("flow_run") not in dead]
        first = rows[0]
        host = str(first.get("host", "?"))
        create_table_artifact(
            table=kept or [{"limit": first.get("limit", "?"), "host": host, "holder": "(free)"}],
            key=table.key,
            description=f"Holders of the GPU lock '{first.get('limit', '?')}' on host {host}: "
            + ("; ".join(f"{r.get('holder', '?')}: PID {r.get('pid')}" for r in kept) or "none")
            + " (a crashed flow run's row removed)",
        )
        rewritten.append(table.key)
    return rewritten


@contextmanager
def gpu_slot(
    name: str,
    *,
    timeout_s: float,
    lease_s: float,
    campaign: str = "",
    out: str = "",
    run: str = "",
    recheck_s: float = 2.0,
    slots: int = 1,
) -> Iterator[SlotHold]:
    """Hold ``slots`` slots of the GPU lock (one per GPU: a run's ``gpus``) for the
    machine-busy part of a phase.

    ``strict=True``: a missing limit is an error, never a silent run without a lock. The lease
    is renewed while the block runs. While it waits, a watcher re-reads the holders every
    ``recheck_s``: it logs who holds the lock and gives back the slot of a holder on this host
    whose process is gone. A holder on another host loses its slot after ``lease_s`` on a
    long-lived server.

    Args:
        name: name of the global concurrency limit.
        timeout_s: longest wait for a free slot.
        lease_s: lease of the held slot (Prefect renews it while the block runs).
        campaign: the campaign's name, for the holder record.
        out: the campaign's output folder, for the holder record.
        run: what holds the slot (``<phase> of <run ID>``), for the holder record and the UI.
        recheck_s: seconds between two readings of the holders while waiting.
        slots: GPUs the phase uses at once (a data-parallel run's ``gpus``), taken together.

    Yields:
        A ``SlotHold`` with the seconds spent waiting for the slot.

    Raises:
        TimeoutError: no slot came free within ``timeout_s``.
        prefect.concurrency.asyncio.ConcurrencySlotAcquisitionError: the limit does not exist.
    """
    t0 = monotonic()
    log = _logger()
    waiting = threading.Event()
    watcher = threading.Thread(
        target=_watch_holders, args=(name, waiting, recheck_s, log), daemon=True
    )
    watcher.start()
    try:
        lease = acquire_slots(name, slots=slots, timeout_s=timeout_s, lease_s=lease_s)
    finally:
        waiting.set()
        watcher.join(timeout=30)
    record = _record_holder(name, str(lease), campaign=campaign, out=out, run=run, slots=slots)
    # The UI's table and tag are made beside the phase: its first step does not wait for them.
    shown = UiCalls(f"holders of GPU lock '{name}'")
    shown.submit(publish_holders, name, held=True)
    try:
        with renewed(lease, lease_s=lease_s, stop_on_failure=True):
            yield SlotHold(name=name, waited_s=monotonic() - t0)
    finally:
        shown.drain(timeout_s=PUBLISH_WAIT_S)  # no write of the UI's beside the release
        try:
            release_slots(lease)
        finally:
            record.unlink(missing_ok=True)
            shown.submit(publish_holders, name, held=False)  # after the held version
            shown.close(timeout_s=PUBLISH_WAIT_S)


def holder_tag(name: str) -> str:
    """The tag a flow run carries while it holds a slot of lock ``name`` on this host."""
    return f"gpu-slot:{name}@{socket.gethostname()}"


def holders_table(name: str, holders: list[Holder]) -> list[dict[str, Any]]:
    """The rows of the holders artifact: one per held slot of this host, or one 'free' row."""
    if not holders:
        return [{"limit": name, "host": socket.gethostname(), "holder": "(free on this host)"}]
    return [
        {
            "limit": name,
            "host": h.host,
            "holder": h.run or "?",
            "campaign": h.campaign,
            "flow_run": h.flow_run or "",
            "pid": h.pid,
            "since": h.since,
            "out": h.out,
        }
        for h in holders
    ]


def holders_key(name: str) -> str:
    """The artifact key of lock ``name``'s holders on this host (one key per host: hosts never
    overwrite each other's rows)."""
    return re.sub(r"[^a-z0-9-]+", "-", f"gpu-lock-{name}-{socket.gethostname()}".lower()).strip("-")


def publish_holders(name: str, *, held: bool) -> None:
    """Show who holds lock ``name`` in the UI: a new version of the table artifact of this
    host's holders, and the tag ``holder_tag`` on the current flow run while it holds a slot.
    Best effort: the UI's view, never a reason to fail a phase."""
    holders = read_holders(name)
    _publish_table(name, holders)
    current = _current_flow_run_id()
    if current is None:
        return
    mine = any(h.flow_run == str(current) for h in holders)
    try:
        with get_client(sync_client=True) as client:
            tags = list(client.read_flow_run(current).tags or [])
            tag = holder_tag(name)
            wanted = [t for t in tags if t != tag] + ([tag] if held or mine else [])
            if wanted != tags:
                client.update_flow_run(current, tags=wanted)
    except Exception as exc:
        _logger().debug("GPU lock '%s': tagging the holder failed: %s", name, exc)


def _publish_table(name: str, holders: list[Holder]) -> None:
    """A new version of the table artifact of this host's holders of lock ``name`` (best effort)."""
    try:
        create_table_artifact(
            table=holders_table(name, holders),
            key=holders_key(name),
            description=f"Holders of the GPU lock '{name}' on host {socket.gethostname()}: "
            + ("; ".join(f"{h.run or '?'}: {h.says()}" for h in holders) or "none"),
        )
    except Exception as exc:
        _logger().debug("GPU lock '%s': publishing the holders failed: %s", name, exc)


def _watch_holders(
    name: str, done: threading.Event, recheck_s: float, log: logging.LoggerAdapter | logging.Logger
) -> None:
    """While ``done`` is not set: free dead holders' slots, say who holds the lock when it
    changes."""
    said = ""
    while not done.wait(recheck_s):
        try:
            free_dead_holders(name, log=log.warning)
            holders = read_holders(name)
        except Exception as exc:  # a watcher never breaks the wait it watches
            log.debug("GPU lock '%s': reading the holders failed: %s", name, exc)
            continue
        text = "; ".join(h.says() for h in holders) or "a holder without a record"
        if text != said:
            said = text
            log.info("waiting for GPU lock '%s': held by %s", name, text)


def _record_holder(
    name: str, lease_id: str, *, campaign: str, out: str, run: str = "", slots: int = 1
) -> Path:
    """Write this process's holder record of ``lease_id``; returns its path."""
    holder = Holder(
        lease_id=lease_id,
        limit=name,
        host=socket.gethostname(),
        pid=os.getpid(),
        since=datetime.now(UTC).isoformat(timespec="seconds"),
        campaign=campaign,
        out=str(Path(out).resolve()) if out else "",
        flow_run=str(run_id) if (run_id := _current_flow_run_id()) else None,
        server_pid=_embedded_server_pid(),
        run=run,
        slots=slots,
    )
    folder = holders_dir(name)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{lease_id}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(holder)))
    tmp.replace(path)
    return path


def _embedded_server_pid() -> int | None:
    """The PID of this process's temporary Prefect server (None: a shared server)."""
    if not embedded_api():
        return None
    if (adopted := adopted_server_pid()) is not None:
        return adopted
    # The server's modules only when this process runs its own temporary server.
    from prefect.server.api.server import SubprocessASGIServer

    for server in list(SubprocessASGIServer._instances.values()):
        if server.running and server.server_process is not None:
            return int(server.server_process.pid)
    return None


def _logger() -> logging.LoggerAdapter | logging.Logger:
    try:
        return get_run_logger()
    except Exception:  # outside a run
        return logging.getLogger("gpucampaign.gpu_lock")


def _mark_crashed(client, flow_run_id: UUID, why: str) -> bool:
    """Set a flow run of ours that is still Running to Crashed; True when it was."""
    try:
        run = client.read_flow_run(flow_run_id)
    except ObjectNotFound:
        return False
    if run.state is None or run.state.is_final():
        return False
    client.set_flow_run_state(flow_run_id, Crashed(message=f"crashed: {why}"), force=True)
    return True


def _gave_back(name: str, freed: list[Holder]) -> str:
    if not freed:
        return ""
    return f"GPU lock '{name}': gave back the slot(s) of " + "; ".join(
        f"{h.says()}, whose process is gone" for h in freed
    )


def _current_flow_run_id() -> UUID | None:
    ctx = FlowRunContext.get()
    if ctx is not None and ctx.flow_run is not None:
        return ctx.flow_run.id
    task_ctx = TaskRunContext.get()
    return task_ctx.task_run.flow_run_id if task_ctx is not None else None


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


def say_lock_note(note: str, *, logger: Any) -> None:
    """Tell a note of ``ensure_gpu_limit``: what it made (created, raised) is news, said as a
    plain line on stderr (the terminal of ``campaign run``) and at INFO in the flow's log; the
    rest (slots held, cleared) is a warning of the flow's log."""
    if not note:
        return
    if note.startswith(("GPU lock: created", "GPU lock: raised")):
        logger.info(note)
        sys.stderr.write(note + "\n")
        sys.stderr.flush()
    else:
        logger.warning(note)
