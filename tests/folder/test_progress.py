"""The live progress record of a training call: its line, its file, its write cadence."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from gpucampaign.folder.layout import is_live_progress
from gpucampaign.folder.progress import (
    ProgressFile,
    read_all_progress,
    read_progress,
    relay_check_progress,
    render_line,
    say_seconds,
    step_rate,
    write_progress,
)

RECORD = {
    "run_id": "control-0123456789",
    "run": "control",
    "phase": "train",
    "state": "running",
    "step": 230,
    "target_steps": 460,
    "planned_steps": 460,
    "loss": 0.123456,
    "metric": "accuracy",
    "metric_value": 0.961111,
    "metric_step": 207,
    "steps_per_s": 85.2,
    "eta_s": 125.0,
    "elapsed_s": 3.0,
}


def test_the_line_shows_run_step_loss_metric_rate_eta_and_the_lot():
    now = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
    line = render_line(RECORD, ends_at=now + timedelta(days=2, hours=3), now=now)
    assert line == (
        "train control  230/460  loss 0.1235  accuracy 0.9611 (step 207)  85.2 steps/s  "
        "ETA 2m05s  lot 2d03h left"
    )


def test_the_line_before_any_measure_and_once_done():
    early = {**RECORD, "loss": None, "metric_value": None, "steps_per_s": None, "eta_s": None}
    line = render_line(early)
    assert "loss -" in line and "accuracy - (no eval yet)" in line and "ETA ?" in line
    assert "lot" not in line  # no dated lot: no time left shown
    done = render_line({**RECORD, "state": "done", "step": 460})
    assert "460/460" in done and "done in 3s" in done and "ETA" not in done
    pilot = render_line({**RECORD, "phase": "pilot", "step": 20, "target_steps": 20})
    assert pilot.startswith("pilot control  20/20 (of 460)")


def test_durations_and_rates():
    assert [say_seconds(s) for s in (None, -1, 0, 42, 185, 7620, 273600)] == [
        "?",
        "?",
        "0s",
        "42s",
        "3m05s",
        "2h07m",
        "3d04h",
    ]
    assert step_rate([]) is None
    assert step_rate([0.5] * 100) == 2.0


def test_the_file_is_written_when_due_and_read_back(tmp_path):
    run_dir = tmp_path / "runs" / "control-0123456789"
    run_dir.mkdir(parents=True)
    live = ProgressFile(run_dir, every_s=3600)
    assert live.update(RECORD) and not live.update({**RECORD, "step": 231})
    assert read_progress(run_dir)["step"] == 230
    assert live.update({**RECORD, "step": 232}, force=True)
    got = read_all_progress(tmp_path)
    assert [r["step"] for r in got] == [232] and got[0]["updated_at"] > 0
    assert json.loads((run_dir / "progress.json").read_text())["run"] == "control"
    assert is_live_progress("runs/control-0123456789/progress.json")
    assert not is_live_progress("runs/control-0123456789/model/progress.json")
    assert read_progress(tmp_path / "nowhere") is None


def test_a_restart_checks_progress_is_relayed_to_the_run_folder(tmp_path):
    work, run_dir = tmp_path / "work", tmp_path / "out" / "runs" / "control-0123456789"
    (work / "restarted" / "runs" / "x").mkdir(parents=True)
    run_dir.mkdir(parents=True)
    relay_check_progress(work, run_dir)  # nothing written yet by the new process: no record
    assert read_all_progress(tmp_path / "out") == []
    write_progress(work / "restarted" / "runs" / "x", {**RECORD, "step": 12})
    relay_check_progress(work, run_dir)
    relay_check_progress(work, run_dir, state="done")
    (got,) = read_all_progress(tmp_path / "out")
    assert got["phase"] == "restart-check" and got["step"] == 12 and got["state"] == "done"
    assert is_live_progress("runs/control-0123456789/progress-restart.json")
    assert render_line(got).startswith("restart-check control  12/460")
