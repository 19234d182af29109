"""The notifications' parts that need no server: the events the flows emit, the automations
infra/automations.py sets up, the evaluation table and the GPU lock holders' table."""

from __future__ import annotations

import json
import logging
import threading
from datetime import UTC, datetime

import pytest

from gpucampaign.folder.layout import RunFolder
from gpucampaign.folder.progress import evaluation_table
from gpucampaign.storage.outage import OUTAGE_LOGGER, OUTAGES, Outages
from gpucampaign_prefect.orchestration import notify, outage
from gpucampaign_prefect.orchestration.gpu_lock import Holder, holders_key, holders_table
from infra import automations


@pytest.fixture
def emitted(monkeypatch) -> list[dict]:
    """What notify.emit hands to Prefect, captured instead of sent."""
    seen: list[dict] = []

    def fake_emit_event(**kwargs):
        seen.append(kwargs)
        return object()

    monkeypatch.setattr(notify, "emit_event", fake_emit_event)
    return seen


def test_a_waiting_decision_says_the_proposal_and_the_deadline_in_utc(emitted):
    now = datetime(2026, 12, 4, 15, 0, 0, tzinfo=UTC)
    assert notify.decision_waiting(
        campaign="digits-20261204T140000Z-abcd1234",
        name="digits",
        proposal="reduce",
        reasons=["the plan no longer fits the lot"],
        timeout_s=5400,
        now=now,
    )
    (event,) = emitted
    assert event["event"] == notify.DECISION_WAITING == "gpucampaign.decision.waiting"
    assert event["resource"]["prefect.resource.id"] == (
        "gpucampaign.campaign.digits-20261204T140000Z-abcd1234"
    )
    payload = event["payload"]
    assert "until 2026-12-04 16:30:00 UTC" in payload["subject"]
    assert "Proposed: reduce (the plan no longer fits the lot)" in payload["body"]
    assert "before 2026-12-04 16:30:00 UTC" in payload["body"]
    assert payload["deadline_utc"] == "2026-12-04T16:30:00+00:00"
    json.dumps(payload)  # a payload travels as JSON


def test_the_closing_message_carries_the_answer_sentence(emitted):
    notify.campaign_closed(
        campaign="c-1",
        name="digits",
        answer="Yes: the variant beats the control by 0.012 accuracy.",
        verdict="adopt",
        out="/data/out",
    )
    payload = emitted[0]["payload"]
    assert payload["subject"] == "gpucampaign: digits closed: adopt"
    assert "Yes: the variant beats the control by 0.012 accuracy." in payload["body"]
    assert "Failed" not in payload["body"]


def test_emitting_never_fails_the_campaign(monkeypatch):
    def broken(**kwargs):
        raise ConnectionError("no server")

    monkeypatch.setattr(notify, "emit_event", broken)
    assert notify.essential_stop(campaign="c", name="n", run="control", stop="nan") is False


def test_every_event_the_flows_emit_has_a_notifying_automation():
    emitted_names = {
        notify.DECISION_WAITING,
        notify.ESSENTIAL_STOP,
        notify.CAMPAIGN_CLOSED,
        notify.RENTAL_ENDING,
        notify.STORAGE_UNREACHABLE,
        notify.LOT_ENDED,
        notify.STORAGE_DOWN,
        notify.STORAGE_RECOVERED,
    }
    assert set(automations.CAMPAIGN_EVENTS) == emitted_names
    from uuid import uuid4

    made = automations.notify_automations(uuid4())
    expected = [set(a.trigger.expect) for a in made]
    assert {"prefect.flow-run.Failed", "prefect.flow-run.Crashed"} in expected
    assert all({name} in expected for name in emitted_names)
    assert len({a.name for a in made}) == len(made)


def test_a_crashed_campaigns_message_says_its_relaunch_waits():
    """Issue 45: with no worker alive the relaunch waits as "Late"; the Crashed notification
    says a relaunch is waiting (and which one), for a campaign of a deployment only."""
    import asyncio
    from uuid import uuid4

    from prefect.server.utilities.user_templates import render_user_template, validate_user_template

    def crashed_body(relaunching: bool) -> str:
        (failed, *_) = automations.notify_automations(uuid4(), relaunching=relaunching)
        (action,) = failed.actions
        return action.body

    assert automations.RELAUNCH_NOTE in crashed_body(True)
    assert automations.RELAUNCH_NOTE not in crashed_body(False)
    validate_user_template(crashed_body(True))

    def said(state: str, flow: str, deployment: str | None, relaunch: int | None) -> str:
        params = {} if relaunch is None else {"relaunch": relaunch}
        context = {
            "flow": {"name": flow},
            "flow_run": {
                "state": {"name": state},
                "deployment_id": deployment,
                "parameters": params,
            },
        }
        return asyncio.run(render_user_template(automations.RELAUNCH_NOTE, context))

    first = said("Crashed", "campaign", "d-1", None)
    assert first.startswith("A relaunch of this campaign is waiting") and "(relaunch 1," in first
    assert "(relaunch 3," in said("Crashed", "campaign", "d-1", 2)
    assert said("Failed", "campaign", "d-1", None) == ""
    assert said("Crashed", "restart-verification", "d-1", None) == ""
    assert said("Crashed", "campaign", None, None) == ""  # `campaign run`: no deployment


