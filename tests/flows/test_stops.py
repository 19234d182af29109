"""Every path ends well: a stop is a record first, a stopped campaign closes with its report, the
restart checks understand stopped runs, and an interruption reads as one.

Real campaigns on CPU (`campaign init` cut down to seconds: ``tiny_campaign``), run in-process
under the test server or as a real `campaign run` whose output (stdout and stderr) is checked.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpucampaign.verify.checks import verify_output
from tests.cli.test_watch import _capture
from tests.faults.test_signals import _long_campaign, _trained_steps
from tests.flows.test_campaign import campaign_cli, jsonl, run_flow, tiny_campaign
from tests.flows.test_futility import cannot_win

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]

# `campaign run` in a fresh interpreter, the corpus altered right after the first checkpoint
# of the campaign (the control's pilot): the way a user's edit or a sync tool would cut it off.
_ALTER_AFTER_FIRST_SAVE = """
import sys
from pathlib import Path

corpus = Path(sys.argv[1])
import gpucampaign.folder.segments as segments

saved = segments.heartbeat


def heartbeat(timeline, row, **kw):
    saved(timeline, row, **kw)
    if not getattr(heartbeat, "done", False):
        heartbeat.done = True
        with corpus.open("a") as f:
            f.write("\\n")


segments.heartbeat = heartbeat
sys.argv = ["campaign", "run", sys.argv[2], "--out", sys.argv[3]]
from gpucampaign.cli.commands import main

main()
"""


def _no_noise(text: str) -> None:
    assert "Traceback" not in text, text[-5000:]
    assert "| ERROR" not in text and "ERROR |" not in text, text[-5000:]


def test_an_input_changed_mid_campaign_stops_it_and_it_closes(tmp_path):
    spec = tiny_campaign(tmp_path)
    out = tmp_path / "out"
    corpus = spec.parent / "data" / "digits.csv"
    proc = subprocess.run(
        [sys.executable, "-c", _ALTER_AFTER_FIRST_SAVE, str(corpus), str(spec), str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=800,
    )
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-5000:]
    _no_noise(proc.stdout + proc.stderr)
    stops = jsonl(out / "stops.jsonl")
    # Every stop that fired is recorded with its ID, rule, run and reason; none is invented.
    assert {s["rule"] for s in stops} == {"essential_input_missing"}, stops
    by_run = {s["run"]: s for s in stops}
    assert {"control", "lr-high"} <= set(by_run)
    assert all(s["stop_id"].startswith("stop-") and "altered" in s["reason"] for s in stops)
    assert len({s["stop_id"] for s in stops}) == len(stops) == len(by_run)
    control = by_run["control"]
    assert control["stop_id"] in proc.stdout + proc.stderr
    # The restart check read the control's stop: its last checkpoint checked, not a new stop.
    restart = json.loads((out / "restart.json").read_text())
    assert restart["mode"] == "stopped" and "checkpoint of step 5" in restart["checked"]
    # The close: the report with the spend and the stops, the manifest, RELOAD.md; verified.
    report = (out / "report.md").read_text()
    assert "**Spent: 47.14 USD**" in report
    # What each run reached: the control its pilot's 5 steps, the others none.
    assert f"| control | `{control['run_id']}` | essential | stopped | step 5 |" in report
    assert f"`{control['stop_id']}` essential_input_missing on control" in report
    assert "## Inputs changed during the campaign" in report
    assert "the corpus 'data/digits.csv' changed during the campaign" in report
    assert "Rejected deliveries:" in report and f"(stop {control['stop_id']})" in report
    assert (out / "RELOAD.md").is_file() and (out / "manifest.json").is_file()
    assert verify_output(out, reload=True).verified

    # The corpus put back, a rerun of the closed campaign says it is closed, repeats nothing
    # and does not say its old stops again as news.
    corpus.write_bytes(corpus.read_bytes()[:-1])
    timeline = (out / "timeline.jsonl").read_text()
    rerun = campaign_cli("run", str(spec), "--out", str(out), cwd=ROOT)
    assert rerun.returncode == 3, rerun.stdout[-2000:] + rerun.stderr[-3000:]
    assert "closed campaign:" in rerun.stderr and "rewrote nothing" in rerun.stderr
    _no_noise(rerun.stdout + rerun.stderr)
    assert "stopped; the campaign closes" not in rerun.stderr
    assert "WARNING" not in rerun.stderr, rerun.stderr
    assert jsonl(out / "stops.jsonl") == stops
    added = (out / "timeline.jsonl").read_text()[len(timeline) :]
    assert '"phase": "train"' not in added and '"phase": "pilot"' not in added


def _task_states(flow_run_id: Any) -> list[tuple[str, Any]]:
    """(name, final state) of every task run of a flow run on the test server. Prefect records
    task runs' states from their events, after the flow run has ended (a CI run once read a
    task run with no state yet): read again until each has one, for at most 30 s."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    deadline = time.monotonic() + 30.0
    with get_client(sync_client=True) as client:
        while True:
            runs = client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
            )
            if all(r.state is not None for r in runs) or time.monotonic() > deadline:
                return [(r.name, r.state) for r in runs]
            time.sleep(0.2)


