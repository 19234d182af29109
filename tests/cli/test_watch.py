"""The live view: `campaign run`'s progress lines and `campaign watch OUT`."""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from gpucampaign.cli import app
from gpucampaign.cli.progress import LiveView
from gpucampaign.core.clock import DrivenClock, use_clock
from gpucampaign.folder.progress import write_progress

ROOT = Path(__file__).resolve().parents[2]
LIVE_LINE = re.compile(r"^(pilot|train) \S+  \d+/\d+.*  loss [\d.]+  .*steps/s  ETA (\?|\d+\w+)")
runner = CliRunner()


def record(step: int, *, state: str = "running") -> dict:
    return {
        "run_id": "control-0123456789",
        "run": "control",
        "phase": "train",
        "state": state,
        "step": step,
        "target_steps": 400,
        "planned_steps": 400,
        "loss": 0.5,
        "metric": "accuracy",
        "metric_value": 0.9,
        "metric_step": 100,
        "steps_per_s": 100.0,
        "eta_s": (400 - step) / 100.0,
        "elapsed_s": 4.0,
        "updated_at": time.time(),
    }


def campaign_folder(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    (out / "runs" / "control-0123456789").mkdir(parents=True)
    shutil.copy(ROOT / "examples" / "digits" / "campaign.yaml", out / "spec.yaml")
    return out


def test_plain_mode_repeats_a_running_phase_at_most_every_n_seconds(tmp_path):
    out = campaign_folder(tmp_path)
    run_dir = out / "runs" / "control-0123456789"
    buf = io.StringIO()
    view = LiveView(out, console=Console(file=buf, width=200), every_s=3600, live=False)
    with view:
        write_progress(run_dir, record(100))
        view.poll()
        write_progress(run_dir, record(200))
        view.poll()  # within every_s: not repeated
        write_progress(run_dir, record(400, state="done"))
        view.poll()  # the end of a phase is always said
    lines = buf.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("train control  100/400  loss 0.5000  accuracy 0.9000 (step 100)")
    assert "ETA 3s" in lines[0]
    assert "400/400" in lines[1] and "done in 4s" in lines[1]


def test_watch_prints_the_line_and_exits_once_the_campaign_is_closed(tmp_path):
    out = campaign_folder(tmp_path)
    write_progress(out / "runs" / "control-0123456789", record(400, state="done"))
    time.sleep(0.05)
    (out / "manifest.json").write_text("{}")  # sealed after the last progress: closed
    got = runner.invoke(app, ["watch", str(out), "--every", "1"])
    assert got.exit_code == 0, got.output
    assert "train control  400/400  loss 0.5000  accuracy 0.9000" in got.output
    assert "the campaign is closed" in got.output


def test_watch_refuses_a_folder_that_is_no_campaigns(tmp_path):
    got = runner.invoke(app, ["watch", str(tmp_path), "--once"])  # a look: no wait
    assert got.exit_code == 2
    assert "not a campaign output folder" in " ".join(got.output.split())


class _Starting(DrivenClock):
    """The clock of a watch begun before `campaign run` made its folder: the run writes the
    folder at the watch's ``at``-th wait."""

    def __init__(self, start: Callable[[], None] | None, *, at: int) -> None:
        super().__init__(datetime(2026, 12, 6, tzinfo=UTC))
        self.start_run, self.at = start, at

    def sleep(self, seconds: float) -> None:
        super().sleep(seconds)
        if self.start_run is not None and len(self.slept) == self.at:
            self.start_run()


def test_watch_right_after_run_starts_waits_for_the_folder(tmp_path):
    out = tmp_path / "out"

    def run_starts() -> None:
        assert not out.exists() and campaign_folder(tmp_path) == out

    with use_clock(_Starting(run_starts, at=3)) as clock:
        got = runner.invoke(app, ["watch", str(out), "--once", "--wait", "60"])
    text = " ".join(got.output.split())
    assert got.exit_code == 0, text
    assert "waiting up to 60 s" in text and "watching" in text
    assert clock.slept == [0.5, 0.5, 0.5]  # waited on the driven clock: no real time
    with use_clock(_Starting(None, at=0)) as clock:
        got = runner.invoke(app, ["watch", str(tmp_path / "never"), "--wait", "5"])
    text = " ".join(got.output.split())
    assert got.exit_code == 2 and "waiting up to 5 s" in text and "(waited 5 s)" in text
    assert sum(clock.slept) == pytest.approx(5.0)


def test_report_on_a_running_campaign_points_to_watch(tmp_path):
    out = campaign_folder(tmp_path)
    got = runner.invoke(app, ["report", str(out)])
    text = " ".join(got.output.split())
    assert got.exit_code == 2 and f"campaign watch {out}" in text and "not closed" in text


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_campaign_run_without_a_terminal_prints_periodic_progress_lines(tmp_path):
    """CliRunner is no terminal: plain lines, one per phase at least, and no Prefect INFO."""
    spec = _control_only(tmp_path)
    got = runner.invoke(
        app, ["run", str(spec), "--out", str(tmp_path / "out"), "--progress-every", "0.5"]
    )
    assert got.exit_code == 0, got.output
    lines = [ln for ln in got.output.splitlines() if ln.startswith(("pilot ", "train "))]
    assert any(ln.startswith("pilot control") and "done in" in ln for ln in lines), lines
    assert any(ln.startswith("train control") and "done in" in ln for ln in lines), lines
    assert all("loss" in ln and "steps/s" in ln for ln in lines)
    assert "Starting temporary server" not in got.output
    assert "Finished in state" not in got.output


def _control_only(tmp: Path) -> Path:
    """The demo's spec (`campaign init`) with its control alone, trained in full (its loss
    falls below 1), no restart check and no round of seeds: the lines of a training phase are
    all these tests read, and the demo's other runs and processes only lengthened them."""
    import yaml

    from gpucampaign.cli.scaffold import init_campaign
    from tests.flows.test_campaign import no_restart_check

    spec = init_campaign(tmp / "spec")
    data = yaml.safe_load(spec.read_text())
    data["variants"] = []
    data["calendar"] = [s for s in data["calendar"] if s.get("run") in (None, "control")]
    no_restart_check(data)
    data["decision_point"] = {**(data.get("decision_point") or {}), "rounds": 0}
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    return spec


def _capture(session: str) -> str:
    return subprocess.run(
        ["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True
    ).stdout


def _drawn_lines(stream: Path) -> list[str]:
    """Every line the terminal was sent (the pane's byte stream, escapes removed): a live line
    redrawn between two captures of the pane is still seen."""
    raw = stream.read_bytes().decode("utf-8", "replace") if stream.exists() else ""
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]|\x1b[=>]", "\n", raw)
    return [ln.strip() for ln in re.split(r"[\r\n]", text) if ln.strip()]


@pytest.mark.slow
@pytest.mark.process
@pytest.mark.timeout(600)
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_a_terminal_shows_the_live_line_mid_run(tmp_path):
    """`campaign run SPEC --out X` (the demo's control alone) in a tmux pane: while a phase
    trains, the pane shows its live line with the step, the loss and the ETA (read from the
    captured pane, or from the pane's stream when a digits run, ~1 s, ends between captures)."""
    session = f"gpc{os.getpid()}"
    out, stream = tmp_path / "out", tmp_path / "pane.bytes"
    spec = _control_only(tmp_path)
    cmd = (
        f"sleep 1; cd {ROOT} && PYTHONPATH={ROOT / 'src'} {sys.executable} -m gpucampaign.cli "
        f"run {spec} --out {out}; echo EXIT=$?; sleep 600"
    )
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", session, "-x", "200", "-y", "50", cmd], check=True
    )
    try:
        subprocess.run(["tmux", "pipe-pane", "-t", session, f"cat >> {stream}"], check=True)
        captured: list[str] = []
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            pane = _capture(session)
            # A line read while the terminal redraws it may be cut: only a whole one counts.
            captured += [ln for ln in pane.splitlines() if LIVE_LINE.match(ln)]
            if "EXIT=" in pane:
                break
            time.sleep(0.1)
        assert "EXIT=0" in pane, pane
        drawn = [ln for ln in _drawn_lines(stream) if LIVE_LINE.match(ln)]
        seen = captured or drawn
        assert seen, f"no live line seen; the pane:\n{pane}\nthe stream:\n{_drawn_lines(stream)}"
        assert any(" steps/s  ETA " in ln and "loss 0." in ln for ln in seen), seen
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)


def test_a_stop_rule_is_no_prefect_error_line_in_the_terminal():
    """A futile variant is an outcome the campaign plans for: Prefect's ERROR line for its task
    is dropped (the progress line and the flow's warning say it); other errors stay."""
    import logging

    from gpucampaign.cli.runner import ExpectedStops
    from gpucampaign.core.stoprules import Futile

    def log_record(level: int, msg: str, exc: BaseException | None = None) -> logging.LogRecord:
        info = (type(exc), exc, None) if exc is not None else None
        return logging.LogRecord("prefect.task_runs", level, __file__, 1, msg, None, info)

    keep = ExpectedStops().filter
    futile = (
        "Finished in state Failed('Task run encountered an exception Futile: futile: cannot "
        "win: at step 40 ...')"
    )
    assert not keep(log_record(logging.ERROR, futile))
    assert not keep(log_record(logging.ERROR, "Task run failed", Futile("r", "cannot win", step=4)))
    crash = "Finished in state Failed('Task run encountered an exception RuntimeError: boom')"
    assert keep(log_record(logging.ERROR, crash))
    assert keep(log_record(logging.ERROR, "Task run failed", RuntimeError("boom")))
    assert keep(log_record(logging.WARNING, futile))  # below ERROR: the level setting decides
