"""The automations on the real stack (infra/stack.sh, infra/automations.py) with a webhook
receiver of the test's own on 127.0.0.1 that records what it gets.

Two campaigns run through deployments, each on a worker of its own. One trains for minutes
(its steps slowed), and its table of evaluations is looked at in headless Chromium while it
grows. The other, in 'ask' mode, stops at its decision point, which sends the waiting message
(proposal, deadline in UTC, UI link). Then both machines "die" at once (the workers and the
flow-run processes SIGKILLed: one paused for a person, one in the middle of a training task)
and the server's automation sets each run Crashed once its heartbeats stop, and the receiver
is told. (One slow campaign serves both the UI and the kill, and one heartbeat window both
kills.)

Three more events (an essential run stopped, the rental ending while files are only local, the
S3 store refusing uploads) are emitted by the product's own code from this process to the
stack's server, no campaign run.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpucampaign.config import load_spec
from gpucampaign.core.stoprules import NonFiniteLoss
from gpucampaign.folder.layout import RunFolder
from gpucampaign.folder.records import read_campaign_id
from gpucampaign.storage.open import SPOOLED_ATTEMPTS
from gpucampaign.storage.s3 import S3Store
from gpucampaign.storage.spool import SpoolingStore
from gpucampaign_prefect.orchestration.ui import evaluations_key
from tests.helpers import (
    CHROMIUM,
    ROOT,
    SPEC_TEMPLATE,
    api,
    chromium,
    free_port,
    keep_screenshot,
    stack_s3_env,
    worker_log,
)
from tests.helpers.receiver import notifying, set_automations
from tests.helpers.stack import EXAMPLE, create_pool, start_worker, tiny_spec

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]

HEARTBEAT_S = 30  # the fastest Prefect allows
CRASHED_AFTER_S = 60  # two heartbeats missed
DECISION_TIMEOUT_S = 3600
SLOW_SITE = ROOT / "tests" / "helpers" / "slowsteps"
STEP_SLEEP_S = 0.5  # each training step of the live campaign
EVAL_EVERY = 10  # its evaluations: one every 5 s
LIVE_STEPS = 400  # its control: 200 s of training, killed long before


def _automations(stack: dict[str, Any], **env: str) -> subprocess.CompletedProcess:
    return set_automations(stack, **env)


def _automation_names(stack: dict[str, Any]) -> set[str]:
    return {a["name"] for a in api(stack["api"], "POST", "/automations/filter", {})}


@pytest.fixture(scope="module")
def receiver(stack):
    """The receiver, with the stack's automations pointed at it (and a short dead-run window);
    the stack's own setup again afterwards (no notifications, the default window)."""
    with notifying(stack, GPUCAMPAIGN_CRASHED_AFTER_S=str(CRASHED_AFTER_S)) as hook:
        yield hook


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


def _deployment_on(
    stack: dict[str, Any], *, pool: str, name: str, env: dict[str, str] | None = None
) -> str:
    """campaign/main again on ``pool``, its heartbeat at the fastest Prefect allows and ``env``
    added to its flow-run process's environment; its ID."""
    main = api(stack["api"], "GET", "/deployments/name/campaign/main")
    body = {
        key: main[key]
        for key in ("flow_id", "entrypoint", "path", "pull_steps", "parameter_openapi_schema")
    }
    job_env = {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(HEARTBEAT_S), **(env or {})}
    job = {**main["job_variables"], "env": job_env}
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


def _kill(worker: subprocess.Popen) -> list[int]:
    """The machine dies: the worker and every process below it (the flow-run process, in a
    session of its own) SIGKILLed without a word; the processes that were below it."""
    if worker.poll() is not None:  # gone already (its PID may be another process's now)
        return []
    processes = _descendants(worker.pid)  # before the kill: orphans are no longer below it
    for pid in [worker.pid, *processes]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    worker.wait(timeout=30)
    return processes


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


