"""The Prefect automations of a gpucampaign server, created or updated in place (idempotent).

Run by ``infra/stack.sh up`` (and ``infra/stack.sh automations`` for a server you already run,
with ``PREFECT_API_URL`` set):

- ``gpucampaign: dead runs are Crashed``: a flow run whose heartbeats stop for
  ``--crashed-after`` seconds (its process or its machine died, the worker with it) is set
  Crashed, so the UI and the GPU lock's holders tell the truth. The flow-run processes must send
  heartbeats (``PREFECT_FLOWS_HEARTBEAT_FREQUENCY``, set on the stack's worker) more often than
  that window.
- ``gpucampaign: relaunch a crashed campaign``: a campaign flow run of a deployment that ends
  Crashed (its machine died: the automation above, or a SIGTERM that was not a cancellation) is
  run again with the same parameters and ``relaunch`` one higher, on any worker of the pool; it
  resumes from the store, and refuses to start beyond the spec's ``checkpoint.max_relaunches``.
  ``GPUCAMPAIGN_RELAUNCH=off`` removes it (no relaunch).
- An automation that is already set up as asked is left as it is: updating one resets its
  trigger, and a run that died before would never be seen (a stack restart must not blind
  the dead-run detector).
- With a notification target (``--notify-url`` / ``GPUCAMPAIGN_NOTIFY_URL``: a generic
  webhook that receives ``{"subject": ..., "body": ...}`` as JSON, kept in the Custom Webhook
  block ``gpucampaign-notify`` with its path, query and credentials in the block's secret
  field, masked in the UI; or ``--notify-block`` /
  ``GPUCAMPAIGN_NOTIFY_BLOCK``: ``<block-type-slug>/<name>`` of a notification block you created,
  e.g. ``slack-webhook/team`` or ``sendgrid-email/me``), one notifying automation per event:
  a flow run of ours Failed or Crashed, and the events the campaign's flows emit
  (``gpucampaign.*``, see ``gpucampaign_prefect/orchestration/notify.py``): a decision waits for
  a person, a stop rule ended an essential run, the campaign closed, the rental ends while
  files are only local, the S3 store stopped taking uploads, a lot ended, the S3 store does not
  answer and answers again (once per outage). Without a target no notifying automation
  exists (and any left from an earlier setup is removed): the script says so.

Usage: ``python infra/automations.py [--notify-url URL | --notify-block SLUG/NAME]
[--crashed-after SECONDS]``. Prints one line per automation.
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import timedelta
from typing import Any
from uuid import UUID

PREFIX = "gpucampaign: "
BLOCK_NAME = "gpucampaign-notify"
OUR_FLOWS = ["campaign", "restart-verification"]
DEFAULT_CRASHED_AFTER_S = 300
MIN_CRASHED_AFTER_S = 60  # heartbeats come every 30 s at the fastest

#: The events the campaign's flows emit (gpucampaign_prefect/orchestration/notify.py), each with
#: its automation's title.
CAMPAIGN_EVENTS: dict[str, str] = {
    "gpucampaign.decision.waiting": "a decision waits for a person",
    "gpucampaign.run.essential-stop": "a stop rule ended an essential run",
    "gpucampaign.campaign.closed": "the campaign closed",
    "gpucampaign.rental.ending": "the rental ends while files are only local",
    "gpucampaign.storage.unreachable": "the S3 store stopped taking uploads",
    "gpucampaign.lot.ended": "a lot ended: the campaign goes on or closed resumable",
    "gpucampaign.storage.down": "the S3 store does not answer (once per outage)",
    "gpucampaign.storage.recovered": "the S3 store answers again after an outage",
}

FLOW_RUN_BODY = (
    "Flow run {{ flow_run.name }} ({{ flow.name }}) ended {{ flow_run.state.name }} "
    "at {{ flow_run.state.timestamp }}.\n"
    "{{ flow_run.state.message or '' }}\n"
    "{{ flow_run|ui_url or '' }}"
)


#: Added to a crashed campaign's message while the relaunch automation is on: the run it makes
#: of the same deployment waits (as "Scheduled", then "Late") until a worker of the pool takes it.
RELAUNCH_NOTE = (
    "{% if flow_run.state.name == 'Crashed' and flow.name == 'campaign' "
    "and flow_run.deployment_id %}"
    "A relaunch of this campaign is waiting for a worker of its deployment's pool (relaunch "
    "{{ (flow_run.parameters.get('relaunch') or 0) + 1 }}, the same parameters; it resumes from "
    "the store, and refuses to start beyond the spec's checkpoint.max_relaunches). With no "
    "worker alive it waits until one starts: `prefect worker start --pool POOL`.\n"
    "{% endif %}"
)


def _fail(message: str) -> None:
    print(f"automations: error: {message}", file=sys.stderr)
    sys.exit(2)


def notification_block_id(client: Any, *, url: str, block: str) -> UUID | None:
    """The notification block to send through: ``block`` (``slug/name``, existing) or a generic
    webhook block on ``url`` (created or updated); None when neither is given."""
    if block:
        slug, sep, name = block.partition("/")
        if not sep or not slug or not name:
            _fail(
                f"GPUCAMPAIGN_NOTIFY_BLOCK must be '<block-type-slug>/<block-name>' (e.g. "
                f"'slack-webhook/team'), got '{block}': create the block in the UI or with "
                "its class's .save(), then name it here."
            )
        from prefect.exceptions import ObjectNotFound

        try:
            return client.read_block_document_by_name(name, block_type_slug=slug).id
        except ObjectNotFound:
            _fail(f"no notification block '{block}' on this server: create it first.")
    if not url:
        return None
    return UUID(str(webhook_block(url).save(BLOCK_NAME, overwrite=True)))


def split_webhook_url(url: str) -> tuple[str, dict[str, str]]:
    """``(template, secrets)`` of a webhook URL: the template keeps the scheme, host and port
    in clear and names the rest, the part that authorizes (a path token, a query, user:password),
    by placeholders whose values are in ``secrets`` (the block's secret field).

    Prefect fills the placeholders when it sends, so the URL used is ``url`` exactly.
    """
    scheme, sep, rest = url.partition("://")
    if scheme.lower() not in ("http", "https") or not sep:
        # The value may be a secret that went in the wrong variable: say only how it starts.
        _fail(
            "GPUCAMPAIGN_NOTIFY_URL must be an http(s) URL (https://host/...); the value set "
            "is not one (not shown: it may hold a secret)."
        )
    netloc_end = min((rest.find(c) for c in "/?#" if c in rest), default=len(rest))
    netloc, tail = rest[:netloc_end], rest[netloc_end:]
    userinfo, at, host = netloc.rpartition("@")
    if not host:
        _fail("GPUCAMPAIGN_NOTIFY_URL names no host (https://host/...).")
    secrets = {"webhook_path": tail}
    who = ""
    if at:
        secrets["webhook_userinfo"] = userinfo
        who = "{{webhook_userinfo}}@"
    return f"{scheme}://{who}{host}{{{{webhook_path}}}}", secrets


def webhook_block(url: str) -> Any:
    """Prefect's Custom Webhook block that posts ``{"subject", "body"}`` as JSON to ``url``,
    with the URL's secret part in its secret field (masked in the UI and in
    ``prefect block inspect``; the automations' notifications fill it in)."""
    from prefect.blocks.notifications import CustomWebhookNotificationBlock

    template, secrets = split_webhook_url(url)
    return CustomWebhookNotificationBlock(
        name="gpucampaign",
        url=template,
        secrets=secrets,
        json_data={"subject": "{{subject}}", "body": "{{body}}"},
    )


def crashed_automation(crashed_after_s: int) -> Any:
    """Prefect's zombie-run pattern: no heartbeat (nor end) for ``crashed_after_s`` -> Crashed."""
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture

    return AutomationCore(
        name=PREFIX + "dead runs are Crashed",
        description=(
            f"A flow run that sent no heartbeat for {crashed_after_s} s and did not end "
            "(its process or machine died) is set Crashed."
        ),
        trigger=EventTrigger(
            match={"prefect.resource.id": "prefect.flow-run.*"},
            after={"prefect.flow-run.heartbeat"},
            expect={
                "prefect.flow-run.heartbeat",
                "prefect.flow-run.Completed",
                "prefect.flow-run.Failed",
                "prefect.flow-run.Cancelled",
                "prefect.flow-run.Crashed",
            },
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=crashed_after_s),
        ),
        actions=[
            ChangeFlowRunState(
                state="CRASHED",
                message=f"no heartbeat for {crashed_after_s} s: its process or machine died",
            )
        ],
    )


