"""The operator's view of a loss on the real stack (issue 34): `make stack-down` during
training and `make stack-up` after a SIGKILL.

The session's stack (infra/stack.sh) runs a campaign through a copy of campaign/main
that sends a heartbeat every 30 s; each training step waits 0.2 s (tests/helpers/slowsteps) so
the stop lands mid-training. The stack is taken down and brought up again on the same ports
(its data kept), as a user does: the tests after these find it as it was.

- `infra/stack.sh down` while the control trains: the flow-run process saves at its next
  step (its checkpoint interval never comes), closes its segment as interrupted, writes its
  progress as stopped, releases the folder's `.lock`, and the flow run ends Cancelled as
  docs/stack.md says; `up` again finds it so (no run left Running).
- The stack's worker and its flow-run process SIGKILLed as the run starts (after its first
  heartbeat), then `infra/stack.sh up` run again:
  the dead-run automation still sets the run Crashed within its window, set to 60 s for
  the test (a stack-up that rewrote the automations would reset its trigger and blind it).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gpucampaign.config import load_spec
from gpucampaign.folder.metrics import read_metrics
from gpucampaign.folder.records import read_timeline
from tests.helpers import ROOT, S3_BUCKET, STACK, api, s3_client, tiny_spec

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

CRASHED_AFTER_S = 60
DETECTOR = "gpucampaign: dead runs are Crashed"
SLOW_SITE = ROOT / "tests" / "helpers" / "slowsteps"


def _stack_sh(ops: dict[str, Any], verb: str) -> subprocess.CompletedProcess:
    done = subprocess.run(
        ["bash", str(STACK), verb], env=ops["env"], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"stack {verb} failed:\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def ops(stack: dict[str, Any]) -> dict[str, Any]:
    """The session's stack, and the deployment ``campaign/ops`` on its worker's pool: a copy
    of campaign/main whose runs send a heartbeat every 30 s and take 0.2 s more a step."""
    main = api(stack["api"], "GET", "/deployments/name/campaign/main")
    body = {
        key: main[key]
        for key in (
            "flow_id",
            "entrypoint",
            "path",
            "pull_steps",
            "parameters",
            "parameter_openapi_schema",
            "job_variables",
            "work_pool_name",
        )
    }
    body["job_variables"]["env"] = {
        **(body["job_variables"].get("env") or {}),
        "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30",
        "PYTHONPATH": os.pathsep.join([str(SLOW_SITE), str(ROOT / "src"), str(ROOT)]),
        "GPUCAMPAIGN_TEST_STEP_SLEEP_S": "0.2",
    }
    deployment = api(stack["api"], "POST", "/deployments/", {**body, "name": "ops"})["id"]
    return {**stack, "deployment": deployment}


def _start(
    ops: dict[str, Any], tmp: Path, *, prefix: str, max_relaunches: int = 3
) -> tuple[str, Path, str]:
    """A long control on the ops deployment, saved only when stopped; (flow run, out, run ID)."""
    spec = tiny_spec(
        tmp / "spec",
        storage={"url": f"s3://{S3_BUCKET}/{prefix}"},
        checkpoint={"every_steps": 5000, "keep": 3, "max_relaunches": max_relaunches},
        control={"epochs": 50, "max_steps": 1000},
    )
    out = tmp / "out"
    flow_run = api(
        ops["api"],
        "POST",
        f"/deployments/{ops['deployment']}/create_flow_run",
        {"parameters": {"spec": str(spec), "out": str(out)}},
    )["id"]
    return flow_run, out, load_spec(spec).resolve_run("control").run_id


def _state(ops: dict[str, Any], flow_run: str) -> dict[str, Any]:
    return api(ops["api"], "GET", f"/flow_runs/{flow_run}")["state"] or {}


def _wait_training(ops: dict[str, Any], flow_run: str, metrics: Path, *, steps: int) -> None:
    """Until the control has trained ``steps`` steps under the flow run."""
    give_up = time.monotonic() + 600
    while sum(1 for r in read_metrics(metrics) if r["kind"] == "train") < steps:
        state = _state(ops, flow_run)
        assert state.get("type") in (None, "SCHEDULED", "PENDING", "RUNNING"), state
        assert time.monotonic() < give_up, (ops["dir"] / "worker.log").read_text()[-4000:]
        time.sleep(0.5)


def _flow_run_processes(ops: dict[str, Any]) -> tuple[int, list[int]]:
    """The stack's worker PID and its children (the flow-run processes)."""
    worker = int((ops["dir"] / "worker.pid").read_text())
    found = subprocess.run(["pgrep", "-P", str(worker)], capture_output=True, text=True)
    return worker, [int(p) for p in found.stdout.split()]


