"""The ``campaign`` flow: audit, pilot, decide, run, verify the restart, close.

Run it with ``campaign run SPEC`` (embedded Prefect) or ``prefect deployment run campaign/main``.
"""

from __future__ import annotations

import signal
import socket
from dataclasses import dataclass
from typing import Any, Literal, NotRequired, TypedDict, cast

from prefect import State, allow_failure, flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.client.orchestration import get_client
from prefect.context import FlowRunContext
from prefect.exceptions import UnfinishedRun
from prefect.states import Cancelled, Completed, Failed
from pydantic.json_schema import SkipJsonSchema

from gpucampaign.close.manifest import keep_inputs
from gpucampaign.config import CampaignSpec, spec_sha256
from gpucampaign.core.errors import InputError
from gpucampaign.core.interrupt import Interrupted, graceful_signals, handled_outside
from gpucampaign.core.stoprules import StopRule
from gpucampaign.core.text import redact_logging
from gpucampaign.engine.lotend import LotEnded
from gpucampaign.folder.layout import OutputFolder
from gpucampaign.folder.lock import writer_lock
from gpucampaign.folder.records import (
    fix_campaign_id,
    read_pilot,
    read_result,
    read_stops,
    run_states,
    runs_with_model,
    write_pilot,
)
from gpucampaign.plan import calendar
from gpucampaign.plan.calendar import Plan
from gpucampaign.plan.decision import Decision
from gpucampaign.plan.lanes import RESTART_CHECK, lane_order
from gpucampaign.plan.machines import one_process_line
from gpucampaign.plan.stopping import campaign_stop, essential_pilot_stops, stop_effect
from gpucampaign.preflight import OpenCampaign, open_campaign, start_folder
from gpucampaign.preflight.machines import refuse_machines_without_store
from gpucampaign.preflight.stale import fence_sealed_store
from gpucampaign.storage.mirror import Fence
from gpucampaign.verify.sealed import recheck_sealed
from gpucampaign_prefect.flows._lots import after_lot_end, closed_at_lot_end, relaunch_refused
from gpucampaign_prefect.flows._machines import (
    LanesLeft,
    from_deployment,
    on_machines,
    run_on_machines,
)
from gpucampaign_prefect.flows._naming import (
    CAMPAIGN_TAG,
    campaign_run_name,
    spec_name,
    tag_flow_run,
)
from gpucampaign_prefect.flows._rounds import buy_rounds
from gpucampaign_prefect.orchestration import notify
from gpucampaign_prefect.orchestration.campaign_lock import (
    CampaignHeld,
    campaign_lock,
    close_dead_copies,
)
from gpucampaign_prefect.orchestration.gpu_lock import embedded_api, ensure_gpu_limit, say_lock_note
from gpucampaign_prefect.orchestration.outage import relay_outages
from gpucampaign_prefect.orchestration.phases import artifact_key, stop_of
from gpucampaign_prefect.tasks.audit import data_audit
from gpucampaign_prefect.tasks.close import close_campaign, mirror, seal
from gpucampaign_prefect.tasks.decide import decision_point
from gpucampaign_prefect.tasks.predict import predictions
from gpucampaign_prefect.tasks.restart import restart_verification
from gpucampaign_prefect.tasks.train import pilot, train

DEFAULT_SPEC = "examples/digits/campaign.yaml"
DEFAULT_OUT = "out/campaign"


def _stop_of(future: Any) -> StopRule | None:
    """Wait for a task; return the stop that ended it (a ``Stopped`` state, or a StopRule
    raised), else None (other errors propagate)."""
    try:
        return stop_of(future.result())
    except StopRule as exc:
        return exc


def _stop_or_lot_end(future: Any, ended: list[LotEnded]) -> StopRule | None:
    """``_stop_of``, keeping a ``LotEnded`` in ``ended`` instead of raising it, so that the
    flow waits for every task of the lot before it goes on."""
    try:
        return _stop_of(future)
    except LotEnded as exc:
        ended.append(exc)
        return None
    except UnfinishedRun:
        if not ended:
            raise
        return None  # it waited for a phase the lot's end stopped: it never started


