"""Graceful interruption: a stop request saves at the next step and raises; SIGINT/SIGTERM
to a real `campaign run` save, record the segment, stop the server, exit 130/143; the rerun
resumes."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpucampaign import interrupt
from gpucampaign.interrupt import Interrupted
from gpucampaign.metrics import read_metrics
from gpucampaign.records import read_timeline
from tests._engine import digits_file, make_spec, run, run_dir, train_losses  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _no_stop_left():
    interrupt.clear_stop()
    yield
    interrupt.clear_stop()


def test_interrupted_keeps_its_reason_step_and_exit_code_through_pickle():
    exc = Interrupted("SIGTERM", step=42)
    back = pickle.loads(pickle.dumps(exc))  # Prefect keeps task exceptions pickled
    assert (back.reason, back.step, str(back)) == ("SIGTERM", 42, str(exc))
    assert "step 42" in str(exc)
    assert (Interrupted("SIGINT").exit_code, back.exit_code, Interrupted("other").exit_code) == (
        130,
        143,
        1,
    )


def test_a_stop_request_keeps_its_first_reason_and_stops_work_not_started():
    interrupt.raise_if_stopped(what="nothing")  # no request: no error
    interrupt.request_stop("SIGTERM")
    interrupt.request_stop("SIGINT")
    assert interrupt.stop_requested() == "SIGTERM"
    with pytest.raises(Interrupted, match="the pilot not started") as err:
        interrupt.raise_if_stopped(what="the pilot")
    assert err.value.reason == "SIGTERM"
    interrupt.clear_stop()
    assert interrupt.stop_requested() is None


def test_a_signal_becomes_a_stop_request_and_the_handlers_come_back():
    before = signal.getsignal(signal.SIGTERM)
    with interrupt.graceful_signals(grace_s=600) as previous:
        assert previous[signal.SIGTERM] is before
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 5
        while interrupt.stop_requested() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert interrupt.stop_requested() == "SIGTERM"
        os.kill(os.getpid(), signal.SIGTERM)  # a second SIGTERM changes nothing
        time.sleep(0.05)
        assert interrupt.stop_requested() == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before
    with pytest.raises(ValueError, match="grace_s"), interrupt.graceful_signals(grace_s=0):
        pass


def test_a_stop_saves_the_step_reached_and_the_rerun_resumes_identically(tmp_path, digits_file):  # noqa: F811
    spec = make_spec(tmp_path, digits_file)
    alone = run(spec, tmp_path, out="alone")
    saved: list[int] = []

    def stop_at_step_7(info: dict[str, Any]) -> None:
        if info["step"] >= 7:
            interrupt.request_stop("SIGINT")

    with pytest.raises(Interrupted) as err:
        run(spec, tmp_path, progress=stop_at_step_7, on_save=lambda s: saved.append(s["step"]))
    step = err.value.step
    assert err.value.reason == "SIGINT" and step is not None and 7 <= step < 20
    assert saved[-1] == step  # the heartbeat callback saw the stop's checkpoint
    latest = json.loads(
        (tmp_path / "out" / "checkpoints" / spec.run_id("control") / "LATEST").read_text()
    )
    assert latest["step"] == step
    rows = read_metrics(run_dir(spec, tmp_path) / "metrics.jsonl")
    assert {"kind": "interrupt", "step": step, "reason": "SIGINT"} in [
        {k: r.get(k) for k in ("kind", "step", "reason")} for r in rows
    ]

    interrupt.clear_stop()
    res = run(spec, tmp_path)
    assert res.completed and res.resumed_from_step == step
    assert res.metrics == alone.metrics
    assert train_losses(run_dir(spec, tmp_path) / "metrics.jsonl") == train_losses(
        run_dir(spec, tmp_path, out="alone") / "metrics.jsonl"
    )


# --- a real `campaign run` in a terminal-like process group ------------------------------------
def _long_campaign(tmp: Path) -> Path:
    from tests.test_flow import tiny_campaign

    def edit(data: dict[str, Any]) -> None:
        data["control"].update(epochs=400)  # ~8000 steps: long enough to be interrupted
        data["variants"] = []
        data["calendar"] = [s for s in data["calendar"] if s.get("run") in (None, "control")]
        data["checkpoint"] = {"every_steps": 5000, "keep": 3}  # no save near the signal

    return tiny_campaign(tmp, edit=edit)


def _trained_steps(out: Path) -> int:
    files = list((out / "runs").glob("*/metrics.jsonl")) if (out / "runs").exists() else []
    return sum(1 for p in files for r in read_metrics(p) if r["kind"] == "train")


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
def test_a_signalled_campaign_saves_stops_and_resumes(tmp_path, sig, code):
    spec, out = _long_campaign(tmp_path), tmp_path / "out"
    campaign_bin = str(Path(sys.executable).parent / "campaign")
    # A session of its own, like a terminal's foreground group: the signal goes to the group.
    proc = subprocess.Popen(
        [campaign_bin, "run", str(spec), "--out", str(out)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    servers: list[int] = []
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None and _trained_steps(out) < 200:
            servers = servers or _server_sessions(proc.pid)
            time.sleep(0.1)
        assert proc.poll() is None, "the campaign ended before it could be interrupted"
        sent = time.monotonic()
        os.killpg(proc.pid, sig)
        output, _ = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == code, output[-3000:]
    assert took < 20, took
    assert f"interrupted by {sig.name}" in output and "Rerun the same command" in output
    assert servers and all(s != proc.pid for s in servers)  # the server had its own session
    time.sleep(1)
    assert [_session_alive(s) for s in servers] == [[] for _ in servers]  # no orphan server
    assert _session_alive(proc.pid) == []

    latest = json.loads(next((out / "checkpoints").glob("control-*/LATEST")).read_text())
    assert latest["step"] > 5  # past the pilot's checkpoint
    cut = [r for r in read_timeline(out) if r.phase == "train"]
    assert cut and cut[-1].interrupted and f"interrupted by {sig.name}" in cut[-1].outcome
    assert cut[-1].checkpoint_step == latest["step"] and cut[-1].end is not None
    assert not (out / "manifest.json").exists()

    rerun = subprocess.run(
        [campaign_bin, "run", str(spec), "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-3000:]
    result = json.loads(next((out / "runs").glob("control-*/result.json")).read_text())
    assert result["completed"] and result["resumed_from_step"] == latest["step"]
