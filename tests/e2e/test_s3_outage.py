"""The stack's S3 server stopped while a run starts (its LATEST read) until the read says it
waits for the store, then started again as infra/README.md says (`python infra/s3server.py
stop|start $STACK_DIR/s3`): the read waits for the store, the campaign completes, the bucket
holds what ``keep`` allows, and the mirrored folder is retrieved and verified elsewhere. The
outage and its end are said once each, for the whole campaign, in the flow run's logs (read
from the Prefect API) and to the notification target (a webhook receiver of the test's own,
through the stack's automations), without a credential.

Real stack (Prefect server, worker, SeaweedFS), real training; checked with plain boto3. The
flow run's clock (``core/clock.py``) is shifted by the test through the offset file its job's
environment names: once the server answers again, the read's back-off (up to 30 s) ends at once
instead of on the wall clock.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

from gpucampaign.config import load_spec
from gpucampaign.core.clock import CLOCK_FILE_ENV, shift_clock
from gpucampaign.folder.layout import CHECKPOINT_LATEST
from gpucampaign.storage.mirror import MIRROR_INDEX
from gpucampaign.storage.readwait import MAX_STEP_S
from tests.helpers import ROOT, api, bucket_keys, stack_s3_env, tiny_spec, wait_flow_run, worker_log
from tests.helpers.receiver import Receiver, notifying

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

PREFIX = "e2e/outage"
KEEP = 2
#: The least outage (real seconds): the read has met it and said so before the server is back.
OUTAGE_S = 3
#: The flow run's job environment: the deployment's, and the offset file of its clock.
HEARTBEAT_ENV = {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "60"}


def _s3server(stack, verb: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "infra" / "s3server.py"), verb, str(stack["dir"] / "s3")],
        env=stack["env"],
        capture_output=True,
        text=True,
        timeout=180,
    )


def _start_deployment(stack, *, env: dict[str, str], **params) -> str:
    args = ["prefect", "deployment", "run", "campaign/main"]
    args += ["--job-variable", f"env={json.dumps(env)}"]
    for key, value in params.items():
        args += ["--param", f"{key}={json.dumps(value)}"]
    run = subprocess.run(args, env=stack["env"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    found = re.search(r"UUID: ([0-9a-f-]{36})", run.stdout)
    assert found, run.stdout
    return found.group(1)


def _run_logs(stack, flow_run_id: str) -> list[str]:
    """Every line of the flow run's logs (its tasks' too), as the UI shows them."""
    lines: list[str] = []
    while True:
        body = {"logs": {"flow_run_id": {"any_": [flow_run_id]}}, "limit": 200}
        page = api(stack["api"], "POST", "/logs/filter", {**body, "offset": len(lines)})
        lines += [entry["message"] for entry in page]
        if len(page) < 200:
            return lines


def _said(
    stack, flow_run_id: str, store: str, *, wait_s: float = 60
) -> tuple[list[str], list[str]]:
    """The outage lines and the recovery lines of ``store`` in the flow run's logs, once the
    recovery line is there (the logs go up in batches) or ``wait_s`` has passed."""
    deadline = time.monotonic() + wait_s
    while True:
        lines = _run_logs(stack, flow_run_id)
        down = [line for line in lines if line.startswith(f"store {store} does not answer")]
        back = [line for line in lines if line.startswith(f"store {store} answers again after")]
        if back or time.monotonic() > deadline:
            return down, back
        time.sleep(2)


@pytest.fixture(scope="module")
def receiver(stack):
    """The stack's automations notify a receiver of the test's own while the test runs."""
    with notifying(stack) as hook:
        yield hook


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpucampaign.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_an_s3_outage_while_a_run_starts_is_waited_out(stack, receiver: Receiver, tmp_path):
    spec = tiny_spec(
        tmp_path / "spec",
        storage={"url": f"s3://gpucampaign/{PREFIX}"},
        checkpoint={"every_steps": 5, "keep": KEEP},
    )
    out = tmp_path / "out"
    control = load_spec(spec).resolve_run("control").run_id
    store = f"s3://gpucampaign/{PREFIX}"
    clock_file = tmp_path / "clock"
    flow_run_id = _start_deployment(
        stack, env={**HEARTBEAT_ENV, CLOCK_FILE_ENV: str(clock_file)}, spec=str(spec), out=str(out)
    )

    # The control trains to its end; the next phase starts from the store: stop it now.
    deadline = time.monotonic() + 600
    while not (out / "runs" / control / "result.json").is_file():
        state = api(stack["api"], "GET", f"/flow_runs/{flow_run_id}")["state"] or {}
        assert state.get("type") in ("SCHEDULED", "PENDING", "RUNNING"), (state, worker_log(stack))
        assert time.monotonic() < deadline, worker_log(stack)
        time.sleep(0.5)
    stopped = _s3server(stack, "stop")
    assert stopped.returncode == 0, stopped.stderr
    stopped_at = time.monotonic()
    # The read meets the outage and says it waits (the flow run's logs), then the server is
    # started again (the command returns once a probe object is written and read back).
    while not _said(stack, flow_run_id, store, wait_s=0)[0]:
        assert time.monotonic() < deadline, worker_log(stack)
        time.sleep(0.5)
    time.sleep(max(0.0, stopped_at + OUTAGE_S - time.monotonic()))
    started = _s3server(stack, "start")
    assert started.returncode == 0, started.stderr
    # The read's back-off sleeps on the flow run's clock: moved past its longest step, the
    # read tries again now, against the store that answers.
    shift_clock(clock_file, by_s=MAX_STEP_S)

    state = wait_flow_run(stack, flow_run_id)
    log = worker_log(stack)
    assert state.get("type") == "COMPLETED", (state, log)
    # The wait was said, with what waited, and its end: searched in the whole worker log (its
    # tail, for the message, no longer reaches back to the outage once the campaign buys a
    # round of seeds after it).
    whole = (stack["dir"] / "worker.log").read_text(errors="replace")
    assert "does not answer" in whole and "storage.read_wait_s" in whole, log
    assert "answers again after" in whole, log

    # Said once each for the whole campaign (however many tasks waited), in the flow run's
    # logs as the UI shows them, and to the notification target.
    down, back = _said(stack, flow_run_id, store)
    # Whole, in the report of a failure (pytest cuts a long assertion's values short): one
    # CI run saw two outage lines, cut in the middle.
    print("outage lines:", *down, "recovery lines:", *back, sep="\n")
    assert len(down) == 1 and len(back) == 1, (down, back, log)
    assert "storage.read_wait_s" in down[0] and "Said once for this outage" in down[0]
    recovered = receiver.wait_for(r"the S3 store answers again$", timeout_s=120)
    time.sleep(5)  # a second message of either kind would be there by now
    outage = receiver.matching(r"the S3 store does not answer$")
    assert len(outage) == 1 and receiver.matching(r"answers again$") == [recovered], receiver.got
    assert store in outage[0]["body"] and store in recovered["body"]
    assert "A message follows when the store answers again" in outage[0]["body"]
    secrets = stack_s3_env(stack["dir"])
    for said in [*down, *back, *(json.dumps(m) for m in receiver.got)]:
        assert secrets["AWS_SECRET_ACCESS_KEY"] not in said
        assert secrets["AWS_ACCESS_KEY_ID"] not in said

    # The bucket holds what keep allows: per run its LATEST and at most KEEP checkpoints.
    manifest = json.loads((out / "manifest.json").read_text())
    keys = bucket_keys(stack, PREFIX)
    for rid in manifest["runs"]:
        assert f"{rid}/{CHECKPOINT_LATEST}" in keys, rid
        steps = {k.split("/")[1] for k in keys if k.startswith(f"{rid}/step-")}
        assert 1 <= len(steps) <= KEEP, (rid, sorted(steps))
    assert {"manifest.json", MIRROR_INDEX} <= keys
    spool = out / "spool"
    assert not spool.exists() or not any(p.is_file() for p in spool.rglob("*"))

    # Retrieved into a fresh folder and verified there; status says all is off the machine.
    back = tmp_path / "back"
    got = _cli("retrieve", f"s3://gpucampaign/{PREFIX}", "--to", str(back), env=stack["env"])
    assert got.returncode == 0, got.stdout + got.stderr
    verified = _cli("verify", str(back), env=stack["env"])
    assert verified.returncode == 0, verified.stdout + verified.stderr
    status = _cli("status", str(out), env=stack["env"])
    assert status.returncode == 0, status.stdout + status.stderr
    assert "everything is off the machine" in status.stdout
    assert "NOT everything" not in status.stdout, status.stdout