class CampaignSummary(TypedDict):
    """What the campaign flow returns once it closed (``campaign run`` prints it)."""

    campaign_id: str
    out: str
    verdict: dict[str, Any]
    spent_usd: float
    rental_per_accepted_usd: float | None
    runs: dict[str, str]
    decision: dict[str, Any] | None
    verified: bool
    problems: list[str]
    manifest_sha256: str | None
    mirrored: dict[str, Any]
    essential_stop: dict[str, Any] | None
    lot_ended: NotRequired[str]  # closed at a lot's end, resumable: why, and where it goes on


@dataclass(frozen=True)
class CampaignEnd:
    """How the flow ended, one value: the summary of a close, and the message of a failed or
    cancelled end (the flow run's state says it; ``state`` makes it)."""

    summary: CampaignSummary | None = None
    failed: str | None = None
    cancelled: str | None = None
    refused: InputError | None = None  # a refusal before anything started: the failure's data

    def state(self) -> State[Any]:
        """The flow run's final state: Completed with the summary, or Failed or Cancelled with
        the message (and the summary, or the refusal, as its data)."""
        if self.cancelled is not None:
            return Cancelled(message=self.cancelled, data=self.summary)
        if self.failed is not None:
            data = self.refused if self.refused is not None else self.summary
            return Failed(message=self.failed, data=data)
        return Completed(data=self.summary)


def _refused(exc: InputError) -> CampaignEnd:
    """A campaign refused before anything started: the preflight's paragraph is the whole
    story (no traceback)."""
    get_run_logger().error("refused before anything started: %s", exc)
    return CampaignEnd(failed=f"refused before anything started: {exc}", refused=exc)


@flow(name="campaign", flow_run_name=campaign_run_name, log_prints=False)
def campaign(
    # `campaign run` hands over the opened campaign; a deployment's form offers the other two
    spec: str | CampaignSpec | SkipJsonSchema[OpenCampaign] = DEFAULT_SPEC,
    out: str = DEFAULT_OUT,
    decision_mode: Literal["auto", "ask"] | None = None,
    base_dir: str | None = None,
    relaunch: int = 0,
) -> State[Any]:
    """Run a whole campaign into the output folder ``out``; rerunning it resumes.

    Args:
        spec: path of the campaign YAML (relative paths in it are relative to its folder), the
            spec object itself, or the campaign ``open_campaign`` opened (``campaign run``:
            nothing is loaded or checked again; its output folder is the one used).
        out: output folder; a rerun into the same folder repeats nothing finished.
        decision_mode: overrides the spec's ``decision_point.mode`` ('auto' or 'ask').
        base_dir: folder the paths of a spec object are relative to (default: the working
            directory); a spec file's own folder otherwise.
        relaunch: how many times the stack relaunched this campaign after a crash (set by the
            relaunch automation, infra/automations.py); above ``checkpoint.max_relaunches``
            the run refuses to start.

    Returns:
        Completed with the ``CampaignSummary``; Failed when refused, stopped or not verified;
        Cancelled when interrupted or closed at a lot's end (see ``CampaignEnd``).
    """
    redact_logging()  # no credential in a log line, a task's record in Prefect's database
    # The relaunch bound first: before the preflight (a recipe that kills its process there
    # would otherwise loop through the relaunch automation), any lock or any read of the store.
    if (refused := relaunch_refused(spec, relaunch=relaunch)) is not None:
        return CampaignEnd(failed=refused).state()
    # SIGINT and SIGTERM become a stop request: the running training saves at its next step
    # boundary and raises Interrupted, which ends every phase still waiting.
    with graceful_signals() as previous:
        try:
            end = _opened_and_locked(
                spec, out=out, decision_mode=decision_mode, base_dir=base_dir, relaunch=relaunch
            )
        except CampaignHeld as exc:
            get_run_logger().error("%s", exc)
            end = CampaignEnd(failed=str(exc))
        except Interrupted as exc:
            get_run_logger().warning("campaign %s; rerun to resume", exc)
            if exc.reason == "SIGTERM" and _cancelling():
                # A cancellation (UI, `prefect flow-run cancel`): the worker sent this SIGTERM
                # and, once the process is gone, marks the run Cancelled unless it already is.
                end = CampaignEnd(cancelled=f"cancelled: {exc}; rerun to resume")
            else:
                handler = previous.get(signal.SIGTERM)
                if exc.reason == "SIGTERM" and callable(handler) and not handled_outside():
                    # Any other SIGTERM to a worker's flow-run process (the machine shutting
                    # down), now that the work is saved, goes on to the handler it replaced
                    # (Prefect's: the run ends Crashed).
                    handler(signal.SIGTERM, None)
                    raise
                # A Ctrl-C or SIGTERM to `campaign run`: an interruption, not a failure.
                end = CampaignEnd(cancelled=f"{exc}; rerun to resume")
    return end.state()