def test_the_dead_run_automation_is_prefects_zombie_pattern():
    made = automations.crashed_automation(120)
    trigger = made.trigger
    assert trigger.posture == "Proactive"
    assert trigger.after == {"prefect.flow-run.heartbeat"}
    assert {"prefect.flow-run.heartbeat", "prefect.flow-run.Completed"} <= trigger.expect
    assert trigger.for_each == {"prefect.resource.id"}
    assert trigger.within.total_seconds() == 120
    (action,) = made.actions
    assert action.type == "change-flow-run-state" and action.state == "CRASHED"


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--crashed-after", "10"], "GPUCAMPAIGN_CRASHED_AFTER_S"),
        (["--crashed-after", "soon"], "GPUCAMPAIGN_CRASHED_AFTER_S"),
    ],
)
def test_bad_settings_exit_2_naming_the_setting(args, field, capsys, monkeypatch):
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")
    with pytest.raises(SystemExit) as exc:
        automations.main(args)
    assert exc.value.code == 2
    assert field in capsys.readouterr().err


def test_evaluation_table_one_row_per_validation_evaluation():
    rows = [
        {"kind": "train", "step": 1, "loss": 2.0, "step_s": 0.5},
        {"kind": "train", "step": 2, "loss": 1.5, "step_s": 0.5},
        {"kind": "eval", "step": 2, "split": "val", "accuracy": 0.5, "eval_s": 1.0},
        {"kind": "eval", "step": 2, "split": "test", "accuracy": 0.4, "eval_s": 1.0},
        {"kind": "train", "step": 3, "loss": 1.0, "step_s": 0.5},
        {"kind": "train", "step": 4, "loss": 0.5, "step_s": 0.5},
        {"kind": "eval", "step": 4, "split": "val", "accuracy": 0.75, "eval_s": 1.0},
        {"kind": "eval", "step": 4, "split": "val", "accuracy": 0.8, "eval_s": 1.0, "final": True},
    ]
    table = evaluation_table(rows, metric="accuracy", planned_steps=10)
    assert [(r["step"], r["train_loss"], r["value"]) for r in table] == [
        (2, 1.5, 0.5),
        (4, 0.5, 0.8),  # the final evaluation of the last step replaces the periodic one
    ]
    # 2 steps of 0.5 s and 1 evaluation of 1 s; then 8 more steps at 2 steps/s.
    assert (table[0]["elapsed"], table[0]["eta"]) == ("2s", "4s")
    # 4 steps of 0.5 s and 4 evaluations of 1 s (any split counts: the run's time).
    assert table[1]["elapsed"] == "6s" and table[1]["eta"] == "3s"
    assert evaluation_table(rows[:2], metric="accuracy", planned_steps=10) == []


def test_the_holders_table_names_run_and_host():
    holder = Holder(
        lease_id="l-1",
        limit="gpu",
        host="gpu-host-7",
        pid=4242,
        since="2026-12-04T15:00:00+00:00",
        campaign="digits",
        out="/data/out",
        flow_run="fr-1",
        run="train of control-0123456789",
    )
    (row,) = holders_table("gpu", [holder])
    assert (row["holder"], row["host"], row["pid"]) == (
        "train of control-0123456789",
        "gpu-host-7",
        4242,
    )
    assert holders_table("gpu", [])[0]["holder"] == "(free on this host)"
    assert holders_key("GPU_lock").startswith("gpu-lock-gpu-lock-")
    # An older record (written before holders named their run) still reads.
    assert Holder(**{k: v for k, v in holder.__dict__.items() if k != "run"}).run == ""


def test_the_live_tables_never_stop_a_training(monkeypatch, tmp_path):
    from gpucampaign_prefect.orchestration import ui

    monkeypatch.setattr(ui, "create_progress_artifact", lambda **kw: "artifact-id")

    def down(**kwargs):
        raise ConnectionError("the Prefect API is gone")

    monkeypatch.setattr(ui, "create_table_artifact", down)
    monkeypatch.setattr(ui, "create_progress_artifact", lambda **kw: "artifact-id")
    run_dir = tmp_path / "runs" / "control-0123456789"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text(
        json.dumps({"kind": "train", "step": 1, "loss": 1.0, "step_s": 0.1})
        + "\n"
        + json.dumps({"kind": "eval", "step": 1, "split": "val", "accuracy": 0.5})
        + "\n"
    )
    progress = ui.TrainingView(
        "train", run_folder=RunFolder.of(tmp_path, "control-0123456789"), campaign="c"
    )
    progress.live_tables({"metric": "accuracy", "metric_step": 1, "planned_steps": 4}, final=True)
    progress.close()
    assert progress.table_step == 1  # it tried, and the error stayed in the live view


