"""Each lot's lanes on that lot's machine: the campaign flow's side (``flows/lane.py`` is the
machine's).

With several machines in the plan, an ``s3://`` store and a flow run of a deployment (a Prefect
server and its workers), the campaign flow starts one flow run of the ``lane`` deployment per
machine on that lot's work queue, as a sub-run of its own named by lot, and waits for all of
them; the worker of that queue runs it on that machine. Otherwise (``campaign run``, a local
store, one machine) every lane runs as a thread of this flow-run process, as before.
Once the machines are done, their records are taken from the store into the campaign's folder
(``storage.lanefiles.collect_lanes``), whose one writer stays this flow.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from prefect import get_run_logger
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import FlowRun
from prefect.context import FlowRunContext
from prefect.deployments import run_deployment
from prefect.exceptions import MissingContextError

from gpucampaign.config import CampaignSpec
from gpucampaign.core import clock
from gpucampaign.core.stoprules import STOP_RULES, StopRule
from gpucampaign.core.storageurl import is_s3
from gpucampaign.folder.layout import RESULT_FILE, OutputFolder
from gpucampaign.folder.records import TimelineRow, read_stops, read_timeline
from gpucampaign.folder.segments import Timeline, close_cut_segments, lot_ended
from gpucampaign.plan.calendar import Plan
from gpucampaign.plan.lanes import machine_chains
from gpucampaign.plan.lots import dated_lots, lot_has_time
from gpucampaign.plan.machines import Machine
from gpucampaign.storage import open_store
from gpucampaign.storage.lanefiles import collect_lanes, publish_start

#: The flow of the machines' deployment (``deployments/prefect.yaml``): ``lane/<name>``, the
#: name of the campaign's own deployment (``main``, or ``campaign deploy --name``'s).
LANE_FLOW = "lane"

#: Starts one machine's flow run: ``run_deployment``'s keywords, the flow run back (a seam for
#: tests, which play the workers).
Dispatch = Callable[..., FlowRun]


def on_machines(cs: CampaignSpec, *, plan: Plan) -> bool:
    """Whether each machine's lanes run on that machine: several machines, an ``s3://`` store
    (the one folder every machine writes to) and this flow run a deployment's on a server.
    Dated lots (``starts_at``) count only when they were rented side by side: all from the
    same moment, and open now; each machine's lot then ends on its own and hands the rest of
    its lane to one with time left."""
    lots, now = dated_lots(cs), clock.now()
    if len({lot.starts_at for lot in lots}) > 1 or any(not lot.is_open(now) for lot in lots):
        # Dated lots that follow one another (or not yet open): the lot-end hand-over moves
        # the campaign from one to the next (``flows/_lots.py``); the plan still lays their
        # lanes side by side, so sending a later lot its lane now would wait for a machine
        # not yet rented, or one meant to take over (the fresh-clone CI's test_lotend_s3
        # failed so: its lot 2 opens before lot 1 ends).
        return False
    return len(plan.machines) >= 2 and is_s3(cs.storage.url) and from_deployment()


def from_deployment() -> bool:
    """Whether this flow run is a deployment's (its lots' workers would run the lanes), not
    ``campaign run``'s nor a flow called directly."""
    ctx = FlowRunContext.get()
    return ctx is not None and ctx.flow_run is not None and ctx.flow_run.deployment_id is not None


def _lane_deployment() -> tuple[str, dict[str, Any]]:
    """The machines' deployment (``lane/<this deployment's name>``) and this run's parameters."""
    ctx = FlowRunContext.get()
    assert ctx is not None and ctx.flow_run is not None and ctx.flow_run.deployment_id is not None
    with get_client(sync_client=True) as client:
        own = client.read_deployment(ctx.flow_run.deployment_id)
    return f"{LANE_FLOW}/{own.name}", dict(ctx.flow_run.parameters)


def _run_deployment(**kwargs: Any) -> FlowRun:
    """``run_deployment``, called from a thread (``_sync``: the switch of Prefect's
    ``async_dispatch``, not in the signature)."""
    run = run_deployment(**kwargs, _sync=True)  # type: ignore[call-arg]
    assert isinstance(run, FlowRun)
    return run


