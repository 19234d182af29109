"""The automations on the real stack (infra/stack.sh, infra/automations.py) with a webhook
receiver of the test's own on 127.0.0.1 that records what it gets.

One campaign in 'ask' mode runs through a deployment on a worker of its own: its decision
point sends the waiting message (proposal, deadline in UTC, UI link); then the machine "dies"
(the worker and the flow-run process SIGKILLed) and the server's automation sets the run
Crashed once its heartbeats stop, and the receiver is told. The other events (an essential
run stopped, the rental ending while files are only local, the S3 store refusing uploads) are
emitted by the product's own code from this process to the stack's server, no campaign run.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpucampaign.core.stoprules import NonFiniteLoss
from gpucampaign.storage.open import SPOOLED_ATTEMPTS
from gpucampaign.storage.s3 import S3Store
from gpucampaign.storage.spool import SpoolingStore
from tests.helpers import SPEC_TEMPLATE, api, free_port, stack_s3_env, worker_log
from tests.helpers.stack import EXAMPLE, STACK, create_pool, start_worker, stop_worker, tiny_spec

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]

HEARTBEAT_S = 30  # the fastest Prefect allows
CRASHED_AFTER_S = 60  # two heartbeats missed
DECISION_TIMEOUT_S = 3600


class Receiver:
    """An HTTP server on 127.0.0.1 (a free port) that records every JSON body posted to it."""

    def __init__(self) -> None:
        got: list[dict[str, Any]] = []
        self.got = got

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                got.append(json.loads(raw or b"{}"))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def wait_for(self, pattern: str, *, timeout_s: float = 600) -> dict[str, Any]:
        """The first message whose subject matches ``pattern`` (fails after ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for message in list(self.got):
                if re.search(pattern, str(message.get("subject", ""))):
                    return message
            time.sleep(2)
        raise AssertionError(f"no message matching {pattern!r}; got {self.got}")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _automations(stack: dict[str, Any], **env: str) -> subprocess.CompletedProcess:
    """`infra/stack.sh automations` on the stack's server, as documented for a running server."""
    done = subprocess.run(
        ["bash", str(STACK), "automations"],
        env={**stack["env"], **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def _automation_names(stack: dict[str, Any]) -> set[str]:
    return {a["name"] for a in api(stack["api"], "POST", "/automations/filter", {})}


@pytest.fixture(scope="module")
def receiver(stack):
    """The receiver, with the stack's automations pointed at it (and a short dead-run window);
    the stack's own setup again afterwards (no notifications, the default window)."""
    hook = Receiver()
    try:
        done = _automations(
            stack, GPUCAMPAIGN_NOTIFY_URL=hook.url, GPUCAMPAIGN_CRASHED_AFTER_S=str(CRASHED_AFTER_S)
        )
        assert "notifications go to the webhook" in done.stdout
        yield hook
    finally:
        env = {k: v for k, v in stack["env"].items() if k != "GPUCAMPAIGN_NOTIFY_URL"}
        subprocess.run(
            ["bash", str(STACK), "automations"], env=env, capture_output=True, timeout=300
        )
        hook.close()


def test_stack_up_sets_up_the_dead_run_automation_and_says_there_is_no_target(stack):
    log = (stack["dir"] / "automations.log").read_text()
    first = log.split("automations: notifications go to")[0]
    assert "dead runs are Crashed' (300 s)" in first
    assert "no notifications (set GPUCAMPAIGN_NOTIFY_URL" in first
    assert "gpucampaign: dead runs are Crashed" in _automation_names(stack)
    # The deployments send heartbeats: the automation has something to miss.
    dep = api(stack["api"], "GET", "/deployments/name/campaign/main")
    assert dep["job_variables"]["env"]["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"] == "60"


def test_a_closed_campaign_emits_its_answer_as_an_event(stack, finished_campaign):
    """The events the flows emit reach the server from a deployment's flow-run process (sent
    before it exits), whether or not an automation turns them into a message. (Before the
    tests that shorten the dead-run window: the session's campaign may run now.)"""
    manifest = json.loads((finished_campaign["out"] / "manifest.json").read_text())
    campaign_id = json.loads((finished_campaign["out"] / "campaign.json").read_text())[
        "campaign_id"
    ]
    query = {"filter": {"event": {"name": ["gpucampaign.campaign.closed"]}}, "limit": 50}
    found: list[dict[str, Any]] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not found:
        events = api(stack["api"], "POST", "/events/filter", query)["events"]
        found = [
            e
            for e in events
            if e["resource"]["prefect.resource.id"] == f"gpucampaign.campaign.{campaign_id}"
        ]
        time.sleep(0 if found else 3)
    assert found, "no gpucampaign.campaign.closed event of the finished campaign"
    payload = found[0]["payload"]
    assert payload["verdict"] == manifest["verdict"]["kind"]
    assert payload["answer"] and payload["answer"] in payload["body"]
    assert str(finished_campaign["out"]) in payload["body"]


def _deployment_on(stack: dict[str, Any], *, pool: str, name: str) -> str:
    """campaign/main again on ``pool``, its heartbeat at the fastest Prefect allows; its ID."""
    main = api(stack["api"], "GET", "/deployments/name/campaign/main")
    body = {
        key: main[key]
        for key in ("flow_id", "entrypoint", "path", "pull_steps", "parameter_openapi_schema")
    }
    job = {**main["job_variables"], "env": {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(HEARTBEAT_S)}}
    body.update(name=name, work_pool_name=pool, job_variables=job, tags=["gpucampaign"])
    return api(stack["api"], "POST", "/deployments/", body)["id"]


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (read from /proc), children first."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def test_a_waiting_decision_is_sent_and_a_killed_run_ends_crashed(stack, receiver, tmp_path):
    pool, name = f"notify-{uuid.uuid4().hex[:8]}", "notify-kill"
    create_pool(stack, pool)
    deployment = _deployment_on(stack, pool=pool, name=name)
    decision = {**(yaml.safe_load(EXAMPLE.read_text()).get("decision_point") or {})}
    decision.update(mode="ask", timeout_s=DECISION_TIMEOUT_S)
    spec = tiny_spec(tmp_path / "spec", decision_point=decision)
    out = tmp_path / "out"
    worker = start_worker(stack, pool=pool, name=f"{pool}-worker", log=tmp_path / "worker.log")
    processes: list[int] = []
    try:
        run = api(
            stack["api"],
            "POST",
            f"/deployments/{deployment}/create_flow_run",
            {"parameters": {"spec": str(spec), "out": str(out)}},
        )
        started = datetime.now(UTC)
        waiting = receiver.wait_for(r"waits for your decision", timeout_s=900)
        body = waiting["body"]
        # The proposal, the deadline in UTC (the spec's timeout from the pause) and the link.
        assert re.search(r"Proposed: (continue|reduce|re-pose) \(", body), body
        found = re.search(r"before (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC", body)
        assert found, body
        deadline = datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
        assert started + timedelta(seconds=DECISION_TIMEOUT_S) <= deadline
        assert deadline <= datetime.now(UTC) + timedelta(seconds=DECISION_TIMEOUT_S)
        assert f"/runs/flow-run/{run['id']}" in body or run["id"] in body
        state = api(stack["api"], "GET", f"/flow_runs/{run['id']}")["state"]
        assert state["type"] in {"PAUSED", "RUNNING"}, state

        # The machine dies: the worker and the flow-run process, without a word.
        processes = _descendants(worker.pid)
        assert processes, "the worker has no flow-run process"
        for pid in [worker.pid, *processes]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        worker.wait(timeout=30)

        deadline_s = time.monotonic() + CRASHED_AFTER_S + 4 * HEARTBEAT_S + 120
        while time.monotonic() < deadline_s:
            state = api(stack["api"], "GET", f"/flow_runs/{run['id']}")["state"]
            if state["type"] == "CRASHED":
                break
            time.sleep(3)
        assert state["type"] == "CRASHED", (state, worker_log(stack))
        assert f"no heartbeat for {CRASHED_AFTER_S} s" in state["message"]
        crashed = receiver.wait_for(r"Crashed$", timeout_s=120)
        assert f"no heartbeat for {CRASHED_AFTER_S} s" in crashed["body"]
        assert str(out) in crashed["subject"]  # the flow run is named after its output folder
    finally:
        stop_worker(worker)
        for pid in processes or _descendants(worker.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@contextmanager
def _emitting_to(api_url: str) -> Iterator[None]:
    """Prefect's events from this process go to ``api_url`` and are all sent on the way out.

    Prefect keeps one events worker per client kind (not per server): one made earlier for
    another server (the test harness's) is drained first, and this one after.
    """
    from prefect.events.worker import EventsWorker
    from prefect.settings import PREFECT_API_URL, temporary_settings

    EventsWorker.drain_all()
    with temporary_settings(updates={PREFECT_API_URL: api_url}):
        try:
            yield
        finally:
            EventsWorker.drain_all()


def _rental_folder(out: Path, *, name: str, ends_in_h: float) -> Path:
    """A running campaign's folder (local storage: everything only here) whose one 3-day lot
    ends ``ends_in_h`` hours from now."""
    starts = datetime.now(UTC) + timedelta(hours=ends_in_h) - timedelta(days=3)
    text = SPEC_TEMPLATE.format(sha="0" * 64, threshold=0.2, unit="null")
    lot = "{gpu: rtx4090, days: 3, count: 1}"
    at = starts.strftime("%Y-%m-%dT%H:%M:%SZ")
    text = text.replace(lot, f"{{gpu: rtx4090, days: 3, count: 1, starts_at: '{at}'}}")
    text = text.replace("name: closing-test", f"name: {name}") + "storage: {url: local}\n"
    (out / "runs" / "control-0123456789").mkdir(parents=True)
    (out / "spec.yaml").write_text(text)
    (out / "campaign.json").write_text(json.dumps({"campaign_id": f"{name}-0001"}))
    (out / "runs" / "control-0123456789" / "metrics.jsonl").write_text('{"step": 1}\n')
    return out


# The training's live view makes its progress artifact first: here outside a task run.
@pytest.mark.filterwarnings("ignore:Artifact creation outside of a flow or task run")
def test_every_campaign_event_reaches_the_webhook_through_the_automations(
    stack, receiver, tmp_path
):
    """An essential run stopped, the rental ending with files only local (the scheduled
    check's code), the S3 store refusing uploads (a training's live view over a real spooling
    store): each event emitted by the product's code reaches the receiver through the
    server's automation, with what a person needs in the message."""
    import tasks.train as train
    from flows.restart_check import rental_ending
    from tasks import notify

    name = "notify-events"
    stop = NonFiniteLoss("control-0123456789", "loss is nan at step 7", step=7)
    out = _rental_folder(tmp_path / "out", name=name, ends_in_h=2.0)
    refused = f"http://127.0.0.1:{free_port()}"  # nothing listens: every upload is refused
    s3_env = {**stack_s3_env(stack["dir"]), "AWS_ENDPOINT_URL": refused}
    store = SpoolingStore(
        S3Store("s3://gpucampaign/notify-events", env=s3_env, max_attempts=SPOOLED_ATTEMPTS),
        spool_dir=out / "spool",
        retry_s=3600,  # no retry during the test
    )
    store.write_bytes("control-0123456789/step-000000004/meta.json", data=b"{}")
    assert store.pending() and store.last_error
    with _emitting_to(stack["api"]):
        assert notify.essential_stop(
            campaign=f"{name}-0001", name=name, run="control", stop=str(stop)
        )
        ending = rental_ending(out, spec=None, margin_hours=12)
        assert ending is not None
        progress = train._Progress(
            "train", "control-0123456789", out=str(out), campaign=name, store=store
        )
        progress.check_spool()
        assert progress.told_spool

    essential = receiver.wait_for(rf"{name}: essential run 'control' stopped", timeout_s=120)
    assert "non_finite_loss: loss is nan at step 7" in essential["body"]
    assert f"Campaign {name}-0001" in essential["body"]

    rental = receiver.wait_for(rf"{name}: the rental ends while files are only local", timeout_s=60)
    ends = re.search(r"ends at (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ) \(", rental["body"])
    assert ends, rental["body"]
    at = datetime.strptime(ends.group(1), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert abs((at - datetime.now(UTC)).total_seconds() - 2 * 3600) < 600  # the end, in UTC
    assert "3 file(s) are only on this machine, e.g. campaign.json" in rental["body"]
    assert str(out) in rental["body"]

    storage = receiver.wait_for(rf"{name}: the S3 store stopped taking uploads", timeout_s=60)
    body = storage["body"]
    assert "s3://gpucampaign/notify-events" in body  # the store
    assert f"cannot reach the S3 endpoint {refused}" in body  # the failure
    assert "1 checkpoint file(s) are only on this machine" in body
    assert str(out / "spool") in body
    for message in (essential, rental, storage):
        assert s3_env["AWS_SECRET_ACCESS_KEY"] not in json.dumps(message)
