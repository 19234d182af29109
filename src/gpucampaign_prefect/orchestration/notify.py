"""What the campaign tells a person: Prefect events that the server's automations turn into
notifications (``infra/automations.py``: a webhook, Slack, email).

Each event is ``gpucampaign.<what>`` on the resource ``gpucampaign.campaign.<campaign ID>``,
with the message already written in its payload (``subject``, ``body``) beside the facts it
was written from, so one automation template (``{{ event.payload.body }}``) serves every kind.
Without automations (embedded Prefect, or no notification target) the events are only listed
in the UI's event feed. Emitting never fails the campaign. Where a notification goes (the
webhook's URL and its token) is only in the server's notification block, in its secret field:
no event names it.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from prefect.events import emit_event
from prefect.runtime import flow_run

from gpucampaign.folder.records import read_campaign_id

#: The events this module emits (the automations of infra/automations.py match these names).
DECISION_WAITING = "gpucampaign.decision.waiting"
ESSENTIAL_STOP = "gpucampaign.run.essential-stop"
CAMPAIGN_CLOSED = "gpucampaign.campaign.closed"
RENTAL_ENDING = "gpucampaign.rental.ending"
STORAGE_UNREACHABLE = "gpucampaign.storage.unreachable"
LOT_ENDED = "gpucampaign.lot.ended"
STORAGE_DOWN = "gpucampaign.storage.down"
STORAGE_RECOVERED = "gpucampaign.storage.recovered"

_log = logging.getLogger("gpucampaign.notify")


def campaign_id_of(out: str | Path) -> str:
    """The campaign ID an output folder recorded at its first start ('' when unknown)."""
    return read_campaign_id(out) or ""


def ui_link() -> str:
    """The Prefect UI's page of the current flow run ('' outside a run or without a UI URL)."""
    try:
        return str(flow_run.ui_url or "")
    except Exception:
        return ""


def emit(event: str, *, campaign: str, name: str, subject: str, body: str, **facts: Any) -> bool:
    """Emit one notification event; returns whether it was handed to Prefect.

    Args:
        event: one of the names above.
        campaign: the campaign's ID (or its name when no ID exists yet): the event's resource.
        name: the campaign's name, shown in the UI's event feed.
        subject: the notification's subject line.
        body: its text; the flow run's UI link is appended when there is one.
        facts: what the message was written from (JSON values), kept in the payload.
    """
    link = ui_link()
    if link:
        body = f"{body}\n{link}"
    try:
        sent = emit_event(
            event=event,
            resource={
                "prefect.resource.id": f"gpucampaign.campaign.{campaign}",
                "prefect.resource.name": name,
            },
            payload={"subject": subject, "body": body, "ui_url": link, **facts},
        )
    except Exception as exc:  # a notification never stops a campaign
        _log.warning("could not emit %s: %s", event, exc)
        return False
    return sent is not None


def decision_waiting(
    *,
    campaign: str,
    name: str,
    proposal: str,
    reasons: list[str],
    timeout_s: float,
    now: datetime | None = None,
) -> bool:
    """A decision point waits for a person: the proposal, and the deadline in UTC after which
    the proposal is taken."""
    deadline = (now or datetime.now(UTC)) + timedelta(seconds=timeout_s)
    at = deadline.strftime("%Y-%m-%d %H:%M:%S UTC")
    why = "; ".join(reasons) or "no reason given"
    return emit(
        DECISION_WAITING,
        campaign=campaign,
        name=name,
        subject=f"gpucampaign: {name} waits for your decision until {at}",
        body=(
            f"Campaign {campaign} paused at its decision point after the pilot; the rented GPU "
            f"waits. Proposed: {proposal} ({why}). Answer in the Prefect UI (Resume, on the "
            f"flow run's page) before {at}; after that the proposal is taken."
        ),
        proposal=proposal,
        reasons=reasons,
        deadline_utc=deadline.isoformat(timespec="seconds"),
    )


