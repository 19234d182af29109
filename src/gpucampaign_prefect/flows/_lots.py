"""What the campaign flow does when a lot ends under it (``engine/lotend.py`` stopped its runs).

Every run saved before the lot's end. On a later lot whose window is open (the spec's lots, and
this machine not pinned to the ended one by ``GPUCAMPAIGN_LOT``), the flow goes on there: the
runs resume from the store. A later lot that names its ``work_queue`` runs on other machines:
the flow closes with what it has and hands the campaign over, running its own deployment again
on that queue with the same parameters (``GPUCAMPAIGN_LOT`` naming that lot); the new flow run
waits for the campaign lock this one gives back as it ends, and resumes from the store.
Otherwise the campaign closes with what it has (report, manifest, the folder copied to an S3
store), and a rerun on a new lot resumes from the checkpoints.
"""

from __future__ import annotations

import os
from typing import Any

from prefect import get_client, get_run_logger
from prefect.client.schemas.objects import FlowRun
from prefect.context import FlowRunContext
from prefect.deployments import run_deployment

from gpucampaign.config import CampaignSpec, load_spec
from gpucampaign.core import clock
from gpucampaign.core.errors import InputError
from gpucampaign.engine.lotend import LotEnded
from gpucampaign.plan.lots import LOT_ENV, Lot, dated_lots, next_lot, pinned_lot
from gpucampaign.preflight import OpenCampaign
from gpucampaign_prefect.orchestration import notify

#: The largest ``relaunch`` a flow run may be given: ``checkpoint.max_relaunches``'s own limit.
MAX_RELAUNCH = 100


def relaunch_refused(
    spec: str | CampaignSpec | OpenCampaign, *, relaunch: Any, name: str = ""
) -> str | None:
    """Why a relaunched run does not start, said in the log (the run then ends Failed, which
    ends the crash loop and is notified once); None when it starts (a relaunch within the
    bound is said too).

    Read first, before the spec's preflight (a recipe that kills its process there would
    otherwise loop), any lock or any read of the store: ``relaunch`` must be a whole number from
    0 to ``MAX_RELAUNCH``, and a relaunch counts against ``checkpoint.max_relaunches``, read
    from the spec file alone. A spec that does not load is refused by the opening that follows.
    """
    if isinstance(relaunch, bool) or not isinstance(relaunch, int):
        relaunch = None
    if relaunch is None or not 0 <= relaunch <= MAX_RELAUNCH:
        why = (
            f"parameter 'relaunch' refused: it counts the relaunches of a crashed campaign, a "
            f"whole number from 0 to {MAX_RELAUNCH} that the relaunch automation sets; give 0 "
            "(or leave it out) to start the campaign"
        )
        get_run_logger().error(why)
        return why
    if relaunch == 0:
        return None
    try:
        cs = spec.spec if isinstance(spec, OpenCampaign) else _spec_only(spec)
    except InputError:
        return None
    bound = cs.checkpoint.max_relaunches
    if relaunch > bound:
        why = (
            f"relaunch {relaunch} of campaign '{cs.name}' after a crash refused: "
            f"checkpoint.max_relaunches is {bound}; find why its machines die, then run the "
            "deployment again (it resumes from the store)"
        )
        # The run ends Failed, not Crashed: the relaunch automation does not run it again, and
        # the failed-run automation sends this message once.
        get_run_logger().error(why)
        return why
    get_run_logger().warning(
        "relaunch %d of %d of campaign '%s' after its flow run crashed: the runs resume from "
        "their checkpoints in the store",
        relaunch,
        bound,
        cs.name,
    )
    return None


def _spec_only(spec: str | CampaignSpec) -> CampaignSpec:
    """The spec, parsed only (no preflight, no store, no recipe imported)."""
    return spec if isinstance(spec, CampaignSpec) else load_spec(spec)


def _next(cs: CampaignSpec, exc: LotEnded) -> Lot | None:
    ended = {lot.number: lot for lot in dated_lots(cs)}.get(exc.lot)
    if ended is None:
        return None
    return next_lot(cs, now=clock.now(), after=ended, margin_s=exc.margin_s)


def _kept(exc: LotEnded) -> str:
    if exc.off_machine:
        return ""
    return (
        " WARNING: the checkpoint is NOT off the machine (see above): copy the output folder "
        "before the machine goes away, or use an s3:// store."
    )


