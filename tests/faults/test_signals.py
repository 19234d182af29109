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
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
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
    ps = subprocess.run(
        ["ps", "-ww", "-eo", "sid=,stat=,pid=,args="], capture_output=True, text=True
    )
    return [
        line
        for line in ps.stdout.splitlines()
        if line.split()[0] == str(sid) and not line.split()[1].startswith("Z")
    ]


def _server_sessions(pid: int) -> list[int]:
    """Session IDs of the uvicorn processes whose parent is ``pid``."""
    ps = subprocess.run(["ps", "-ww", "-eo", "ppid=,sid=,args="], capture_output=True, text=True)
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
    assert "Traceback" not in output, output[-5000:]
    # An interruption, not a failure: the flow run and its training task end Cancelled.
    flow_state, tasks = _final_states(out)
    assert flow_state == "CANCELLED", (flow_state, tasks)
    assert [s for name, s in tasks if name.startswith("train[")] == ["CANCELLED"], tasks
    assert "FAILED" not in {s for _, s in tasks}, tasks
    assert servers and all(s != proc.pid for s in servers)  # the server had its own session
    # No orphan server within a second (polled: the test goes on as soon as they are gone).
    gone_by = time.monotonic() + 1.0
    while any(_session_alive(s) for s in [*servers, proc.pid]) and time.monotonic() < gone_by:
        time.sleep(0.05)
    assert [_session_alive(s) for s in servers] == [[] for _ in servers]  # no orphan server
    assert _session_alive(proc.pid) == []
    saved = _saved_within_grace(out, sig.name)
    faults.add("saved_within_grace")
    assert not (out / "manifest.json").exists()

    rerun = campaign_cli("run", str(spec), "--out", str(out), cwd=ROOT)
    assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-3000:]
    assert _resumed_from(out) == saved
    # The rerun says so, once: the run, the step and the checkpoint it resumes from.
    said = f"resuming control from step {saved} (checkpoint step-{saved:09d} in "
    assert rerun.stderr.count(said) == 1, rerun.stderr[-3000:]


def _final_states(out: Path) -> tuple[str, list[tuple[str, str]]]:
    """The state of the campaign flow run into ``out`` and its task runs' (name, state), read
    from the embedded database of this session's Prefect home."""
    db = Path(os.environ["PREFECT_HOME"]) / "prefect.db"
    with sqlite3.connect(db) as con:
        rows = con.execute(
            "SELECT id, state_type FROM flow_run WHERE parameters LIKE ? ORDER BY created",
            (f'%"{out}"%',),
        ).fetchall()
        assert rows, f"no flow run into {out}"
        run_id, state = rows[-1]
        tasks = con.execute(
            "SELECT name, state_type FROM task_run WHERE flow_run_id = ? ORDER BY created",
            (run_id,),
        ).fetchall()
    return state, [(name, task_state) for name, task_state in tasks]


def _pid_gone(pid: int, within_s: float) -> bool:
    """Wait up to ``within_s`` for ``pid`` to end (a zombie counts as ended)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.1)
    return False


@pytest.mark.slow
@pytest.mark.process
@pytest.mark.timeout(300)
def test_a_sigkilled_campaign_run_leaves_no_server(tmp_path, faults):
    """Killed without a chance to stop it (out of memory), `campaign run` takes its embedded
    server with it: the server's lifeline sees its parent gone and stops it."""
    spec, out = _long_campaign(tmp_path), tmp_path / "out"
    proc = start_campaign_run(spec, out=out)
    servers: list[int] = []
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None and not servers:
            servers = _server_sessions(proc.pid)  # a session leader: its PID is its session
            time.sleep(0.2)
        if not servers:
            proc.kill()
            raise AssertionError(f"no embedded server came up: {proc.communicate()[0][-3000:]}")
        time.sleep(2)  # the server answers: the flow is starting against it
        os.kill(proc.pid, signal.SIGKILL)  # the process alone, like the out-of-memory killer
        faults.sent("SIGKILL")
        proc.wait(timeout=30)
        left = [pid for pid in servers if not _pid_gone(pid, within_s=5)]
        faults.add("orphan_servers_left", len(left))
        assert left == [], [_session_alive(s) for s in left]
    finally:
        for pid in [proc.pid, *servers]:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
        proc.wait(timeout=30)


def _lock_process(role: str, lock: str, campaign: str, out: Path) -> tuple[Any, list[str]]:
    """``tests.helpers.lockholder`` in a session of its own; its output lines, read as they
    come."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.lockholder", role, lock, campaign, str(out)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))

    threading.Thread(target=read, daemon=True).start()
    return proc, lines


def _wait_line(proc: Any, lines: list[str], prefix: str, within_s: float) -> str:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        found = [line for line in lines if line.startswith(prefix)]
        if found:
            return found[0]
        assert proc.poll() is None, "\n".join(lines[-40:])
        time.sleep(0.1)
    raise AssertionError(f"no '{prefix}' within {within_s} s:\n" + "\n".join(lines[-40:]))


@pytest.mark.slow
@pytest.mark.process
@pytest.mark.timeout(400)
def test_a_killed_holder_gives_the_gpu_slot_back_within_seconds(tmp_path, faults):
    """Two campaigns of one machine, each with its own embedded server on the shared database:
    the holder is SIGKILLed while the other waits; its slot comes back in seconds, not after
    the 600 s lease, and the waiter said whom it was waiting for."""
    lock = f"gpu-{uuid.uuid4().hex[:8]}"
    holder_out, waiter_out = tmp_path / "holder-out", tmp_path / "waiter-out"
    holder, holder_lines = _lock_process("holder", lock, "holding-campaign", holder_out)
    waiter: Any = None
    try:
        holder_server = int(_wait_line(holder, holder_lines, "server ", 180).split()[1])
        _wait_line(holder, holder_lines, "held ", 60)
        waiter, waiter_lines = _lock_process("waiter", lock, "waiting-campaign", waiter_out)
        said = _wait_line(waiter, waiter_lines, "waiting for GPU lock", 180)
        assert "campaign 'holding-campaign'" in said, said
        assert f"output folder {holder_out}" in said and f"PID {holder.pid} " in said, said

        os.kill(holder.pid, signal.SIGKILL)
        faults.sent("SIGKILL")
        killed = time.monotonic()
        holder.wait(timeout=30)
        _wait_line(waiter, waiter_lines, "held ", 30)
        waited = time.monotonic() - killed
        assert waited < 15, waited
        assert any("gave back the slot of campaign 'holding-campaign'" in x for x in waiter_lines)
        assert waiter.wait(timeout=60) == 0, "\n".join(waiter_lines[-40:])
        faults.add("dead_holders_freed")
        assert _pid_gone(holder_server, within_s=5)  # the holder's server died with it
    finally:
        for proc in (holder, waiter):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)


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