def _opened_and_locked(
    spec: str | CampaignSpec | OpenCampaign,
    *,
    out: str,
    decision_mode: Literal["auto", "ask"] | None,
    base_dir: str | None,
    relaunch: int,
) -> CampaignEnd:
    """The campaign opened (unless ``campaign run`` did), then run under its locks."""
    try:  # before the folder is written (the lock writes it) and before the audit
        if isinstance(spec, OpenCampaign):
            opened = spec
        else:  # its store's probe waits out an outage: said in the run's logs
            with relay_outages(name=spec_name(spec, out=out), out=out):
                opened = open_campaign(spec, out, base_dir=base_dir)
        # A deployment's machines share no local folder (preflight/machines.py).
        refuse_machines_without_store(
            opened.spec, machines=opened.plan.machines, deployment=from_deployment()
        )
    except InputError as exc:
        return _refused(exc)
    if opened.sealed is not None:  # closed for good: verified, never closed again
        return _already_closed(opened)
    out = str(opened.folder.root)
    tag = CAMPAIGN_TAG.format(name=opened.name)
    tag_flow_run(tag)
    # One copy per campaign across hosts (S3 store: orchestration/campaign_lock.py), and one
    # writer per output folder (`campaign run` holds it already: re-entrant).
    with (
        relay_outages(name=opened.name, out=out),  # the store's outage: in the run's logs
        campaign_lock(opened.spec, tag=tag, lease_s=opened.spec.gpu_lock.lease_s),
    ):
        # Under the campaign lock, before the folder is written: a host whose folder is older
        # than the campaign another host sealed in the store is refused (preflight/stale.py).
        try:
            fence = fence_sealed_store(out, spec=opened.spec)
        except InputError as exc:
            return _refused(exc)
        with writer_lock(out) as took_over:
            if took_over:
                get_run_logger().warning(took_over)
            if closed := close_dead_copies(tag):
                get_run_logger().warning(
                    "closed the task runs and GPU tags left open by crashed copies of this "
                    "campaign: %s",
                    ", ".join(closed),
                )
            return _campaign(opened, decision_mode=decision_mode, relaunch=relaunch, fence=fence)


def _already_closed(opened: OpenCampaign) -> CampaignEnd:
    """A rerun of a campaign closed for good: its folder verified against its manifest, nothing
    written (Failed only when it no longer verifies)."""
    summary = recheck_sealed(opened.folder.root, expect=opened.sealed or "")
    said = summary.pop("already_closed")
    get_run_logger().warning(said)
    failed = None
    if not summary["verified"]:
        failed = f"{said} Problems: {'; '.join(summary['problems'])}"
    elif summary["verdict"].get("kind") == "stopped":  # as its first run ended
        failed = f"campaign stopped: {summary['verdict'].get('text')} ({said})"
    return CampaignEnd(summary=cast(CampaignSummary, summary), failed=failed)


def _cancelling() -> bool:
    """True when this flow run is being cancelled on the Prefect server (or already is).

    Prefect's own cancellation path cannot take this SIGTERM: the worker asks the flow-run
    process to acknowledge the cancel before it signals, and the engine acknowledges only while
    its own SIGTERM handler is installed, which ``graceful_signals`` replaced so that the
    training can save first. Without an acknowledgement the engine ends the run Crashed; the
    flow ends it Cancelled itself, since the server says a cancel was asked.
    """
    ctx = FlowRunContext.get()
    if ctx is None or ctx.flow_run is None:
        return False
    try:
        with get_client(sync_client=True) as client:
            state = client.read_flow_run(ctx.flow_run.id).state
    except Exception:  # the server unreachable: not a cancellation we can confirm
        return False
    return state is not None and (state.is_cancelling() or state.is_cancelled())


