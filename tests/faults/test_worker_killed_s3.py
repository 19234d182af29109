"""A real Prefect process worker SIGKILLed mid-training while it holds the GPU slot, its
checkpoints on the stack's S3 server (issues #12, #13).

`prefect worker start` runs a `campaign` deployment run; once the control run's LATEST in the
bucket has passed step ``KILL_AT``, the worker and its flow-run process are killed with
SIGKILL (their process groups), with no chance to save, record or give anything back. A fresh
worker then runs the same spec into a FRESH output folder ("another host"): the dead
holder's GPU slot comes back by its lease (no one clears it), the control run resumes from the
S3 checkpoint, and its final parameters equal those of an uninterrupted run bit for bit.

Both workers track to the stack's MLflow server (``MLFLOW_TRACKING_URI`` of its env file, as a
user sources it): host b's fresh folder takes the campaign ID from the bucket, so the campaign
stays one MLflow parent run with one run per campaign run, none left RUNNING, and the control's
metric steps continuous across the two hosts.

Real services only (the session's stack: PostgreSQL, Prefect server, SeaweedFS, MLflow); the
test has a work pool, a deployment and a GPU limit of its own, so the stack's worker never takes
its runs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file

from gpucampaign.config import load_spec
from gpucampaign.folder.layout import CHECKPOINT_LATEST, MODEL_DIR
from gpucampaign.folder.records import read_campaign_id, read_pilot, read_result, read_timeline
from tests.helpers import (
    ROOT,
    RUN_TIMEOUT_S,
    S3_BUCKET,
    TERMINAL,
    api,
    create_pool,
    pool_deployment,
    s3_client,
    start_worker,
    stop_worker,
    tiny_spec,
    wait_flow_run,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

POOL = "gpucampaign-faults"
LIMIT = "gpu:faults-host"  # one limit per GPU host, named as infra/README.md says
LEASE_S = 60  # the smallest lease the spec accepts
PREFIX = "faults/worker-kill"
KILL_AT = 60  # the control run's LATEST step in the bucket before the kill
CONTROL_STEPS = 400
GPU_PHASES = {"pilot", "train", "restart"}
EXPERIMENT = "faults-worker-kill"

# The uninterrupted reference: the same control run, trained in one plain process.
REFERENCE = """
import sys
from pathlib import Path
from gpucampaign.data.corpus import load_spec_corpus
from gpucampaign.config import load_spec
from gpucampaign.storage import open_store
from gpucampaign.engine.loop import train_run
from gpucampaign.folder.layout import RunFolder
spec_file, out = Path(sys.argv[1]), Path(sys.argv[2])
spec = load_spec(spec_file)
run = spec.resolve_run("control")
corpus = load_spec_corpus(spec, base_dir=spec_file.parent, run_id=run.run_id)
train_run(spec, run=run, corpus=corpus, store=open_store("local", out=out),
          run_folder=RunFolder.of(out, run.run_id))
"""


def _descendants(pid: int) -> list[int]:
    """Every living process below ``pid`` (from /proc: the flow-run process and its children)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _sigkill_worker(worker: subprocess.Popen) -> list[int]:
    """SIGKILL the worker's process group, then each group its flow-run processes run in (the
    process worker may start a flow run in a session of its own); the PIDs killed."""
    below = _descendants(worker.pid)
    os.killpg(worker.pid, signal.SIGKILL)
    for pid in below:
        try:
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass
    worker.wait(timeout=30)
    return [worker.pid, *below]


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _latest_step(client: Any, run_id: str) -> int | None:
    try:
        body = client.get_object(Bucket=S3_BUCKET, Key=f"{PREFIX}/{run_id}/{CHECKPOINT_LATEST}")[
            "Body"
        ]
    except client.exceptions.NoSuchKey:
        return None
    return int(json.loads(body.read())["step"])


def _slots(stack: dict[str, Any]) -> int:
    return api(stack["api"], "GET", f"/v2/concurrency_limits/{LIMIT}")["active_slots"]