#: The relaunched run's parameters: the crashed run's, with ``relaunch`` one higher (rendered by
#: the server, types kept through JSON).
RELAUNCH_PARAMETERS: dict[str, Any] = {
    "__prefect_kind": "json",
    "value": {
        "__prefect_kind": "jinja",
        "template": "{{ dict(flow_run.parameters, "
        "relaunch=(flow_run.parameters.get('relaunch') or 0) + 1) | tojson }}",
    },
}
RELAUNCH_NAME = PREFIX + "relaunch a crashed campaign"


def relaunch_automation() -> Any:
    """A crashed campaign flow run of a deployment -> the same deployment run again with the
    same parameters (``relaunch`` + 1), on any worker of its pool."""
    from prefect.events.actions import RunDeployment
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture

    return AutomationCore(
        name=RELAUNCH_NAME,
        description=(
            "A campaign flow run that ended Crashed (its process or machine died) is run again "
            "from its deployment with the same parameters and relaunch + 1; it resumes from "
            "the store and refuses beyond the spec's checkpoint.max_relaunches."
        ),
        trigger=EventTrigger(
            match={"prefect.resource.id": "prefect.flow-run.*"},
            match_related={"prefect.resource.role": "flow", "prefect.resource.name": "campaign"},
            expect={"prefect.flow-run.Crashed"},
            posture=Posture.Reactive,
            threshold=1,
            within=timedelta(0),
        ),
        actions=[RunDeployment(source="inferred", parameters=RELAUNCH_PARAMETERS)],
    )