def _campaign(
    opened: OpenCampaign,
    *,
    decision_mode: Literal["auto", "ask"] | None,
    relaunch: int = 0,
    fence: Fence | None = None,
) -> CampaignEnd:
    """The flow's body (see ``campaign``); ``fence``: the store's manifest as the run found it
    (its close mirrors only over that one)."""
    logger = get_run_logger()
    cs, base, folder = opened.spec, opened.base_dir, opened.folder
    try:
        if start_folder(opened):
            logger.warning(
                "a fresh output folder on %s: its timeline starts from the copy in %s (the "
                "segments of the host that ran the campaign before, a loss among them)",
                socket.gethostname(),
                cs.storage.url,
            )
    except InputError as exc:
        return _refused(exc)
    catalog, plan0 = opened.catalog, opened.plan
    folder.write_plan_once(plan0.to_dict())
    keep_inputs(folder.root, cs, base_dir=base)
    campaign_id = _campaign_id(cs, folder)
    create_markdown_artifact(
        markdown=f"Output folder: `{folder.root}`\n\n" + calendar.render_markdown(plan0),
        key=artifact_key("plan", cs.name, campaign_id),
        description=f"The plan as written at the start, never rewritten ({folder.root})",
    )
    if (
        where := one_process_line(plan0.machines, distributed=on_machines(cs, plan=plan0))
    ) is not None:
        logger.info(where)  # several machines: whether each runs its own lanes, in one line
    note = ensure_gpu_limit(cs.gpu_lock.name, slots=plan0.gpu_lanes, clear_stale=embedded_api())
    say_lock_note(note, logger=logger)  # what it made in our words, a held slot as a warning

    decision: Decision | None = None
    analyses: dict[str, dict[str, Any]] = {}
    common = {"base_dir": str(base), "out": str(folder.root)}
    essential_stop = _stop_of(data_audit.submit(cs, **common))
    early: LotEnded | LanesLeft | None = None  # closed with what is done, resumable
    while essential_stop is None:
        try:
            decision, essential_stop, analyses = _experiments(
                cs,
                catalog=catalog,
                folder=folder,
                common=common,
                plan=plan0,
                mode=decision_mode or cs.decision_point.mode,
                campaign_id=campaign_id,
            )
            break
        except LotEnded as exc:  # every run saved; on a later open lot the campaign goes on
            if not after_lot_end(cs, exc, campaign_id=campaign_id, out=common["out"]):
                early = exc
                break
        except LanesLeft as exc:  # a machine's lane unfinished, no machine left to take it
            early = exc
            break
    closed = close_campaign(
        cs, campaign_id=campaign_id, catalog=catalog, analyses=analyses, **common
    )
    verified = seal(cs, out=str(folder.root), closed=closed)
    mirrored = mirror(cs, out=str(folder.root), fence=fence)
    logger.info("answer of %s: %s", campaign_id, closed["verdict"].get("answer"))
    logger.info("verdict of %s: %s", campaign_id, closed["verdict"]["text"])
    summary: CampaignSummary = {
        "campaign_id": campaign_id,
        "out": str(folder.root),
        "verdict": closed["verdict"],
        "spent_usd": closed["spent_usd"],
        "rental_per_accepted_usd": closed["rental_per_accepted_usd"],
        "runs": {rid: info["status"] for rid, info in closed["expected_runs"].items()},
        "decision": decision.model_dump(mode="json") if decision else None,
        "verified": verified["verified"],
        "problems": verified["problems"],
        "manifest_sha256": verified.get("manifest_sha256"),
        "mirrored": mirrored,
        "essential_stop": essential_stop.to_record() if essential_stop else None,
    }
    if early is not None:
        return _closed_resumable(cs, early, campaign_id=campaign_id, summary=summary)
    return _closed(
        cs, campaign_id=campaign_id, summary=summary, verdict=closed["verdict"], stop=essential_stop
    )