def _flow_run(stack: dict[str, Any], deployment_id: str, *, spec: Path, out: Path) -> str:
    return api(
        stack["api"],
        "POST",
        f"/deployments/{deployment_id}/create_flow_run",
        {"parameters": {"spec": str(spec), "out": str(out)}},
    )["id"]


def _params(out: Path, run_id: str) -> dict:
    return load_file(str(out / "runs" / run_id / MODEL_DIR / "model.safetensors"))


def _mlflow_uri(stack: dict[str, Any]) -> str | None:
    """The stack's MLflow server (its env file's ``MLFLOW_TRACKING_URI``); None without mlflow
    (the stack starts no server then)."""
    if importlib.util.find_spec("mlflow") is None:
        return None
    for line in (Path(stack["dir"]) / "env").read_text().splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        if name == "MLFLOW_TRACKING_URI":
            return value
    raise AssertionError("mlflow is installed but the stack's env file names no MLflow server")


def _assert_one_mlflow_campaign(uri: str, *, spec: Path, out: Path) -> None:
    """One parent run for the campaign across both hosts, one MLflow run per campaign run under
    it, none left RUNNING, and the control's steps each sent once, with none missing."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    cs = load_spec(spec)
    runs = client.search_runs([client.get_experiment_by_name(EXPERIMENT).experiment_id])
    parents = [r for r in runs if r.data.tags.get("gpucampaign.kind") == "campaign"]
    assert [p.info.run_name for p in parents] == [read_campaign_id(out)], [
        (r.info.run_name, r.info.status) for r in runs
    ]
    (parent,) = parents
    children = [r for r in runs if r is not parent]
    by_run = Counter(r.data.tags["gpucampaign.run"] for r in children)
    assert by_run == Counter(cs.run_names()), by_run  # every run piloted: one MLflow run each
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parent.info.run_id}
    assert {r.info.status for r in runs} <= {"FINISHED", "FAILED"}, [
        (r.info.run_name, r.info.status) for r in runs
    ]
    assert parent.info.status == "FINISHED"
    (control,) = [r for r in children if r.data.tags["gpucampaign.run"] == "control"]
    assert control.info.status == "FINISHED"
    steps = [m.step for m in client.get_metric_history(control.info.run_id, "train/loss")]
    assert sorted(steps) == list(range(1, CONTROL_STEPS + 1))  # each step once, none missing


def test_worker_killed_holding_the_gpu_resumes_from_s3_on_a_fresh_folder(stack, tmp_path, faults):
    create_pool(stack, POOL)
    deployment_id = pool_deployment(stack, pool=POOL, name="faults")
    # Sized by the operator as infra/stack.sh sizes `gpu`: one slot.
    api(stack["api"], "POST", "/v2/concurrency_limits/", {"name": LIMIT, "limit": 1})
    spec = tiny_spec(
        tmp_path / "spec",
        storage={"url": f"s3://{S3_BUCKET}/{PREFIX}"},
        checkpoint={"every_steps": 10, "keep": 3},
        # A wait longer than 2 leases would fail the GPU phase (and no retry is allowed below).
        gpu_lock={"name": LIMIT, "lease_s": LEASE_S, "timeout_s": 2 * LEASE_S},
        control={"epochs": 30, "max_steps": CONTROL_STEPS},
        tracking={"mlflow": {"experiment": EXPERIMENT}},
    )
    rid = load_spec(spec).resolve_run("control").run_id
    client = s3_client(stack)
    logs = {h: tmp_path / f"worker-{h}.log" for h in ("a", "b")}
    uri = _mlflow_uri(stack)
    # The workers track (the reference run below does not: it has the stack's env only).
    tracked = {**stack, "env": {**stack["env"], "MLFLOW_TRACKING_URI": uri}} if uri else stack

    def worker_logs() -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in logs.values()
        )

    # Host a: the worker is killed while the control run trains under the GPU slot.
    worker = start_worker(tracked, pool=POOL, name="faults-a", log=logs["a"])
    try:
        first = _flow_run(stack, deployment_id, spec=spec, out=tmp_path / "host-a")
        step, state = None, {}
        give_up = time.monotonic() + RUN_TIMEOUT_S
        while (step or 0) < KILL_AT and state.get("type") not in TERMINAL:
            assert worker.poll() is None, f"the worker exited\n{worker_logs()}"
            assert time.monotonic() < give_up, f"LATEST at {step}, {state}\n{worker_logs()}"
            step = _latest_step(client, rid)
            state = api(stack["api"], "GET", f"/flow_runs/{first}")["state"] or {}
            time.sleep(0.05)
        assert state.get("type") not in TERMINAL, f"run ended before the kill: {state}"
        held = _slots(stack)
        killed = _sigkill_worker(worker)
        killed_at = datetime.now(UTC)
    finally:
        if worker.poll() is None:
            stop_worker(worker)
    faults.sent("SIGKILL")
    faults.add("kill_points_tried")
    faults.add("faults_injected")
    assert held == 1, "the control run did not hold the GPU slot when it was killed"
    while not all(_gone(pid) for pid in killed):
        time.sleep(0.1)
    at_kill = _latest_step(client, rid)
    assert at_kill is not None and KILL_AT <= at_kill < CONTROL_STEPS, at_kill
    assert not (tmp_path / "host-a" / "runs" / rid / "result.json").exists()
    # Nothing gave the slot back: the dead holder keeps it until its lease runs out.
    assert _slots(stack) == 1

    reference = subprocess.Popen(
        [sys.executable, "-c", REFERENCE, str(spec), str(tmp_path / "reference")],
        env={**stack["env"], "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    # Host b: a fresh worker, the same spec and storage prefix, a fresh output folder.
    worker = start_worker(tracked, pool=POOL, name="faults-b", log=logs["b"])
    try:
        second = _flow_run(stack, deployment_id, spec=spec, out=tmp_path / "host-b")
        state = wait_flow_run(stack, second)
    finally:
        stop_worker(worker)
        ref_out, _ = reference.communicate(timeout=600)
        # The stale run stays Running on the server (nothing is left to report its end).
        api(
            stack["api"],
            "POST",
            f"/flow_runs/{first}/set_state",
            {"state": {"type": "CRASHED", "message": "worker killed by the test"}, "force": True},
        )
    assert state.get("type") == "COMPLETED", f"{state}\n{worker_logs()}"
    assert reference.returncode == 0, ref_out[-3000:]

    # (a) The slot came back by its lease: every GPU phase got it within its first wait
    # (timeout_s, no retry), and nothing holds it at the end.
    task_runs = api(
        stack["api"], "POST", "/task_runs/filter", {"flow_runs": {"id": {"any_": [second]}}}
    )
    assert all(t["run_count"] <= 1 for t in task_runs), [
        (t["name"], t["run_count"]) for t in task_runs
    ]
    assert _slots(stack) == 0
    out = tmp_path / "host-b"
    # Host b's timeline starts from host a's copy in the bucket: only its own rows count here.
    gpu = [
        r
        for r in read_timeline(out)
        if r.phase in GPU_PHASES and r.start and datetime.fromisoformat(r.start) > killed_at
    ]
    first_gpu = min(datetime.fromisoformat(r.start) for r in gpu)
    waited = (first_gpu - killed_at).total_seconds()
    print(f"killed at LATEST step {at_kill}; host b's first GPU phase began {waited:.0f} s later")

    # (b) The control run resumed from the checkpoint the dead worker left in the bucket.
    result = read_result(out, rid)
    assert result is not None and result.completed
    assert result.resumed_from_step == at_kill, (result.resumed_from_step, at_kill)
    assert result.steps_done == CONTROL_STEPS
    # Its pilot trained nothing here: the re-forecast takes the costs the checkpoint measured.
    assert read_pilot(out)["control"]["step_s"] > 0

    # (c) Bit for bit the parameters of the uninterrupted run.
    a, b = _params(tmp_path / "reference", rid), _params(out, rid)
    assert a.keys() == b.keys()
    assert all((a[k] == b[k]).all() for k in a)  # atol = 0

    # (d) One MLflow campaign across the two hosts.
    if uri is not None:
        _assert_one_mlflow_campaign(uri, spec=spec, out=out)
    faults.add("kill_points_survived")
    faults.add("faults_survived")
