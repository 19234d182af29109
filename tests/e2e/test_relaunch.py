"""A lost machine is relaunched without a person (issue 34), on the real stack.

Two process workers stand for two GPU hosts, each with its own output root: the deployment's
pull step moves the flow-run process to ``$GPUCAMPAIGN_HOST_ROOT`` of the worker that runs it,
and ``out`` is relative, so one campaign writes ``<host root>/out`` on whichever host runs it,
as on two machines. Host A's worker and its flow-run process are SIGKILLed while the control
trains (checkpoints in the stack's S3 bucket). No command follows: the dead-run automation sets
the silent run Crashed, the relaunch automation runs the deployment again (``relaunch`` 1), and
host B's worker resumes the campaign from the bucket into its own, fresh folder and completes
it. Its control's final parameters equal an uninterrupted run's bit for bit, the work lost is
at most one save interval, and the time from the kill to the resumed training is measured.

Run this file alone with ``GPUCAMPAIGN_CRASHED_AFTER_S=60`` (the stack's dead-run window):
with the default 300 s it still passes, five minutes slower.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gpucampaign.config import load_spec
from gpucampaign.core.clock import CLOCK_FILE_ENV, shift_clock
from gpucampaign.folder.records import read_result, read_timeline
from tests.faults.test_worker_killed_s3 import REFERENCE, _gone, _params, _sigkill_worker
from tests.helpers import (
    ROOT,
    RUN_TIMEOUT_S,
    S3_BUCKET,
    TERMINAL,
    api,
    create_pool,
    s3_client,
    start_worker,
    stop_worker,
    tiny_spec,
    wait_flow_run,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]

POOL = "gpucampaign-relaunch"
LIMIT = "gpu:relaunch"
LEASE_S = 60
PREFIX = "e2e/relaunch"
EVERY = 10  # the save interval in steps
KILL_AT = 60  # the control run's LATEST step in the bucket before the kill
CONTROL_STEPS = 1000
HOST_ROOT_VAR = "GPUCAMPAIGN_HOST_ROOT"
SLOW_SITE = ROOT / "tests" / "helpers" / "slowsteps"
STEP_SLEEP_S = 0.2  # each step of the flow runs waits this long: a save interval is 2 s
#: Beside the hosts' roots: the steps' wait as the flow runs read it at each step (once host B
#: is seen running while the revived copy is refused, "0": it trains on at full speed).
STEP_SLEEP_FILE = "step-sleep"


def host_deployment(stack: dict[str, Any], *, name: str) -> str:
    """campaign/main again on ``POOL``, its flow-run process moved to the worker's
    ``$GPUCAMPAIGN_HOST_ROOT`` (filled in by the flow-run process, from its worker's
    environment) and sending a heartbeat every 30 s; its ID."""
    main = api(stack["api"], "GET", "/deployments/name/campaign/main")
    body = {
        key: main[key]
        for key in ("flow_id", "entrypoint", "path", "parameters", "parameter_openapi_schema")
    }
    variables = {k: v for k, v in (main.get("job_variables") or {}).items() if k != "working_dir"}
    variables["env"] = {**(variables.get("env") or {}), "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30"}
    body |= {
        "name": name,
        "work_pool_name": POOL,
        "job_variables": variables,
        "pull_steps": [
            {
                "prefect.deployments.steps.set_working_directory": {
                    "directory": "{{ $" + HOST_ROOT_VAR + " }}"
                }
            }
        ],
    }
    return api(stack["api"], "POST", "/deployments/", body)["id"]


def host_worker(stack: dict[str, Any], *, name: str, root: Path, log: Path):
    """A worker standing for the host ``name``, its output root ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    env = {
        **stack["env"],
        HOST_ROOT_VAR: str(root),
        "PYTHONPATH": os.pathsep.join([str(SLOW_SITE), str(ROOT / "src"), str(ROOT)]),
        "GPUCAMPAIGN_TEST_STEP_SLEEP_S": str(STEP_SLEEP_S),
        "GPUCAMPAIGN_TEST_STEP_SLEEP_FILE": str(root.parent / STEP_SLEEP_FILE),
    }
    return start_worker({**stack, "env": env}, pool=POOL, name=name, log=log)


def latest_step(client: Any, run_id: str) -> int | None:
    """The step of the control's LATEST checkpoint in the bucket (None before the first)."""
    try:
        body = client.get_object(Bucket=S3_BUCKET, Key=f"{PREFIX}/{run_id}/LATEST")["Body"]
    except client.exceptions.NoSuchKey:
        return None
    return int(json.loads(body.read())["step"])


def trained_since(out: Path, since: datetime) -> list[Any]:
    """The control's training segments of ``out`` that began after ``since``."""
    return [
        r
        for r in read_timeline(out)
        if r.phase == "train" and r.run == "control" and datetime.fromisoformat(r.start) > since
    ]


