"""What the campaign flow does when a lot ends under it (``engine/lotend.py`` stopped its runs).

Every run saved before the lot's end. On a later lot whose window is open (the spec's lots, and
this machine not pinned to the ended one by ``GPUCAMPAIGN_LOT``), the flow goes on there: the
runs resume from the store. Otherwise the campaign closes with what it has (report, manifest,
the folder copied to an S3 store), and a rerun on a new lot resumes from the checkpoints.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Any

from prefect import get_run_logger
from prefect.states import Cancelled

from gpucampaign.engine.lotend import LotEnded
from gpucampaign.plan.lots import LOT_ENV, Lot, dated_lots, next_lot, pinned_lot
from gpucampaign.spec import CampaignSpec
from gpucampaign_prefect.orchestration import notify


def relaunch_refused(cs: CampaignSpec, *, relaunch: int) -> str | None:
    """Why a relaunched run does not start (beyond ``checkpoint.max_relaunches``), said in the
    log; None when it starts (a relaunch within the bound is said too)."""
    if relaunch <= 0:
        return None
    bound = cs.checkpoint.max_relaunches
    if relaunch > bound:
        why = (
            f"relaunch {relaunch} of campaign '{cs.name}' after a crash refused: "
            f"checkpoint.max_relaunches is {bound}; find why its machines die, then run the "
            "deployment again (it resumes from the store)"
        )
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


def _next(cs: CampaignSpec, exc: LotEnded) -> Lot | None:
    ended = {lot.number: lot for lot in dated_lots(cs)}.get(exc.lot)
    if ended is None:
        return None
    return next_lot(cs, now=datetime.now(UTC), after=ended, margin_s=exc.margin_s)


def _kept(exc: LotEnded) -> str:
    if exc.off_machine:
        return ""
    return (
        " WARNING: the checkpoint is NOT off the machine (see above): copy the output folder "
        "before the machine goes away, or use an s3:// store."
    )


def after_lot_end(cs: CampaignSpec, exc: LotEnded, *, campaign_id: str, out: str) -> bool:
    """Whether the campaign goes on here on a later open lot (said in the log and notified).

    False when no later lot is open, or when this machine is pinned to the lot that ended.
    """
    nxt = _next(cs, exc)
    if nxt is None or pinned_lot(cs, os.environ) is not None:
        return False
    message = (
        f"{exc}. The campaign goes on on {nxt.label}: the runs resume from their checkpoints."
        + _kept(exc)
    )
    get_run_logger().warning(message)
    notify.lot_ended(campaign=campaign_id, name=cs.name, message=message, out=out)
    return True


def closed_at_lot_end(
    cs: CampaignSpec, exc: LotEnded, *, campaign_id: str, summary: dict[str, Any]
) -> Any:
    """The flow's end after a lot ended with no lot to go on to: Cancelled, resumable, said
    in the log and notified."""
    nxt = _next(cs, exc)
    pinned = pinned_lot(cs, os.environ)
    if nxt is not None and pinned is not None:
        where = (
            f"{nxt.label} is open, but this machine belongs to lot {pinned.number} "
            f"({LOT_ENV}={os.environ.get(LOT_ENV)}): run the campaign again on a machine of "
            f"lot {nxt.number} ({LOT_ENV}={nxt.number}) to continue from the store."
        )
    else:
        where = (
            "No later lot of the spec is open: the campaign closed with what it has; run it "
            "again on a new lot (a later lot in the spec) and it resumes from its checkpoints."
        )
    message = f"{exc}. {where}{_kept(exc)}"
    get_run_logger().warning(message)
    notify.lot_ended(campaign=campaign_id, name=cs.name, message=message, out=summary["out"])
    return Cancelled(message=message, data={**summary, "lot_ended": message})
