"""The live progress record of a training call: its line, its file, its write cadence."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta

from gpucampaign.folder import progress
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
    live.flush()
    assert read_progress(run_dir)["step"] == 230
    assert live.update({**RECORD, "step": 232}, force=True)
    live.close()
    assert not live.update({**RECORD, "step": 233}, force=True)  # closed: nothing more
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


def test_a_write_that_waits_on_the_disk_holds_neither_the_loop_nor_the_last_record(
    tmp_path, monkeypatch
):
    """The loop hands each record over and goes on while a write waits on the disk (a
    rename behind a journal commit: 80-330 ms in a few demo calls); the records handed over
    meanwhile are coalesced to the newest, and ``close`` leaves that one on disk. On the old
    main each write ran in the caller's thread, the first waiting for the gate."""
    run_dir = tmp_path / "runs" / "control-0123456789"
    run_dir.mkdir(parents=True)
    gate, started = threading.Event(), threading.Event()
    writes: list[tuple[bool, int]] = []
    real = progress.write_progress

    def slow(path, record, **kw):
        writes.append((threading.current_thread() is threading.main_thread(), record["step"]))
        started.set()
        gate.wait(timeout=5)  # released below once the loop's updates are all handed over
        real(path, record, **kw)

    monkeypatch.setattr(progress, "write_progress", slow)
    live = ProgressFile(run_dir, every_s=3600)
    assert live.update(RECORD)
    assert started.wait(timeout=5)  # the first write is under way, held at the gate
    for step in (231, 232, 233):
        assert live.update({**RECORD, "step": step}, force=True)
    assert not gate.is_set() and live.record["step"] == 233
    gate.set()
    live.close()
    assert writes == [(False, 230), (False, 233)]  # off the loop's thread; 231, 232 skipped
    assert read_progress(run_dir)["step"] == 233


def test_a_write_that_fails_is_skipped_and_the_next_lands(tmp_path, monkeypatch):
    """A full disk, a vanished folder or anything else a write raises costs the live view one
    record, never the training nor the writer's thread (which ``close`` waits on)."""
    run_dir = tmp_path / "runs" / "control-0123456789"
    run_dir.mkdir(parents=True)
    real, calls = progress.write_progress, []

    def flaky(path, record, **kw):
        calls.append(record["step"])
        if len(calls) == 1:
            raise OSError(28, "No space left on device")
        if len(calls) == 2:
            raise RuntimeError("anything else the write raised")  # the thread lives on
        real(path, record, **kw)

    monkeypatch.setattr(progress, "write_progress", flaky)
    live = ProgressFile(run_dir, every_s=3600)
    assert live.update(RECORD)
    live.flush()
    assert read_progress(run_dir) is None
    assert live.update({**RECORD, "step": 231}, force=True)
    live.flush()
    assert read_progress(run_dir) is None
    assert live.update({**RECORD, "step": 232}, force=True)
    live.close()
    assert calls == [230, 231, 232] and read_progress(run_dir)["step"] == 232