def essential_stop(*, campaign: str, name: str, run: str, stop: str) -> bool:
    """A stop rule ended an essential run: the campaign cannot answer its question as planned."""
    return emit(
        ESSENTIAL_STOP,
        campaign=campaign,
        name=name,
        subject=f"gpucampaign: {name}: essential run '{run}' stopped",
        body=f"Campaign {campaign}: a stop rule ended the essential run '{run}': {stop}",
        run=run,
        stop=stop,
    )


def campaign_closed(
    *, campaign: str, name: str, answer: str, verdict: str, out: str, failed: str = ""
) -> bool:
    """The campaign closed: its answer sentence (and why it ended Failed, if it did)."""
    tail = f" It ended Failed: {failed}." if failed else ""
    return emit(
        CAMPAIGN_CLOSED,
        campaign=campaign,
        name=name,
        subject=f"gpucampaign: {name} closed: {verdict}",
        body=f"Campaign {campaign} closed. {answer} Output folder: {out}.{tail}",
        answer=answer,
        verdict=verdict,
        out=out,
    )


def rental_ending(*, campaign: str, name: str, message: str, out: str) -> bool:
    """The scheduled check found the rental's end near while files are only on the machine."""
    return emit(
        RENTAL_ENDING,
        campaign=campaign,
        name=name,
        subject=f"gpucampaign: {name}: the rental ends while files are only local",
        body=f"Campaign {campaign} ({out}): {message}",
        out=out,
    )


def lot_ended(*, campaign: str, name: str, message: str, out: str) -> bool:
    """A lot ended: the runs saved before it; where the campaign goes on (or that it closed
    with what it has, resumable)."""
    return emit(
        LOT_ENDED,
        campaign=campaign,
        name=name,
        subject=f"gpucampaign: {name}: the lot ended",
        body=f"Campaign {campaign} ({out}): {message}",
        out=out,
    )


def storage_unreachable(
    *, campaign: str, name: str, run_id: str, pending: int, out: str, store: str, error: str
) -> bool:
    """The S3 store stopped taking uploads: checkpoint files wait in the local spool.

    Args:
        store: the store's URL (``storage.url``).
        error: what the store answered to the refused upload ('' when unknown).
    """
    why = f" ({error})" if error else ""
    return emit(
        STORAGE_UNREACHABLE,
        campaign=campaign,
        name=name,
        subject=f"gpucampaign: {name}: the S3 store stopped taking uploads",
        body=(
            f"Campaign {campaign}, run {run_id}: the S3 store {store} did not take an "
            f"upload{why}. {pending} checkpoint file(s) are only on this machine (spooled in "
            f"{out}/spool, retried in the background). Check the S3 server; "
            f"`campaign status {out}` says what is not yet off the machine."
        ),
        run_id=run_id,
        pending=pending,
        out=out,
        store=store,
        error=error,
    )


def storage_down(*, campaign: str, name: str, store: str, what: str, error: str) -> bool:
    """The store stopped answering: said once per outage for the whole campaign, however many
    tasks meet it (``storage.outage.Outages`` says it once).

    Args:
        store: the store's URL (``storage.url``; never a key or the endpoint's credentials).
        what: what met the outage first (a read or an upload, by its key).
        error: what the store answered, redacted.
    """
    return emit(
        STORAGE_DOWN,
        campaign=campaign,
        name=name,
        subject=f"gpucampaign: {name}: the S3 store does not answer",
        body=(
            f"Campaign {campaign}: the S3 store {store} does not answer ({error}); found "
            f"{what}. Reads wait for it (up to storage.read_wait_s), checkpoints wait in the "
            "local spool, training goes on. A message follows when the store answers again."
        ),
        store=store,
        what=what,
        error=error,
    )


def storage_recovered(*, campaign: str, name: str, store: str, lasted_s: float) -> bool:
    """The store answers again after an outage said by ``storage_down``."""
    return emit(
        STORAGE_RECOVERED,
        campaign=campaign,
        name=name,
        subject=f"gpucampaign: {name}: the S3 store answers again",
        body=(
            f"Campaign {campaign}: the S3 store {store} answers again after {lasted_s:.0f} s: "
            "the reads go on and the spool uploads what waits in it."
        ),
        store=store,
        lasted_s=round(lasted_s, 1),
    )