def _elsewhere(lot: Lot) -> bool:
    """Whether ``lot`` runs on another work queue than this flow run's."""
    ctx = FlowRunContext.get()
    here = ctx.flow_run.work_queue_name if ctx is not None and ctx.flow_run is not None else None
    return lot.work_queue is not None and lot.work_queue != here


def after_lot_end(cs: CampaignSpec, exc: LotEnded, *, campaign_id: str, out: str) -> bool:
    """Whether the campaign goes on here on a later open lot (said in the log and notified).

    False when no later lot is open, when this machine is pinned to the lot that ended, or when
    the later lot runs on another work queue (the close hands the campaign over to it).
    """
    nxt = _next(cs, exc)
    if nxt is None or pinned_lot(cs, os.environ) is not None or _elsewhere(nxt):
        return False
    message = (
        f"{exc}. The campaign goes on on {nxt.label}: the runs resume from their checkpoints."
        + _kept(exc)
    )
    get_run_logger().warning(message)
    notify.lot_ended(campaign=campaign_id, name=cs.name, message=message, out=out)
    return True


def closed_at_lot_end(cs: CampaignSpec, exc: LotEnded, *, campaign_id: str, out: str) -> str:
    """The flow's end after a lot ended with no lot to go on to (the flow ends Cancelled,
    resumable): what it says, in the log and notified."""
    nxt = _next(cs, exc)
    pinned = pinned_lot(cs, os.environ)
    if nxt is not None and _elsewhere(nxt):
        where = _hand_over(nxt)
    elif nxt is not None and pinned is not None:
        where = (
            f"{nxt.label} is open, but this machine belongs to lot {pinned.number} "
            f"({LOT_ENV}={os.environ.get(LOT_ENV)}): run the campaign again on a machine of "
            f"lot {nxt.number} ({LOT_ENV}={nxt.number}) to continue from the store, or name "
            "its workers' queue in the lot's work_queue to hand the campaign over by itself."
        )
    else:
        where = (
            "No later lot of the spec is open: the campaign closed with what it has; run it "
            "again on a new lot (a later lot in the spec) and it resumes from its checkpoints."
        )
    message = f"{exc}. {where}{_kept(exc)}"
    get_run_logger().warning(message)
    notify.lot_ended(campaign=campaign_id, name=cs.name, message=message, out=out)
    return message


def _hand_over(lot: Lot) -> str:
    """Run this flow run's deployment again on ``lot``'s work queue, with the same parameters
    and ``GPUCAMPAIGN_LOT`` naming ``lot``; the sentence that says where the campaign goes on.

    The new flow run waits for the campaign lock until this one ends, then resumes from the
    store. A flow run of no deployment (``campaign run``) cannot be handed over: said so.
    """
    ctx = FlowRunContext.get()
    run = ctx.flow_run if ctx is not None else None
    if run is None or run.deployment_id is None:
        return (
            f"{lot.label} runs on work queue '{lot.work_queue}', and this flow run is not a "
            "deployment's, so it cannot be handed over there: run the campaign's deployment on "
            f"that queue ({LOT_ENV}={lot.number}) to continue from the store."
        )
    try:
        with get_client(sync_client=True) as client:
            deployment = client.read_deployment(run.deployment_id)
        variables = {**(deployment.job_variables or {}), **(run.job_variables or {})}
        variables["env"] = {**(variables.get("env") or {}), LOT_ENV: str(lot.number)}
        successor = run_deployment(
            name=run.deployment_id,
            parameters=dict(run.parameters),
            work_queue_name=lot.work_queue,
            job_variables=variables,
            timeout=0,
            as_subflow=False,
            _sync=True,  # type: ignore[call-arg]  # async_dispatch's switch, not in the signature
        )
    except Exception as exc:  # the server out: the campaign is closed and resumable all the same
        return (
            f"HANDING OVER FAILED ({type(exc).__name__}: {exc}): run the campaign's deployment "
            f"'{run.deployment_id}' on work queue '{lot.work_queue}' of {lot.label} "
            f"({LOT_ENV}={lot.number}) to continue from the store."
        )
    assert isinstance(successor, FlowRun)
    return (
        f"The campaign is handed over to {lot.label}: flow run '{successor.name}' "
        f"({successor.id}) of this deployment, on work queue '{lot.work_queue}', resumes from "
        "the store once this one has ended."
    )