def _corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_the_scheduled_check_understands_stopped_runs(prefect_harness, tmp_path):
    def edit(data: dict[str, Any]) -> None:
        cannot_win(data)
        data["stop_rules"] = {
            "non_finite_loss": True,
            "below_threshold": True,
            "quality_floor": 0.9999,
            "require_restart": True,
            "futility": True,
        }

    spec = tiny_campaign(tmp_path, edit=edit)
    out = tmp_path / "out"
    state = run_flow(spec, out)
    assert state.is_completed(), state.message
    rules = {s["run"]: s["rule"] for s in jsonl(out / "stops.jsonl")}
    assert (rules["control"], rules["narrow"]) == ("below_threshold", "futile")
    # In the UI a stop is what it is: its task run ends Stopped (a Completed state) with the
    # stop's message, never a red Failed one.
    tasks = _task_states(state.state_details.flow_run_id)
    narrow_task = next(s for name, s in tasks if name.startswith("train[narrow-"))
    assert (narrow_task.type.value, narrow_task.name) == ("COMPLETED", "Stopped")
    assert "futile: cannot win" in (narrow_task.message or "")
    assert not [name for name, s in tasks if s.is_failed()], tasks

    from gpucampaign_prefect.flows.restart_check import restart_verification

    reports = {r["run"]: r for r in restart_verification(out=str(out), steps=5)}
    assert set(reports) == {"control", "narrow", "lr-high"}
    assert all(r["ok"] for r in reports.values()), reports
    # The futile variant stopped at its last checkpoint: loaded and verified, said so.
    narrow = reports["narrow"]
    assert narrow["mode"] == "stopped" and narrow["compared_steps"] == 0
    assert "the run stopped at step" in narrow["checked"] and "futile" in narrow["checked"]
    assert "it loads, its hashes match and its state is complete" in narrow["checked"]
    # The control below its floor trained every step: the checkpoint before its final one is
    # replayed, and the check says which and why.
    control = reports["control"]
    assert control["compared_steps"] == 5 and "below_threshold" in control["checked"]
    assert "LATEST names step" in control["checked"] and "replayed steps" in control["checked"]

    # The standalone check says the same: which checkpoint, why, and exit 0 for a stopped run.
    from typer.testing import CliRunner

    from gpucampaign.cli import app

    said = CliRunner().invoke(
        app, ["restart-check", str(spec), "--out", str(out), "--run", "narrow", "--steps", "5"]
    )
    assert said.exit_code == 0, said.output
    assert "stopped run, checkpoint sound" in said.output and "futile" in said.output
    said = CliRunner().invoke(
        app, ["restart-check", str(spec), "--out", str(out), "--run", "control", "--steps", "5"]
    )
    assert said.exit_code == 0 and "LATEST names step" in said.output, said.output

    # The futile variant's last checkpoint corrupted: the check fails and names the file.
    rid = narrow["run_id"]
    latest = json.loads((out / "checkpoints" / rid / "LATEST").read_text())
    weights = next((out / "checkpoints" / rid / latest["dir"]).glob("*.safetensors"))
    _corrupt(weights)
    failed = restart_verification(out=str(out), steps=5, return_state=True)
    assert failed.is_failed()
    assert f"{rid}/{latest['dir']}/{weights.name}" in failed.message, failed.message