def _closed_resumable(
    cs: CampaignSpec, early: LotEnded | LanesLeft, *, campaign_id: str, summary: CampaignSummary
) -> CampaignEnd:
    """The flow's end when a lot ended under it, or machines left their lanes unfinished with
    no machine to take their runs: closed with what is done, Cancelled and resumable; what is
    left, why and where it goes on, in the log and notified."""
    if isinstance(early, LotEnded):
        message = closed_at_lot_end(cs, early, campaign_id=campaign_id, out=summary["out"])
    else:
        message = f"the campaign closed with what is done: {early}"
        get_run_logger().warning(message)
        notify.lot_ended(campaign=campaign_id, name=cs.name, message=message, out=summary["out"])
    return CampaignEnd(summary={**summary, "lot_ended": message}, cancelled=message)


def _closed(
    cs: CampaignSpec,
    *,
    campaign_id: str,
    summary: CampaignSummary,
    verdict: dict[str, Any],
    stop: StopRule | None,
) -> CampaignEnd:
    """The flow's end after the close: notified, Failed when stopped or not verified."""
    failed = ""
    if stop is not None:
        failed = f"campaign stopped: {stop}"
    elif not summary["verified"]:
        failed = "the output folder did not verify: see the manifest task's log"
    notify.campaign_closed(
        campaign=campaign_id,
        name=cs.name,
        answer=str(verdict.get("answer") or verdict.get("text") or ""),
        verdict=str(verdict.get("kind") or "?"),
        out=summary["out"],
        failed=failed,
    )
    return CampaignEnd(summary=summary, failed=failed or None)


def _experiments(
    cs: CampaignSpec,
    *,
    catalog: Any,
    folder: OutputFolder,
    common: dict[str, str],
    mode: str,
    plan: Plan,
    campaign_id: str,
) -> tuple[Decision, StopRule | None, dict[str, dict[str, Any]]]:
    """Pilot, decision point, the runs under the GPU lock, restart verification, predictions."""
    logger = get_run_logger()
    earlier = {s.stop_id for s in read_stops(folder.root)}  # a rerun's stops are not news
    measured = read_pilot(folder.root)
    pilot_exc = _pilot_every_run(cs, measured=measured, common=common)
    pilot_stops = [{**stop.to_record(), "run": run} for run, stop in pilot_exc.items()]
    write_pilot(folder.root, measured)

    decision = decision_point(
        cs,
        catalog=catalog,
        pilot=measured,
        pilot_stops=pilot_stops,
        mode=mode,
        out=str(folder.root),
        campaign_id=campaign_id,
    )
    if decision.action == "re-pose":
        logger.warning("decision point: re-pose the question: %s", "; ".join(decision.reasons))
        # A stop in an essential run's pilot is an essential stop: the flow ends Failed.
        stops = essential_pilot_stops(cs, pilot_stops=pilot_exc)
        for run, rule in stops:
            notify.essential_stop(campaign=campaign_id, name=cs.name, run=run, stop=str(rule))
        return decision, (stops[0][1] if stops else None), {}

    ended: list[LotEnded] = []
    if on_machines(cs, plan=plan):  # each lot's lanes on its machine, through its work queue
        recorded = run_on_machines(cs, plan=plan, dropped=decision.dropped_runs, folder=folder)
        restart_future = restart_verification.submit(
            cs, run="control", return_state=False, **common
        )
        futures: dict[str, Any] = dict.fromkeys(recorded)
    else:  # every lane a thread of this process
        recorded = {}
        futures, restart_future = _submit_in_lanes(
            cs, plan=plan, dropped=decision.dropped_runs, common=common
        )
    run_stops: dict[str, StopRule] = {}
    for run, fut in futures.items():  # each stop is said as soon as its run ends
        stop = recorded[run] if run in recorded else _stop_or_lot_end(fut, ended)
        if stop is not None:
            run_stops[run] = stop
            if stop.stop_id in earlier:
                logger.info("run '%s' stopped in an earlier start, as recorded: %s", run, stop)
            else:
                _say_stop(cs, run=run, stop=stop, campaign_id=campaign_id)
    restart_stop = _stop_or_lot_end(restart_future, ended)
    if ended:
        raise ended[0]
    essential_stop = campaign_stop(cs, run_stops=run_stops, restart_stop=restart_stop)
    states = run_states(cs, root=folder.root, decision=decision)
    with_model = runs_with_model(states, root=folder.root)
    analyses = predictions(cs, runs=with_model, **common) if with_model else {}
    if essential_stop is None:  # the evidence the verdict still lacks, bought in the lot
        analyses |= buy_rounds(
            cs, catalog=catalog, folder=folder, common=common, mode=mode, campaign_id=campaign_id
        )
    return decision, essential_stop, analyses