def run_on_machines(
    cs: CampaignSpec,
    *,
    plan: Plan,
    dropped: list[str],
    folder: OutputFolder,
    dispatch: Dispatch = _run_deployment,
    deployment: tuple[str, dict[str, Any]] | None = None,
) -> dict[str, StopRule]:
    """Train every run not dropped on its machine, one sub-run per machine at once, and wait.

    Args:
        cs: The campaign spec.
        plan: The plan written at the start (its machines and lanes).
        dropped: The runs the decision point dropped.
        folder: The campaign's folder: each machine's records are taken into it.
        dispatch: Starts one machine's flow run (``run_deployment``; tests give a fake).
        deployment: The machines' deployment and this run's parameters (default: read from
            this flow run's deployment).

    Returns:
        The stop that ended each run, as the machines recorded it.

    Raises:
        LanesLeft: A machine's flow run did not complete and no other machine finished its
            runs: which, its state, the runs left and what to do (the campaign closes with
            what is done, resumable).

    A machine whose sub-run ends other than Completed (its worker killed: Crashed; its lot
    ended) hands its unfinished runs to a machine that completed its own (``Lanes``).
    """
    logger = _logger()
    name, params = deployment if deployment is not None else _lane_deployment()
    chains = machine_chains(plan, spec=cs, dropped=dropped)
    machines = [m for m in plan.machines if m.number in chains]
    store = open_store(cs.storage.url, out=folder.root)
    runs_placed = [r for c in chains.values() for ch in c for r in ch]
    # What the machines start from: the pilots' run folders, the stops.
    publish_start(folder.root, store=store, run_ids=[cs.resolve_run(r).run_id for r in runs_placed])

    def start(machine: Machine, chains_of: list[list[str]], lost: Machine | None = None) -> FlowRun:
        # The sub-run waits, Scheduled, until a worker polls the queue: say which one it needs
        logger.info(
            "%s: %s on work queue '%s'%s (its worker: `campaign worker --lot %d --queue %s` on "
            "that machine)",
            machine.name,
            " | ".join(", ".join(c) for c in chains_of),
            machine.work_queue,
            f", the rest of {lost.name}'s lane" if lost is not None else "",
            machine.number,
            machine.work_queue,
        )
        return dispatch(
            name=name,
            parameters={
                "spec": params.get("spec"),
                "out": params.get("out"),
                "base_dir": params.get("base_dir"),
                "lot": machine.number,
                "chains": chains_of,
            },
            work_queue_name=machine.work_queue,
            as_subflow=True,
            flow_run_name=f"{cs.name} {machine.name}"
            + (f" for {lost.name}" if lost is not None else ""),
            timeout=None,
        )

    # One thread per machine, each in a copy of this flow run's context, taken here (a thread
    # starts with an empty one): run_deployment makes the machine's run a sub-run of this one.
    contexts = {m.number: contextvars.copy_context() for m in machines}
    with ThreadPoolExecutor(max_workers=max(1, len(machines))) as pool:
        runs = list(
            pool.map(lambda m: contexts[m.number].run(start, m, chains[m.number]), machines)
        )
    taken = collect_lanes(folder.root, store=store, lots=[m.number for m in machines])
    logger.info("records taken from the machines: %s", taken)
    lanes = Lanes(cs=cs, folder=folder, store=store, chains=chains, start=start)
    failed = lanes.hand_over_lost(list(zip(machines, runs, strict=True)), logger=logger)
    if failed:
        raise _not_finished(
            cs, failed=failed, left=lanes.unfinished(runs_placed), machines=machines
        )
    return _run_stops(cs, folder=folder, runs=runs_placed)