def wait_driven(stack: dict[str, Any], flow_run_id: str, clock_file: Path) -> dict[str, Any]:
    """The flow run's final state, its clock (``core/clock.py``, through ``clock_file``) moved
    on a quarter lease each second meanwhile: its wait for the campaign lock (two leases)
    takes seconds, not two minutes."""
    give_up = time.monotonic() + RUN_TIMEOUT_S
    while True:
        state = api(stack["api"], "GET", f"/flow_runs/{flow_run_id}")["state"] or {}
        if state.get("type") in TERMINAL:
            return state
        assert time.monotonic() < give_up, state
        shift_clock(clock_file, by_s=LEASE_S / 4)
        time.sleep(1)


def campaign_runs(stack: dict[str, Any], deployment_id: str) -> list[dict[str, Any]]:
    """The deployment's flow runs, oldest first."""
    runs = api(
        stack["api"],
        "POST",
        "/flow_runs/filter",
        {"deployments": {"id": {"any_": [deployment_id]}}, "sort": "EXPECTED_START_TIME_ASC"},
    )
    return sorted(runs, key=lambda r: r["created"])


def test_a_killed_host_is_relaunched_on_another_host_from_the_bucket(stack, tmp_path):
    create_pool(stack, POOL)
    deployment_id = host_deployment(stack, name="relaunch")
    api(stack["api"], "POST", "/v2/concurrency_limits/", {"name": LIMIT, "limit": 1})
    spec = tiny_spec(
        tmp_path / "spec",
        storage={"url": f"s3://{S3_BUCKET}/{PREFIX}"},
        checkpoint={"every_steps": EVERY, "keep": 3},
        gpu_lock={"name": LIMIT, "lease_s": LEASE_S, "timeout_s": 3 * LEASE_S},
        control={"epochs": 50, "max_steps": CONTROL_STEPS},  # 20 steps an epoch
    )
    rid = load_spec(spec).resolve_run("control").run_id
    (tmp_path / STEP_SLEEP_FILE).write_text(str(STEP_SLEEP_S))
    client = s3_client(stack)
    roots = {h: tmp_path / h for h in ("host-a", "host-b")}
    logs = {h: tmp_path / f"{h}.log" for h in roots}

    def worker_logs() -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-4000:]}" for p in logs.values()
        )

    workers = {
        "host-a": host_worker(stack, name="host-a", root=roots["host-a"], log=logs["host-a"])
    }
    reference = None
    try:
        first = api(
            stack["api"],
            "POST",
            f"/deployments/{deployment_id}/create_flow_run",
            {"parameters": {"spec": str(spec), "out": "out"}},
        )["id"]
        # Host A took the run; host B stands by from now on.
        give_up = time.monotonic() + RUN_TIMEOUT_S
        while (api(stack["api"], "GET", f"/flow_runs/{first}")["state"] or {}).get(
            "type"
        ) == "SCHEDULED":
            assert time.monotonic() < give_up, worker_logs()
            time.sleep(0.5)
        workers["host-b"] = host_worker(
            stack, name="host-b", root=roots["host-b"], log=logs["host-b"]
        )
        step, state = None, {}
        while (step or 0) < KILL_AT and state.get("type") not in TERMINAL:
            assert time.monotonic() < give_up, f"LATEST at {step}, {state}\n{worker_logs()}"
            step = latest_step(client, rid)
            state = api(stack["api"], "GET", f"/flow_runs/{first}")["state"] or {}
            time.sleep(0.05)
        assert state.get("type") not in TERMINAL, f"run ended before the kill: {state}"
        killed = _sigkill_worker(workers["host-a"])
        killed_at = datetime.now(UTC)
        while not all(_gone(pid) for pid in killed):
            time.sleep(0.1)
        at_kill = latest_step(client, rid)
        assert at_kill is not None and KILL_AT <= at_kill < CONTROL_STEPS, at_kill
        reference = subprocess.Popen(
            [sys.executable, "-c", REFERENCE, str(spec), str(tmp_path / "reference")],
            env={**stack["env"], "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        # No command from here on: the automations find the dead run and relaunch it.
        relaunched: list[dict[str, Any]] = []
        give_up = time.monotonic() + 2 * RUN_TIMEOUT_S
        while not relaunched:
            assert time.monotonic() < give_up, f"no relaunch\n{worker_logs()}"
            relaunched = [r for r in campaign_runs(stack, deployment_id) if r["id"] != first]
            time.sleep(1)
        (second,) = relaunched
        # Host A comes back while host B holds the campaign, and the campaign is run there
        # again: that copy waits two leases for the campaign lock, then refuses.
        while not trained_since(roots["host-b"] / "out", killed_at):
            assert time.monotonic() < give_up, f"host B never trained\n{worker_logs()}"
            time.sleep(1)
        a_rows = len(read_timeline(roots["host-a"] / "out"))
        workers["host-a"] = host_worker(
            stack, name="host-a", root=roots["host-a"], log=logs["host-a"]
        )
        revived_clock = tmp_path / "revived-clock"
        revived = api(
            stack["api"],
            "POST",
            f"/deployments/{deployment_id}/create_flow_run",
            {
                "parameters": {"spec": str(spec), "out": "out"},
                "job_variables": {"env": {CLOCK_FILE_ENV: str(revived_clock)}},
            },
        )["id"]
        refused = wait_driven(stack, revived, revived_clock)
        b_then = (api(stack["api"], "GET", f"/flow_runs/{second['id']}")["state"] or {}).get("type")
        (tmp_path / STEP_SLEEP_FILE).write_text("0")  # nothing more needs host B slow
        state = wait_flow_run(stack, second["id"])
    finally:
        for proc in workers.values():
            stop_worker(proc)
        ref_out = reference.communicate(timeout=600)[0] if reference is not None else ""
    dead = api(stack["api"], "GET", f"/flow_runs/{first}")["state"]
    assert dead["type"] == "CRASHED", dead
    assert state.get("type") == "COMPLETED", f"{state}\n{worker_logs()}"
    assert second["parameters"] == {"spec": str(spec), "out": "out", "relaunch": 1}
    # The revived copy never ran beside host B's: refused while B held the campaign, with a
    # message naming B's run; nothing more in host A's folder.
    assert refused.get("type") == "FAILED" and b_then == "RUNNING", (refused, b_then)
    assert "is running elsewhere" in refused["message"], refused
    assert second["id"] in refused["message"], refused["message"]
    assert len(read_timeline(roots["host-a"] / "out")) == a_rows
    assert reference is not None and reference.returncode == 0, ref_out[-3000:]

    # Host B resumed the control from the checkpoint host A left in the bucket, in its own
    # folder; host A's folder never saw the end.
    out_a, out_b = roots["host-a"] / "out", roots["host-b"] / "out"
    assert not (out_a / "runs" / rid / "result.json").exists()
    result = read_result(out_b, rid)
    assert result is not None and result.completed and result.steps_done == CONTROL_STEPS
    assert result.resumed_from_step == at_kill, (result.resumed_from_step, at_kill)
    # Lost work: host A's steps after its last checkpoint, at most one save interval.
    cut = [r for r in read_timeline(out_a) if r.phase == "train" and r.run == "control"][-1]
    assert cut.end is None  # the kill left its segment open
    trained = max(
        json.loads(line).get("step", 0) for line in (out_a / "runs" / rid / "metrics.jsonl").open()
    )
    assert 0 <= trained - at_kill <= EVERY, (trained, at_kill)
    # Bit for bit the parameters of the uninterrupted run.
    a, b = _params(tmp_path / "reference", rid), _params(out_b, rid)
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)  # atol = 0

    (resumed, *_) = trained_since(out_b, killed_at)
    until = (datetime.fromisoformat(resumed.start) - killed_at).total_seconds()
    crashed = (datetime.fromisoformat(dead["timestamp"]) - killed_at).total_seconds()
    print(
        f"killed at LATEST step {at_kill} (trained to {trained}); Crashed {crashed:.0f} s "
        f"after the kill; the control resumed training on host B {until:.0f} s after the kill"
    )
    # Host B's report has host A's loss on its ledger: the timeline came with the bucket.
    ledger = json.loads((out_b / "report.json").read_text())["forecast_vs_actual"]
    (loss,) = [
        c
        for c in ledger["interruptions"]["segments"]
        if c["phase"] == "train" and c["run"] == "control"
    ]
    assert loss["resumed_at"] == resumed.start and loss["checkpoint_step"] <= at_kill
    # Counted from host A's last sign of life (its last heartbeat in the bucket), so a little
    # more than from the kill.
    last_seen = datetime.fromisoformat(loss["end"])
    assert last_seen <= killed_at
    assert loss["until_resumed_seconds"] == pytest.approx(
        (datetime.fromisoformat(resumed.start) - last_seen).total_seconds()
    )
    assert until <= loss["until_resumed_seconds"] <= until + 15, (loss, until)
    section = (out_b / "report.md").read_text().split("## Interruptions")[1].split("\n## ")[0]
    assert "until resumed" in section
    print(
        f"host B's ledger: host A cut at {loss['end']} (checkpoint step "
        f"{loss['checkpoint_step']}), training resumed {loss['until_resumed_seconds']:.0f} s "
        "after its last sign of life"
    )
