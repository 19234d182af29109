"""The live view's reports are counted and timed by the call (``timings``: ``reports``,
``report_s``), and the re-forecast's count of them (``plan.reforecast.reports_left``) is the
count the loop makes: a pilot's reports are measured apart from the loop's cost per step, and
each run's are forecast at its own cadence (issue 48)."""

from __future__ import annotations

import threading

from gpucampaign.config.parts import report_every
from gpucampaign.folder import progress as progress_file
from gpucampaign.folder.metrics import read_metrics
from gpucampaign.plan.reforecast import reports_left
from tests.engine.test_loop_calls import _no_clock
from tests.helpers import digits_file, make_spec, run, run_dir, train_losses  # noqa: F401


def test_a_call_counts_the_reports_the_reforecast_counts(tmp_path, digits_file, monkeypatch):  # noqa: F811
    _no_clock(monkeypatch)  # the reports due by the clock (about twice a second) left out
    spec = make_spec(tmp_path, digits_file, control={"epochs": 3})
    shown: list[dict] = []
    pilot = run(spec, tmp_path, stop_after_steps=5, progress=shown.append)
    assert pilot.timings["reports"] >= 1 and pilot.timings["report_s"] > 0
    shown.clear()
    result = run(spec, tmp_path, progress=shown.append)
    planned = result.planned_steps
    per_epoch = planned // 3
    expected = reports_left(done=5, planned=planned, eval_step=per_epoch)
    assert result.timings["reports"] == expected, (planned, per_epoch)
    assert 0 < result.timings["report_s"] < result.timings["train_s"]
    # The progress callback is still called at each ~2% of the run (and at the end), without
    # a report of its own: the rows and the live file are written at evaluations and the end.
    every = report_every(planned)
    told = [info["step"] for info in shown]
    assert set(range(every * (5 // every + 1), planned + 1, every)) <= set(told)
    assert told[-1] == planned


def test_a_pilot_that_held_no_evaluation_times_one_and_records_none(tmp_path, digits_file):  # noqa: F811
    """5 pilot steps of a run that evaluates at each epoch's end: one evaluation is timed after
    the pilot's last save, no row of it written, and a read of that save (the restore of the
    call that resumes it); the run trained on from the pilot ends with the same losses as one
    never piloted."""
    spec = make_spec(tmp_path, digits_file, control={"epochs": 2})
    unasked = run(spec, tmp_path, stop_after_steps=5, out="unasked")  # the restart check's
    assert unasked.timings["probe_eval_s"] is None and unasked.timings["probe_restore_s"] is None
    pilot = run(spec, tmp_path, stop_after_steps=5, probe_eval=True)
    assert pilot.timings["eval_s"] == [] and pilot.timings["probe_eval_s"] > 0
    assert pilot.timings["probe_restore_s"] > 0  # main: not timed
    # The loop's counters marked after the warm-up and before the last step (pilot_marks),
    # then at its end
    assert [m["step"] for m in pilot.timings["marks"]] == [1, 4, 5]
    end = pilot.timings["marks"][-1]
    assert end["at_s"] <= pilot.timings["train_s"]
    assert end["steps_s"] == pilot.timings["steps_s_sum"]
    assert unasked.timings["marks"] == []
    rows = read_metrics(run_dir(spec, tmp_path) / "metrics.jsonl")
    assert [r for r in rows if r["kind"] == "eval"] == []
    piloted = run(spec, tmp_path)
    alone = run(spec, tmp_path, out="alone")
    assert piloted.timings["probe_eval_s"] is None  # the run's own call evaluates
    assert piloted.timings["probe_restore_s"] is None and piloted.timings["restore_s"] > 0
    assert train_losses(run_dir(spec, tmp_path) / "metrics.jsonl") == train_losses(
        run_dir(spec, tmp_path, out="alone") / "metrics.jsonl"
    )
    assert alone.metrics == piloted.metrics


def test_a_calls_live_record_is_written_off_its_training_thread(tmp_path, digits_file, monkeypatch):  # noqa: F811
    """The loop hands each record to the live file's own thread (a write can wait on the disk
    behind a checkpoint's journal commit); the last one, ``done``, is on disk when the call
    returns. On the old main every write ran on the training thread."""
    writes: list[tuple[int, str]] = []
    real = progress_file.write_progress

    def spy(path, record, **kw):
        writes.append((threading.get_ident(), record["state"]))
        real(path, record, **kw)

    monkeypatch.setattr(progress_file, "write_progress", spy)
    spec = make_spec(tmp_path, digits_file)
    run(spec, tmp_path)
    assert writes and threading.get_ident() not in {ident for ident, _ in writes}
    assert writes[-1][1] == "done"
    assert progress_file.read_progress(run_dir(spec, tmp_path))["state"] == "done"
