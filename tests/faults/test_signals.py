"""Signals: SIGINT and SIGTERM to a real `campaign run`, and a cancellation from the Prefect UI
of a `campaign/main` deployment run on the real stack (the worker then sends SIGTERM).

Each time the training saves a checkpoint at its next step, records its segment as
interrupted with the reason, gives the GPU slot back, and the rerun resumes from that
checkpoint. A run "saved within the grace" is one whose own process wrote that record: the
grace timer ends the process without it (``interrupt._force_exit``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpucampaign.folder.metrics import read_metrics
from gpucampaign.folder.records import read_timeline
from tests.flows.test_campaign import campaign_cli, start_campaign_run, tiny_campaign
from tests.helpers import api, run_deployment, wait_flow_run, worker_log

ROOT = Path(__file__).resolve().parents[2]


def _long_campaign(tmp: Path) -> Path:
    """The control alone, long enough to be interrupted, with no save near the signal."""

    def edit(data: dict[str, Any]) -> None:
        data["control"].update(epochs=100)  # ~2000 steps
        data["variants"] = []
        data["calendar"] = [s for s in data["calendar"] if s.get("run") in (None, "control")]
        data["checkpoint"] = {"every_steps": 5000, "keep": 3}
        # A slot the process did not give back would stay taken for 10 minutes.
        data["gpu_lock"] = {**data["gpu_lock"], "lease_s": 600}

    return tiny_campaign(tmp, edit=edit)


def _trained_steps(out: Path) -> int:
    files = list((out / "runs").glob("*/metrics.jsonl")) if (out / "runs").exists() else []
    return sum(1 for p in files for r in read_metrics(p) if r["kind"] == "train")


def _latest_step(out: Path) -> int:
    return json.loads(next((out / "checkpoints").glob("control-*/LATEST")).read_text())["step"]


def _saved_within_grace(out: Path, reason: str) -> int:
    """The step LATEST names, after checking that the stopped process itself closed its
    training segment as interrupted, saved at that step."""
    cut = [r for r in read_timeline(out) if r.phase == "train"]
    assert cut, "no training segment"
    row = cut[-1]
    assert row.interrupted and f"interrupted by {reason}" in (row.outcome or ""), row
    assert row.end is not None and row.lost_steps is None  # closed by the process, not later
    latest = _latest_step(out)
    assert latest > 5 and row.checkpoint_step == latest  # past the pilot's checkpoint
    assert {"kind": "interrupt", "step": latest, "reason": reason} in [
        {k: r.get(k) for k in ("kind", "step", "reason")}
        for p in (out / "runs").glob("control-*/metrics.jsonl")
        for r in read_metrics(p)
    ]
    return latest


def _resumed_from(out: Path) -> int | None:
    result = json.loads(next((out / "runs").glob("control-*/result.json")).read_text())
    assert result["completed"], result
    return result["resumed_from_step"]


# --- a real `campaign run` in a terminal-like process group ------------------------------------
def _session_alive(sid: int) -> list[str]:
    """Processes (other than zombies) still in session ``sid``."""
    ps = subprocess.run(["ps", "-eo", "sid=,stat=,pid=,args="], capture_output=True, text=True)
    return [
        line
        for line in ps.stdout.splitlines()
        if line.split()[0] == str(sid) and not line.split()[1].startswith("Z")
    ]


def _server_sessions(pid: int) -> list[int]:
    """Session IDs of the uvicorn processes whose parent is ``pid``."""
    ps = subprocess.run(["ps", "-eo", "ppid=,sid=,args="], capture_output=True, text=True)
    return [
        int(line.split()[1])
        for line in ps.stdout.splitlines()
        if line.split()[0] == str(pid) and "uvicorn" in line
    ]


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signalled_campaign_saves_stops_and_resumes(tmp_path, sig, code, faults):
    spec, out = _long_campaign(tmp_path), tmp_path / "out"
    proc = start_campaign_run(spec, out=out)  # a session of its own: the signal goes to the group
    servers: list[int] = []
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None and _trained_steps(out) < 200:
            servers = servers or _server_sessions(proc.pid)
            time.sleep(0.1)
        assert proc.poll() is None, "the campaign ended before it could be interrupted"
        os.killpg(proc.pid, sig)
        faults.sent(sig.name)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == code, output[-3000:]
    assert f"interrupted by {sig.name}" in output and "Rerun the same command" in output
    assert "not stopped within the grace" not in output
    assert servers and all(s != proc.pid for s in servers)  # the server had its own session
    time.sleep(1)
    assert [_session_alive(s) for s in servers] == [[] for _ in servers]  # no orphan server
    assert _session_alive(proc.pid) == []
    saved = _saved_within_grace(out, sig.name)
    faults.add("saved_within_grace")
    assert not (out / "manifest.json").exists()

    rerun = campaign_cli("run", str(spec), "--out", str(out), cwd=ROOT)
    assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-3000:]
    assert _resumed_from(out) == saved


# --- a cancellation from the Prefect UI, on the real stack ---------------------------------------
def _gpu_slots(stack: dict[str, Any], name: str) -> int:
    return api(stack["api"], "GET", f"/v2/concurrency_limits/{name}")["active_slots"]


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_a_cancel_from_the_ui_saves_ends_cancelled_frees_the_slot_and_resumes(
    stack, tmp_path, faults
):
    spec, out = _long_campaign(tmp_path), tmp_path / "out"
    lock = yaml.safe_load(spec.read_text())["gpu_lock"]["name"]
    started = subprocess.run(
        [
            "prefect",
            "deployment",
            "run",
            "campaign/main",
            "--param",
            f"spec={json.dumps(str(spec))}",
            "--param",
            f"out={json.dumps(str(out))}",
        ],
        env=stack["env"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert started.returncode == 0, started.stdout + started.stderr
    found = re.search(r"UUID: ([0-9a-f-]{36})", started.stdout)
    assert found, started.stdout
    flow_run_id = found.group(1)
    deadline = time.monotonic() + 300
    state: dict[str, Any] = {}
    while time.monotonic() < deadline and _trained_steps(out) < 200:
        state = api(stack["api"], "GET", f"/flow_runs/{flow_run_id}")["state"] or {}
        assert state.get("type") in ("SCHEDULED", "PENDING", "RUNNING"), (state, worker_log(stack))
        time.sleep(0.2)
    assert _trained_steps(out) >= 200, worker_log(stack)
    assert _gpu_slots(stack, lock) == 1  # the control run holds the GPU

    # What the UI's "Cancel" button sends (Prefect 3.9.1, ui-v2: flow-run page).
    api(
        stack["api"],
        "POST",
        f"/flow_runs/{flow_run_id}/set_state",
        {"state": {"type": "CANCELLING", "name": "Cancelling"}, "force": True},
    )
    faults.sent("SIGTERM")  # the worker's, to the flow-run process
    state = wait_flow_run(stack, flow_run_id)
    assert state.get("type") == "CANCELLED", (state, worker_log(stack))
    # Right at the end, long before the 600 s lease could have returned a lost slot.
    assert _gpu_slots(stack, lock) == 0
    saved = _saved_within_grace(out, "SIGTERM")
    faults.add("saved_within_grace")
    assert "rerun to resume" in (state.get("message") or ""), state
    assert not (out / "manifest.json").exists()

    rerun_id, rerun = run_deployment(stack, "campaign/main", spec=str(spec), out=str(out))
    assert rerun.get("type") == "COMPLETED", (rerun, worker_log(stack))
    assert _resumed_from(out) == saved
    assert rerun_id != flow_run_id