def notify_automations(block_id: UUID, *, relaunching: bool = True) -> list[Any]:
    """The notifying automations: flow runs of ours Failed or Crashed (a crashed campaign's
    message says its relaunch waits, while ``relaunching``), and the campaign events."""
    from prefect.events.actions import SendNotification
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture

    ours = {"prefect.resource.role": "flow", "prefect.resource.name": OUR_FLOWS}
    found = [
        AutomationCore(
            name=PREFIX + "notify: a flow run failed or crashed",
            description="A campaign or restart-verification flow run ended Failed or Crashed.",
            trigger=EventTrigger(
                match={"prefect.resource.id": "prefect.flow-run.*"},
                match_related=ours,
                expect={"prefect.flow-run.Failed", "prefect.flow-run.Crashed"},
                posture=Posture.Reactive,
                threshold=1,
                within=timedelta(0),
            ),
            actions=[
                SendNotification(
                    block_document_id=block_id,
                    subject="gpucampaign: {{ flow_run.name }} {{ flow_run.state.name }}",
                    body=FLOW_RUN_BODY + ("\n" + RELAUNCH_NOTE if relaunching else ""),
                )
            ],
        )
    ]
    for event, title in CAMPAIGN_EVENTS.items():
        found.append(
            AutomationCore(
                name=PREFIX + "notify: " + title,
                description=f"Sends the message of the event {event} (emitted by the flows).",
                trigger=EventTrigger(
                    match={"prefect.resource.id": "gpucampaign.campaign.*"},
                    expect={event},
                    posture=Posture.Reactive,
                    threshold=1,
                    within=timedelta(0),
                ),
                actions=[
                    SendNotification(
                        block_document_id=block_id,
                        subject="{{ event.payload.subject }}",
                        body="{{ event.payload.body }}",
                    )
                ],
            )
        )
    return found