def test_the_store_outage_message_names_the_store_and_its_answer(emitted, monkeypatch, tmp_path):
    from gpucampaign.storage import LocalStore
    from gpucampaign_prefect.orchestration import ui

    monkeypatch.setattr(ui, "create_progress_artifact", lambda **kw: "artifact-id")
    LocalStore(tmp_path / "spool").write_bytes("control-0123456789/LATEST", data=b"{}")
    store = type("Refusing", (), {"url": "s3://bucket/camp", "last_error": "connection refused"})
    progress = ui.TrainingView(
        "train", run_folder=RunFolder.of(tmp_path, "control-0123456789"), store=store()
    )
    # During an outage too: the outage's own message does not say what is only on the machine.
    OUTAGES.down("s3://bucket/camp", what="uploading k", error="refused", then="waits")
    progress.live_tables({})
    OUTAGES.back("s3://bucket/camp")
    progress.live_tables({})  # said once
    progress.close()
    (event,) = emitted
    assert event["event"] == notify.STORAGE_UNREACHABLE
    body = event["payload"]["body"]
    assert "the S3 store s3://bucket/camp did not take an upload (connection refused)" in body
    assert "1 checkpoint file(s) are only on this machine" in body


def test_a_store_outage_reaches_the_run_logs_and_the_target_once_each(
    emitted, monkeypatch, tmp_path
):
    """The outage's two lines (said once for the process by the library) go to the flow run's
    logs, named by its ID even from a thread without a run context (the spool's), and each
    is notified once, without the credential the store's error held."""
    sent: list[logging.LogRecord] = []

    class RunLogs(logging.Handler):  # Prefect's API log handler, kept instead of sent
        def emit(self, record: logging.LogRecord) -> None:
            sent.append(record)

    monkeypatch.setattr(outage, "APILogHandler", RunLogs)
    (tmp_path / "campaign.json").write_text(json.dumps({"campaign_id": "digits-0001"}))
    store, run_id, outages = "s3://bucket/camp", "0b6c1f4e-2f1d-4f55-9d5e-1a2b3c4d5e6f", Outages()
    relay = outage.OutageRelay(flow_run_id=run_id, name="digits", out=tmp_path)
    logger = logging.getLogger(OUTAGE_LOGGER)
    logger.addHandler(relay)
    try:
        upload = threading.Thread(
            target=outages.down,
            args=(store,),
            kwargs={
                "what": "uploading control-0123456789/step-000000004/meta.json",
                "error": "cannot reach the S3 endpoint https://AKIA1:s3cr3t@127.0.0.1:9",
                "then": "waits in the spool",
            },
        )
        upload.start()
        upload.join()
        outages.down(store, what="reading control-0123456789/LATEST", error="no", then="waits")
        outages.back(store)
        outages.back(store)
    finally:
        logger.removeHandler(relay)
    outages.down(store, what="reading x", error="no", then="waits")  # no relay: not sent
    assert [r.flow_run_id for r in sent] == [run_id, run_id]
    down, back = (r.getMessage() for r in sent)
    assert down.startswith(f"store {store} does not answer (") and "uploading control" in down
    assert back.startswith(f"store {store} answers again after ")
    assert [e["event"] for e in emitted] == [notify.STORAGE_DOWN, notify.STORAGE_RECOVERED]
    assert notify.STORAGE_DOWN == "gpucampaign.storage.down"
    for event in emitted:
        assert event["resource"]["prefect.resource.id"] == "gpucampaign.campaign.digits-0001"
        assert store in event["payload"]["body"]
    assert emitted[0]["payload"]["subject"] == "gpucampaign: digits: the S3 store does not answer"
    assert emitted[1]["payload"]["subject"] == "gpucampaign: digits: the S3 store answers again"
    assert "s3cr3t" not in json.dumps(emitted) + down and "AKIA1" not in down


def test_outside_a_flow_run_the_outage_is_only_notified(emitted, tmp_path):
    outages = Outages()
    with outage.relay_outages(name="digits", out=tmp_path) as relay:
        assert relay.flow_run_id is None
        outages.down("s3://b/p", what="reading k", error="no", then="waits")
    assert relay not in logging.getLogger(OUTAGE_LOGGER).handlers
    outages.back("s3://b/p")
    assert [e["event"] for e in emitted] == [notify.STORAGE_DOWN]
    assert emitted[0]["resource"]["prefect.resource.id"] == "gpucampaign.campaign.digits"
