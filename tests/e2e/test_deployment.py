"""End to end on the real stack: Prefect server + worker started by infra/stack.sh, the
deployments of deployments/prefect.yaml, and `prefect deployment run campaign/main`.

Takes a few minutes on 2 cores (server start, deploy, worker, one tiny campaign).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpucampaign.scaffold import write_spec_copy

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[2]
STACK = ROOT / "infra" / "stack.sh"
EXAMPLE = ROOT / "examples" / "digits" / "campaign.yaml"
RUN_TIMEOUT_S = 600
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _api(base: str, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        base + path, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        raw = resp.read()
    return json.loads(raw) if raw else None


def _tiny_spec(dest: Path) -> Path:
    """The digits example cut down to a few steps, with the files it names copied beside it."""
    data = yaml.safe_load(EXAMPLE.read_text())
    data["name"] = f"{data['name']}-e2e"
    data["control"] = {**(data.get("control") or {}), "epochs": 1, "max_steps": 40}
    data["variants"] = [
        {**v, "changes": {**v.get("changes", {}), "max_steps": 40}} for v in data.get("variants", [])
    ]
    data["pilot"] = {**(data.get("pilot") or {}), "steps": 10}
    data["decision_point"] = {**(data.get("decision_point") or {}), "mode": "auto"}
    if data.get("decision_rule"):
        # 40 steps prove the plumbing, not the model: no essential run may miss the floor.
        data["decision_rule"] = {**data["decision_rule"], "threshold": 0.2}
        data["stop_rules"] = {**(data.get("stop_rules") or {}), "quality_floor": None}
    return write_spec_copy(data, source_dir=EXAMPLE.parent, dest=dest)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """A private real stack on a free port; always taken down again."""
    stack_dir = tmp_path_factory.mktemp("stack")
    port = _free_port()
    env = {
        **os.environ,
        "STACK_DIR": str(stack_dir),
        "GPUCAMPAIGN_PREFECT_PORT": str(port),
        "GPUCAMPAIGN_ROOT": str(ROOT),
        "PREFECT_WORKER_QUERY_SECONDS": "2",  # the worker picks a new run up sooner than every 10 s
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    env.pop("PREFECT_API_URL", None)
    try:
        up = subprocess.run(
            ["bash", str(STACK), "up"], env=env, capture_output=True, text=True, timeout=600
        )
        assert up.returncode == 0, f"stack up failed:\n{up.stdout}\n{up.stderr}"
        api = f"http://127.0.0.1:{port}/api"
        assert f"export PREFECT_API_URL={api}" in up.stdout
        yield {"api": api, "env": {**env, "PREFECT_API_URL": api}, "dir": stack_dir}
    finally:
        down = subprocess.run(
            ["bash", str(STACK), "down"], env=env, capture_output=True, text=True, timeout=180
        )
        assert down.returncode == 0, f"stack down failed:\n{down.stdout}\n{down.stderr}"


def test_scheduled_restart_verification_is_deployed(stack):
    dep = _api(stack["api"], "GET", "/deployments/name/restart-verification/scheduled")
    schedules = dep["schedules"]
    assert [s["schedule"].get("cron") for s in schedules] == ["0 */6 * * *"]
    assert schedules[0]["active"] is True
    assert dep["parameters"] == {"out": "out/campaign"}
    assert dep["work_pool_name"] == "gpucampaign"
    # This stack is throwaway: no scheduled check may fire into the repo while the test runs.
    _api(stack["api"], "PATCH", f"/deployments/{dep['id']}/schedules/{schedules[0]['id']}",
         {"active": False})


def test_gpu_limit_and_main_deployment(stack):
    limit = _api(stack["api"], "GET", "/v2/concurrency_limits/gpu")
    assert (limit["limit"], limit["active_slots"]) == (1, 0)
    dep = _api(stack["api"], "GET", "/deployments/name/campaign/main")
    assert dep["entrypoint"] == "flows.campaign:campaign"
    assert dep["parameters"] == {"spec": "examples/digits/campaign.yaml", "out": "out/campaign"}
    step = dep["pull_steps"][0]["prefect.deployments.steps.set_working_directory"]
    assert step["directory"] == str(ROOT)


def _run_deployment(stack: dict[str, Any], name: str, **params: Any) -> tuple[str, dict[str, Any]]:
    """`prefect deployment run NAME --param k=json`, then wait for a terminal state."""
    args = ["prefect", "deployment", "run", name]
    for key, value in params.items():
        args += ["--param", f"{key}={json.dumps(value)}"]
    run = subprocess.run(args, env=stack["env"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    found = re.search(r"UUID: ([0-9a-f-]{36})", run.stdout)
    assert found, run.stdout
    flow_run_id = found.group(1)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    state: dict[str, Any] = {}
    while time.monotonic() < deadline:
        state = _api(stack["api"], "GET", f"/flow_runs/{flow_run_id}")["state"] or {}
        if state.get("type") in TERMINAL:
            break
        time.sleep(3)
    return flow_run_id, state


def _worker_log(stack: dict[str, Any]) -> str:
    return (stack["dir"] / "worker.log").read_text(errors="replace")[-6000:]


def test_deployment_run_completes_with_outputs(stack, tmp_path):
    spec = _tiny_spec(tmp_path / "spec")
    out = tmp_path / "out"
    flow_run_id, state = _run_deployment(stack, "campaign/main", spec=str(spec), out=str(out))
    assert state.get("type") == "COMPLETED", (
        f"flow run {flow_run_id} ended {state.get('type')}: {state.get('message')}\n"
        f"--- worker.log (tail) ---\n{_worker_log(stack)}"
    )
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["verdict"]["kind"] in {"adopt", "negative"}
    assert set(r["status"] for r in manifest["runs"].values()) == {"completed"}
    assert (out / "report.md").is_file()
    # The GPU lock was taken and given back.
    assert _api(stack["api"], "GET", "/v2/concurrency_limits/gpu")["active_slots"] == 0

    # The scheduled restart check, run now on this output: every run resumes exactly ...
    check_id, check = _run_deployment(stack, "restart-verification/scheduled", out=str(out), steps=5)
    assert check.get("type") == "COMPLETED", (
        f"restart check {check_id} ended {check.get('type')}: {check.get('message')}\n{_worker_log(stack)}"
    )
    # ... and fails loudly once the checkpoints are gone.
    shutil.rmtree(out / "checkpoints")
    _, failed = _run_deployment(stack, "restart-verification/scheduled", out=str(out))
    assert failed.get("type") == "FAILED"
    assert "no_usable_restart" in (failed.get("message") or "")