@pytest.fixture(scope="module")
def training(stack, receiver, tmp_path_factory):
    """A campaign that trains for minutes, through a deployment on a pool and worker of its
    own, so that a test can look at it while it trains: every step waits STEP_SLEEP_S
    (tests/helpers/slowsteps on its flow-run process's path, as the data-parallel fault tests
    use it: no number of the run changes) and the control evaluates every EVAL_EVERY steps.

    The control alone (no variant to pilot first): its table of evaluations grows from the
    first half-minute. Its worker and flow-run process are SIGKILLed at the end, whatever
    happened (the test that kills them first checks what the server makes of it).

    After ``receiver``: the automations are set up before the run starts. Setting them up again
    gives the dead-run trigger a new identity that knows no run until its next heartbeat, and a
    run killed before that one would never be set Crashed.
    """
    base = tmp_path_factory.mktemp("training")
    pool = f"live-{uuid.uuid4().hex[:8]}"
    create_pool(stack, pool)
    slow = {"PYTHONPATH": str(SLOW_SITE), "GPUCAMPAIGN_TEST_STEP_SLEEP_S": str(STEP_SLEEP_S)}
    deployment = _deployment_on(stack, pool=pool, name=pool, env=slow)
    calendar = [
        step
        for step in yaml.safe_load(EXAMPLE.read_text())["calendar"]
        if step.get("run") in (None, "control")
    ]
    spec = tiny_spec(
        base / "spec",
        variants=[],
        calendar=calendar,
        control={"epochs": 30, "max_steps": LIVE_STEPS, "eval_every": EVAL_EVERY},
        # A limit of its own: the slot this run holds when it is killed blocks no other test.
        gpu_lock={"name": f"gpu-{pool}"},
    )
    cs = load_spec(spec)
    out = base / "out"
    log = base / "worker.log"
    worker = start_worker(stack, pool=pool, name=f"{pool}-worker", log=log)
    try:
        run = api(
            stack["api"],
            "POST",
            f"/deployments/{deployment}/create_flow_run",
            {"parameters": {"spec": str(spec), "out": str(out)}},
        )
        yield {
            "id": run["id"],
            "name": f"{cs.name} -> {out}",
            "run_id": cs.resolve_run("control").run_id,
            "metric": cs.decision_rule.metric,
            "out": out,
            "worker": worker,
            "log": log,
        }
    finally:
        for pid in _kill(worker):
            while not _gone(pid):
                time.sleep(0.1)


def _newest_table(stack: dict[str, Any], key: str) -> tuple[str, list[int]]:
    """The ID of the newest version of the table artifact ``key`` (the one the UI's page of the
    key leads to) and the steps of its rows, through the API (("", []) before the first)."""
    found = api(
        stack["api"], "POST", "/artifacts/latest/filter", {"artifacts": {"key": {"any_": [key]}}}
    )
    if not found:
        return "", []
    rows = found[0]["data"]
    rows = json.loads(rows) if isinstance(rows, str) else rows
    return found[0]["latest_id"], [int(row["step"]) for row in rows]


def _training_now(stack: dict[str, Any], flow_run_id: str) -> str | None:
    """The name of the flow run's training task run (pilot or train) Running now, if any."""
    task_runs = api(
        stack["api"], "POST", "/task_runs/filter", {"flow_runs": {"id": {"any_": [flow_run_id]}}}
    )
    for t in task_runs:
        if (
            t["name"].startswith(("pilot[", "train["))
            and (t["state"] or {}).get("type") == "RUNNING"
        ):
            return t["name"]
    return None