def test_a_ctrl_c_during_training_prints_no_error_and_no_traceback(tmp_path):
    spec, out = _long_campaign(tmp_path), tmp_path / "out"
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "campaign"), "run", str(spec), "--out", str(out)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a terminal's foreground group: the signal reaches them all
    )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None and _trained_steps(out) < 200:
            time.sleep(0.1)
        assert proc.poll() is None, "the campaign ended before it could be interrupted"
        os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, stdout[-2000:] + stderr[-3000:]
    assert "interrupted by SIGINT" in stderr and "Rerun the same command" in stderr
    for text in (stdout, stderr):
        _no_noise(text)


def test_a_calendar_that_does_not_fit_is_said_before_the_start(tmp_path):
    def edit(data: dict[str, Any]) -> None:
        # A person's 100 h of analysis: the 3-day window cannot hold the calendar, and no
        # reduction of the runs makes it fit.
        next(s for s in data["calendar"] if s["name"] == "analysis")["hours"] = 100

    spec, out = tiny_campaign(tmp_path, edit=edit), tmp_path / "out"
    planned = campaign_cli("plan", str(spec), cwd=ROOT)
    assert planned.returncode == 4 and "30.3 h over" in planned.stdout, planned.stdout[-2000:]
    run = campaign_cli("run", str(spec), "--out", str(out), cwd=ROOT)
    said = [ln for ln in run.stderr.splitlines() if "does not fit its window" in ln]
    assert len(said) == 1, run.stderr[-3000:]
    assert "30.3 h over (span 102.3 h in 72 h)" in said[0]
    assert "options: larger_package, smaller_protocol, second_lot" in said[0]
    # It goes on only as the spec allows: the automatic decision point re-poses the question.
    decision = jsonl(out / "decisions.jsonl")[-1]["decision"]
    assert decision["action"] == "re-pose" and decision["by"] == "auto"
    assert run.returncode == 3, run.stdout[-2000:] + run.stderr[-3000:]
    _no_noise(run.stdout + run.stderr)


def _pane_lines(stream: Path) -> list[str]:
    """The lines the terminal was sent: colours dropped, and every cursor move or erase (how a
    live line is redrawn) taken as a line's end."""
    raw = stream.read_bytes().decode("utf-8", "replace") if stream.exists() else ""
    text = re.sub(r"\x1b\[[0-9;]*m", "", raw)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]|\x1b[=>]", "\n", text)
    return [ln.strip() for ln in re.split(r"[\r\n]", text) if ln.strip()]


@pytest.mark.process
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_a_ctrl_c_in_a_terminal_ends_the_live_line_before_any_log_line(tmp_path):
    """`campaign run` in a tmux pane, Ctrl-C typed while the control trains: the pane shows
    every log line on a line of its own (never glued onto the live line) and no ERROR line."""
    spec, out = _long_campaign(tmp_path), tmp_path / "out"
    session, stream = f"gpcstop{os.getpid()}", tmp_path / "pane.bytes"
    cmd = (
        f"sleep 1; cd {ROOT} && PYTHONPATH={ROOT / 'src'}:{ROOT} {sys.executable} -m "
        f"gpucampaign.cli run {spec} --out {out}; echo EXIT=$?; sleep 600"
    )
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", session, "-x", "220", "-y", "50", cmd], check=True
    )
    try:
        subprocess.run(["tmux", "pipe-pane", "-t", session, f"cat >> {stream}"], check=True)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and _trained_steps(out) < 200:
            time.sleep(0.1)
        subprocess.run(["tmux", "send-keys", "-t", session, "C-c"], check=True)
        while time.monotonic() < deadline and "EXIT=" not in _capture(session):
            time.sleep(0.2)
        pane = _capture(session)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
    assert "EXIT=130" in pane, pane
    drawn = _pane_lines(stream)
    _no_noise("\n".join(drawn))
    log_line = re.compile(r"\d\d:\d\d:\d\d\.\d{3} \| (INFO|WARNING|ERROR)")
    logs = [ln for ln in drawn if log_line.search(ln)]
    assert any("campaign interrupted by SIGINT" in ln for ln in logs), drawn
    # A log line starts its own line: nothing of a live line before its timestamp.
    assert all(log_line.match(ln) for ln in logs), [ln for ln in logs if not log_line.match(ln)]