@dataclass(kw_only=True)
class Lanes:
    """The machines' lanes once dispatched: what each left undone, and its hand-over."""

    cs: CampaignSpec
    folder: OutputFolder
    store: Any
    chains: dict[int, list[list[str]]]
    start: Callable[..., FlowRun]

    def unfinished(self, runs: list[str]) -> list[str]:
        """The ``runs`` the campaign's folder holds no end of: no ``result.json``, no stop."""
        stopped = {rec.run_id for rec in read_stops(self.folder.root) if rec.phase == "train"}
        left = []
        for run in runs:
            run_id = self.cs.resolve_run(run).run_id
            if run_id not in stopped and not (self.folder.run(run_id).path / RESULT_FILE).is_file():
                left.append(run)
        return left

    def hand_over_lost(
        self, ended: list[tuple[Machine, FlowRun]], *, logger: Any
    ) -> list[tuple[Machine, FlowRun]]:
        """Send the unfinished runs of each machine whose lane did not complete (its worker
        died, its lot ended) to a machine whose lane did and whose lot has time left, after
        that machine's own lane: a second sub-run on its queue, each run resuming from its last
        checkpoint in the store, in its folder as the campaign's holds it. The lost machine's
        open segments are closed as interrupted in the campaign's timeline first (the loss on
        the ledger, with its machine; a run its lot's end stopped closed its segment as
        ``lot ended``, saved), the new machine's rows follow them.

        Returns:
            The machines' sub-runs that still did not complete: a lost machine with no other
            machine (with time left in its lot) to take its runs, or a hand-over that did not
            complete either.
        """
        done = [m for m, r in ended if _completed(r)]
        failed: list[tuple[Machine, FlowRun]] = []
        for i, (machine, run) in enumerate((m, r) for m, r in ended if not _completed(r)):
            left = self.unfinished([r for c in self.chains[machine.number] for r in c])
            if not left:  # lost after its last run ended: nothing to move
                logger.warning(
                    "%s: flow run '%s' %s, its runs all ended",
                    machine.name,
                    run.name,
                    _state_name(run),
                )
                continue
            why = self._why(machine, run)
            # Only a machine whose own lot has time left starts them (``refuse_start`` would
            # refuse them on one whose lot has ended too).
            now = clock.now()
            hosts = [m for m in done if lot_has_time(self.cs, number=m.number, now=now)]
            if not hosts:
                if done:
                    logger.warning(
                        "%s: %s left, and no other machine has time left in its lot",
                        why,
                        ", ".join(left),
                    )
                failed.append((machine, run))
                continue
            target = hosts[i % len(hosts)]
            cut = close_cut_segments(
                Timeline.of(self.folder),
                run_dir=lambda row: self.folder.run(self.cs.resolve_run(str(row.run)).run_id).path,
                only=_of_runs(left),
            )
            logger.warning(
                "%s: %s go on on %s after its own lane, each from its last checkpoint in the "
                "store (%d segment(s) cut, on the ledger)",
                why,
                ", ".join(left),
                target.name,
                len(cut),
            )
            # The target starts each run's folder from the campaign's copy, which now holds
            # what the lost machine trained of it (its metrics up to the cut, its lot's end):
            # the run goes on in that folder, as on one machine.
            ids = [self.cs.resolve_run(r).run_id for r in left]
            publish_start(self.folder.root, store=self.store, run_ids=ids)
            handed = self.start(target, [left], machine)
            collect_lanes(self.folder.root, store=self.store, lots=[target.number])
            if not _completed(handed):
                failed.append((target, handed))
        return failed

    def _why(self, machine: Machine, run: FlowRun) -> str:
        """Why ``machine`` left its lane: its lot ended (a ``lot ended`` segment of it on the
        timeline), or it was lost (its worker died)."""
        ended = [
            r for r in read_timeline(self.folder.root) if r.lot == machine.number and lot_ended(r)
        ]
        if ended:
            return (
                f"{machine.name} ended (its lot's end stopped {ended[-1].run} at step "
                f"{ended[-1].checkpoint_step}, saved; flow run '{run.name}' {_state_name(run)})"
            )
        return f"{machine.name} was lost (flow run '{run.name}' {_state_name(run)})"


class LanesLeft(RuntimeError):
    """Machines did not finish their lanes and no machine (with time left in its lot) took
    their runs: the campaign closes with what is done, resumable, and says what is left and
    why (the message), as the lot-end path does on one machine."""


def _not_finished(
    cs: CampaignSpec,
    *,
    failed: list[tuple[Machine, FlowRun]],
    left: list[str],
    machines: list[Machine],
) -> LanesLeft:
    """Machines that did not finish their lanes: which, the runs left, the fix."""
    said = "; ".join(f"{m.name}: flow run '{r.name}' {_state_name(r)}" for m, r in failed)
    now = clock.now()
    fix = (
        "start each one's worker (`campaign worker --lot K`) and run the campaign again"
        if any(lot_has_time(cs, number=m.number, now=now) for m in machines)
        else "no machine of the campaign has time left in its lot: run the campaign again "
        "on a lot that is open (packages[].starts_at)"
    )
    return LanesLeft(
        f"machines did not finish their lanes ({said}; runs left: {', '.join(left) or 'none'}): "
        f"{fix}; it resumes from the store"
    )


def _of_runs(runs: list[str]) -> Callable[[TimelineRow], bool]:
    """Whether a timeline row is a segment of one of ``runs``."""
    return lambda row: row.run in runs


def _logger() -> Any:
    """The flow run's logger; this module's outside a flow run (a test calling in)."""
    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger(__name__)


def _completed(run: FlowRun) -> bool:
    return run.state is not None and run.state.is_completed()


def _state_name(run: FlowRun) -> str:
    if run.state is None:
        return "with no state"
    message = f": {run.state.message}" if run.state.message else ""
    return f"{run.state.name}{message}"


def _run_stops(cs: CampaignSpec, *, folder: OutputFolder, runs: list[str]) -> dict[str, StopRule]:
    """The stop of each of ``runs`` the machines recorded (a training's, by run ID)."""
    by_id = {cs.resolve_run(r).run_id: r for r in runs}
    stops: dict[str, StopRule] = {}
    for rec in read_stops(folder.root):
        run = by_id.get(rec.run_id)
        if run is not None and rec.phase == "train" and rec.rule in STOP_RULES:
            stops[run] = STOP_RULES[rec.rule](
                rec.run_id, rec.reason, step=rec.step, stop_id=rec.stop_id
            )
    return stops