def test_stack_down_saves_closes_the_segment_and_cancels_the_run(ops, tmp_path):
    flow_run, out, rid = _start(ops, tmp_path, prefix="e2e/ops-down")
    _wait_training(ops, flow_run, out / "runs" / rid / "metrics.jsonl", steps=25)
    _, children = _flow_run_processes(ops)
    assert children, "no flow-run process under the worker"
    t0 = time.monotonic()
    down = _stack_sh(ops, "down")
    took = time.monotonic() - t0
    said = down.stdout + down.stderr
    assert not any(_alive(pid) for pid in children), said

    # The flow-run process saved and closed its segment itself, before the stack went.
    (cut, *_) = [r for r in reversed(read_timeline(out)) if r.phase == "train"]
    assert cut.end is not None and cut.interrupted, (cut, said)
    assert "interrupted by SIGTERM" in (cut.outcome or ""), cut
    assert cut.checkpoint_step is not None and cut.checkpoint_step > 10, cut  # past the pilot
    progress = json.loads((out / "runs" / rid / "progress.json").read_text())
    assert progress.get("state", "running") != "running", progress
    assert (out / ".lock").read_text() == "", "the folder's writer lock still names a holder"
    assert f"stopping flow-run process {children[0]}" in said, said

    _stack_sh(ops, "up")
    state = _state(ops, flow_run)
    assert state.get("type") == "CANCELLED", (state, said)
    # The checkpoint of that step reached the bucket before the S3 server stopped.
    key = f"e2e/ops-down/{rid}/LATEST"
    latest = json.loads(s3_client(ops).get_object(Bucket=S3_BUCKET, Key=key)["Body"].read())
    assert latest["step"] == cut.checkpoint_step, (latest, cut)
    print(f"stack down with a training run: {took:.0f} s; the run {state['message']!r}")


def test_a_killed_run_is_crashed_within_the_window_after_stack_up(ops, tmp_path):
    # The session's stack with the detector's window at 60 s for this test (set now, before
    # the run starts: the stack-up after the kill must leave it as it is).
    short = {**ops, "env": {**ops["env"], "GPUCAMPAIGN_CRASHED_AFTER_S": str(CRASHED_AFTER_S)}}
    if subprocess.run(
        ["bash", str(STACK), "status"], env=ops["env"], capture_output=True
    ).returncode:
        _stack_sh(short, "up")  # the test before left it down
    _stack_sh(short, "automations")
    try:
        # max_relaunches 0: the relaunch automation's run refuses at once.
        flow_run, out = _start(ops, tmp_path, prefix="e2e/ops-kill", max_relaunches=0)[:2]
        # Killed once it sent its first heartbeat, as it starts (the audit).
        give_up = time.monotonic() + 300
        while _state(ops, flow_run).get("type") != "RUNNING" or not (out / "audit.json").exists():
            assert time.monotonic() < give_up, (ops["dir"] / "worker.log").read_text()[-4000:]
            time.sleep(0.5)
        time.sleep(2)  # its first heartbeat event sent
        worker, children = _flow_run_processes(ops)
        assert children, "no flow-run process under the worker"
        for pid in [worker, *children]:
            os.kill(pid, signal.SIGKILL)
        killed_at = datetime.now(UTC)
        t0 = time.monotonic()
        _stack_sh(short, "up")  # a worker back; the automations as they were
        said = [line for line in (ops["dir"] / "automations.log").open() if DETECTOR in line]
        assert said[-1] == f"automations: unchanged '{DETECTOR}' ({CRASHED_AFTER_S} s)\n", said
        state: dict[str, Any] = {}
        while (state := _state(ops, flow_run)).get("type") == "RUNNING":
            assert time.monotonic() - t0 < CRASHED_AFTER_S + 90, f"still Running: {state}"
            time.sleep(1)
    finally:
        _stack_sh(ops, "automations")  # the session's window again
    assert state.get("type") == "CRASHED", state
    after = (datetime.fromisoformat(state["timestamp"]) - killed_at).total_seconds()
    assert after <= CRASHED_AFTER_S + 60, (after, state)
    print(f"killed, stack up again: Crashed {after:.0f} s after the kill ({state['message']})")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(") ")[-1].startswith("Z"))