def _settings(automation: Any) -> Any:
    """What an automation is set to, without the IDs the server or a build gives it.

    A trigger's event names are sets: dumped as JSON they become lists in the set's iteration
    order, which two equal sets built in another order (the server's copy, read back) need not
    share, and an automation set up as asked would be updated, its trigger's state reset. So
    sets compare as sets here.
    """

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k != "id"}
        if isinstance(value, list | tuple):
            return [strip(v) for v in value]
        if isinstance(value, set | frozenset):
            return sorted(strip(v) for v in value)
        return value

    from prefect.events.schemas.automations import AutomationCore

    return strip(automation.model_dump(include=set(AutomationCore.model_fields)))


def put(client: Any, automation: Any) -> str:
    """Create ``automation`` or update the one of the same name; 'created', 'updated' or
    'unchanged' (one set up as asked is not updated: that would reset its trigger's state)."""
    existing = client.read_automations_by_name(automation.name)
    for extra in existing[1:]:  # an earlier half-finished setup: one of each name
        client.delete_automation(extra.id)
    if existing and _settings(existing[0]) == _settings(automation):
        return "unchanged"
    if existing:
        client.update_automation(existing[0].id, automation)
        return "updated"
    client.create_automation(automation)
    return "created"


def remove_notifiers(client: Any) -> int:
    """Delete the notifying automations of an earlier setup (no target any more)."""
    gone = 0
    for automation in client.read_automations():
        if automation.name.startswith(PREFIX + "notify: "):
            client.delete_automation(automation.id)
            gone += 1
    return gone


def main(argv: list[str] | None = None) -> int:
    """Create or update the automations on the server at PREFECT_API_URL."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--notify-url", default=os.environ.get("GPUCAMPAIGN_NOTIFY_URL", ""))
    parser.add_argument("--notify-block", default=os.environ.get("GPUCAMPAIGN_NOTIFY_BLOCK", ""))
    parser.add_argument(
        "--crashed-after",
        default=os.environ.get("GPUCAMPAIGN_CRASHED_AFTER_S", str(DEFAULT_CRASHED_AFTER_S)),
    )
    args = parser.parse_args(argv)
    try:
        crashed_after = int(args.crashed_after)
    except ValueError:
        crashed_after = -1
    if crashed_after < MIN_CRASHED_AFTER_S:
        _fail(
            f"GPUCAMPAIGN_CRASHED_AFTER_S must be a whole number of seconds >= "
            f"{MIN_CRASHED_AFTER_S} (heartbeats come every 30 s at the fastest), got "
            f"'{args.crashed_after}'."
        )
    if not os.environ.get("PREFECT_API_URL"):
        _fail("PREFECT_API_URL is not set: point it at the Prefect server to set up.")
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        block_id = notification_block_id(client, url=args.notify_url, block=args.notify_block)
        done = put(client, crashed_automation(crashed_after))
        print(f"automations: {done} '{PREFIX}dead runs are Crashed' ({crashed_after} s)")
        relaunching = os.environ.get("GPUCAMPAIGN_RELAUNCH", "on").strip().lower() not in (
            "off",
            "0",
            "no",
        )
        if not relaunching:
            for automation in client.read_automations_by_name(RELAUNCH_NAME):
                client.delete_automation(automation.id)
            print("automations: no relaunch of crashed campaigns (GPUCAMPAIGN_RELAUNCH=off)")
        else:
            print(f"automations: {put(client, relaunch_automation())} '{RELAUNCH_NAME}'")
        if block_id is None:
            gone = remove_notifiers(client)
            print(
                "automations: no notifications (set GPUCAMPAIGN_NOTIFY_URL to a webhook, or "
                "GPUCAMPAIGN_NOTIFY_BLOCK to a notification block, and run this again)"
                + (f"; removed {gone} notifying automation(s) of an earlier setup" if gone else "")
            )
            return 0
        for automation in notify_automations(block_id, relaunching=relaunching):
            print(f"automations: {put(client, automation)} '{automation.name}'")
    target = args.notify_block or "the webhook in GPUCAMPAIGN_NOTIFY_URL"
    print(f"automations: notifications go to {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