def _rows_on_page(text: str, *, metric: str) -> list[int]:
    """The steps of the evaluation rows a table artifact's page shows (a row reads ``step
    train_loss metric value elapsed eta``)."""
    number = r"-?\d+(?:\.\d+)?(?:e-?\d+)?"
    return [int(s) for s in re.findall(rf"(?<!\S)(\d+) {number} {re.escape(metric)} ", text)]


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no {CHROMIUM} (.ci/run installs it)")
def test_the_table_of_evaluations_grows_in_the_ui_while_the_run_trains(stack, training, tmp_path):
    """The run's table of evaluations as a person sees it (headless Chromium) while the
    campaign trains: the page of its newest version (Artifacts > the run's key > the newest),
    opened, then opened again after the next evaluation, holds more rows the second time."""
    ui = f"http://127.0.0.1:{stack['port']}"
    flow_run_id, run_id, metric = training["id"], training["run_id"], training["metric"]
    key = ""

    def log() -> str:
        return training["log"].read_text(errors="replace")[-4000:]

    deadline = time.monotonic() + 300
    shown: list[list[int]] = []
    for look in (1, 2):
        # The first look: once the table exists. The second: once the API holds a row the first
        # page did not show (a new version of the table under the same key).
        while True:
            assert training["worker"].poll() is None, f"the worker exited\n{log()}"
            # Keyed by the campaign ID too, known once the campaign started.
            campaign = read_campaign_id(training["out"])
            key = evaluations_key(run_id, campaign=campaign) if campaign else ""
            newest, steps = _newest_table(stack, key) if key else ("", [])
            if steps and (not shown or set(steps) - set(shown[-1])):
                break
            assert time.monotonic() < deadline, (shown, steps, log())
            time.sleep(0.5)
        # Named when it started: after the campaign and its output folder.
        flow_run = api(stack["api"], "GET", f"/flow_runs/{flow_run_id}")
        assert flow_run["name"] == training["name"], flow_run["name"]
        shot = tmp_path / f"evaluations-{look}-{flow_run_id}.png"
        text = chromium(f"{ui}/artifacts/artifact/{newest}", dump_dom=True, screenshot=shot)
        assert shot.is_file() and shot.stat().st_size > 20_000, "the screenshot is (nearly) blank"
        keep_screenshot(shot)
        rows = _rows_on_page(text, metric=metric)
        assert rows, f"no evaluation row on the page:\n{text[:3000]}"
        assert re.search(rf"\b{len(rows)} Items?\b", text), text[:3000]  # the UI's own count
        assert key in text and training["name"] in text, text[:3000]
        # Still running: the table is live, not the last word of a finished run.
        state = api(stack["api"], "GET", f"/flow_runs/{flow_run_id}")["state"]
        assert state["type"] == "RUNNING", state
        shown.append(rows)
    # The second look came after an evaluation of the training task, which still runs.
    assert _training_now(stack, flow_run_id) == f"train[{run_id}]"
    first, second = shown
    assert second[: len(first)] == first and len(second) > len(first), shown
    assert all(step % EVAL_EVERY == 0 for step in second), shown


def test_a_waiting_decision_is_sent_and_killed_runs_end_crashed(
    stack, receiver, training, tmp_path
):
    """Two machines die at once, so that one heartbeat window serves both: this test's
    campaign while it waits at its 'ask' decision point, and the ``training`` campaign while a
    training task of it is Running. Both end Crashed on the server, and the receiver is told
    of each."""
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
        # The other campaign is in a training task (at once when the UI test ran before).
        give_up = time.monotonic() + 300
        while not _training_now(stack, training["id"]):
            assert time.monotonic() < give_up, (
                api(stack["api"], "GET", f"/flow_runs/{training['id']}")["state"],
                training["log"].read_text(errors="replace")[-4000:],
            )
            time.sleep(1)

        # Both machines die: the workers and their flow-run processes, without a word.
        processes = _kill(worker)
        assert processes, "the worker has no flow-run process"
        assert _kill(training["worker"]), "the training campaign's worker has no flow-run process"

        dead = {run["id"]: out, training["id"]: training["out"]}
        states: dict[str, dict[str, Any]] = {}
        deadline_s = time.monotonic() + CRASHED_AFTER_S + 4 * HEARTBEAT_S + 120
        while time.monotonic() < deadline_s:
            states = {i: api(stack["api"], "GET", f"/flow_runs/{i}")["state"] for i in dead}
            if all(s["type"] == "CRASHED" for s in states.values()):
                break
            time.sleep(1)
        for flow_run_id, folder in dead.items():
            state = states[flow_run_id]
            assert state["type"] == "CRASHED", (folder, state, worker_log(stack))
            assert f"no heartbeat for {CRASHED_AFTER_S} s" in state["message"]
            # The flow run is named after its output folder: the subject says which one.
            crashed = receiver.wait_for(rf"-> {re.escape(str(folder))} Crashed$", timeout_s=120)
            assert f"no heartbeat for {CRASHED_AFTER_S} s" in crashed["body"]
    finally:
        for pid in processes + _kill(worker):
            while not _gone(pid):
                time.sleep(0.1)


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
    from gpucampaign_prefect.flows.restart_check import rental_ending
    from gpucampaign_prefect.orchestration import notify
    from gpucampaign_prefect.orchestration.ui import TrainingView

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
        progress = TrainingView(
            "train", run_folder=RunFolder.of(out, "control-0123456789"), campaign=name, store=store
        )
        progress.check_spool()
        progress.close()
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