def _say_stop(cs: CampaignSpec, *, run: str, stop: StopRule, campaign_id: str) -> None:
    """Log a run's stop as what it does to the campaign; notify an essential stop."""
    logger = get_run_logger()
    effect = stop_effect(cs, run=run, stop=stop)
    if effect == "evidence":
        logger.warning(
            "essential run '%s' stopped after measuring: its values are evidence for the "
            "verdict, the campaign goes on to its decision: %s",
            run,
            stop,
        )
    elif effect == "ends":  # a stop the campaign handles: it closes with it, no error
        logger.warning("essential run '%s' stopped; the campaign closes: %s", run, stop)
        notify.essential_stop(campaign=campaign_id, name=cs.name, run=run, stop=str(stop))
    else:
        logger.warning(
            "optional run '%s' stopped and is recorded; the campaign goes on: %s", run, stop
        )


def _pilot_every_run(
    cs: CampaignSpec, *, measured: dict[str, Any], common: dict[str, str]
) -> dict[str, StopRule]:
    """A short pilot of every run not yet measured, one after the other under the GPU lock:
    the essential runs first, then (unless one of them stopped, which re-poses the question
    whatever the others show) the optional ones. Each run is re-forecast from its own step
    time and its early curve compared with the control's.

    Returns:
        The stop of each pilot that tripped a stop rule; ``measured`` gains the others.
    """
    stops: dict[str, StopRule] = {}
    ended: list[LotEnded] = []
    tail: Any = None
    optional = [r for r in cs.runs_by_tier() if cs.tier_of(r) != "essential"]
    for group in (cs.essential_runs(), optional):
        if stops:
            break
        futures = {}
        # A run with a result needs no pilot (a campaign extended in place, a round's seeds).
        done = {r for r in group if read_result(common["out"], cs.resolve_run(r).run_id)}
        for r in [r for r in group if r not in measured and r not in done]:
            futures[r] = pilot.submit(
                cs,
                run=r,
                return_state=False,  # Prefect's overloads take wait_for only beside it
                wait_for=[allow_failure(tail)] if tail is not None else None,
                **common,
            )
            tail = futures[r]
        for run, fut in futures.items():
            before = len(ended)
            stop = _stop_or_lot_end(fut, ended)
            if len(ended) > before:
                continue
            if stop is None:
                measured[run] = fut.result()
            else:
                stops[run] = stop
        if ended:
            raise ended[0]
    return stops


def _submit_in_lanes(
    cs: CampaignSpec, *, plan: Plan, dropped: list[str], common: dict[str, str]
) -> tuple[dict[str, Any], Any]:
    """Submit the runs and the restart check as one chain per GPU lane, as the plan placed them
    (``plan.lanes.lane_order``: essential runs, the restart check, then the others).

    Each chain starts its next phase when the previous one ends (failed or not), so the GPU
    lock is taken at once instead of being polled for; the lock still orders this campaign
    against any other flow holding it.
    """
    tails: dict[int, Any] = {}
    futures: dict[str, Any] = {}
    restart_future = None
    for lane, item in lane_order(plan, spec=cs, dropped=dropped):
        wait = [allow_failure(tails[lane])] if lane in tails else []
        if item is RESTART_CHECK:  # it resumes the control's own early save: after the control
            control = futures.get("control")
            if control is not None and tails.get(lane) is not control:
                wait.append(allow_failure(control))
            restart_future = tails[lane] = restart_verification.submit(
                cs, run="control", return_state=False, wait_for=wait or None, **common
            )
        else:
            futures[item] = tails[lane] = train.submit(
                cs, run=item, lane=lane, return_state=False, wait_for=wait or None, **common
            )
    return futures, restart_future


def _campaign_id(cs: CampaignSpec, folder: OutputFolder) -> str:
    """The campaign's ID, fixed at its first start: ``<name>-<UTC start>-<spec sha256[:8]>``."""
    return fix_campaign_id(folder.root, name=cs.name, spec_sha256=spec_sha256(cs))
