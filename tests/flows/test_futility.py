"""The futility stop in the campaign flow: a variant that cannot win stops early, its GPU lane
goes to the next run, and the report's GPU time saved agrees with the timeline.

A real (test) Prefect server and real torch training on the digits corpus; one GPU lane, so
the runs go one after the other as the plan placed them: the control, its restart check, then
the variants.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpucampaign.core.files import parse_time
from gpucampaign.verify.checks import verify_output
from tests.flows.test_campaign import jsonl, run_flow, timeline_rows, tiny_campaign

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def cannot_win(data: dict[str, Any]) -> None:
    """Variants: 'narrow' (a 2-unit hidden layer: it cannot win), then 'lr-high'."""
    data["variants"] = [
        {
            "name": "narrow",
            "tier": "useful",
            "changes": {"hidden": [2]},
            "hypothesis": "two hidden units are enough",
        },
        {
            "name": "lr-high",
            "tier": "useful",
            "changes": {"lr": 0.003},
            "hypothesis": "a higher learning rate learns faster",
        },
    ]
    cal = [s for s in data["calendar"] if s.get("run") != "short"]
    for s in cal:
        if s.get("run") == "bf16":
            s.update(name="train-narrow", run="narrow")
    # The flow follows the plan's lanes: narrow's step first in the table, so the plan (and the
    # lane) runs it before lr-high.
    narrow = next(s for s in cal if s.get("run") == "narrow")
    cal.remove(narrow)
    cal.insert(next(i for i, s in enumerate(cal) if s.get("run") == "lr-high"), narrow)
    data["calendar"] = cal


def test_a_variant_that_cannot_win_stops_early_and_frees_its_lane(prefect_harness, tmp_path):
    spec = tiny_campaign(tmp_path, edit=cannot_win)
    out = tmp_path / "out"
    state = run_flow(spec, out)
    assert state.is_completed(), state.message  # a futile stop is evidence: the verdict is reached
    summary = state.result()
    assert summary["verified"] is True and summary["essential_stop"] is None
    status = {rid.rpartition("-")[0]: s for rid, s in summary["runs"].items()}
    assert status == {"control": "completed", "narrow": "stopped", "lr-high": "completed"}

    # The stop: typed, with its ID and numbers; never the control.
    stops = jsonl(out / "stops.jsonl")
    assert [(s["run"], s["rule"]) for s in stops] == [("narrow", "futile")]
    stop = stops[0]
    numbers = stop["numbers"]
    planned = numbers["planned_steps"]
    assert stop["step"] < planned and numbers["steps_saved"] == planned - stop["step"]
    assert numbers["gain_ci95"][1] <= 0 and numbers["control_step"] == stop["step"]
    assert stop["stop_id"] in summary["verdict"]["text"]

    # The timeline: narrow's segment ends at the stop, having trained from the pilot's end to
    # the stop; the next run on the lane (lr-high) starts after it and trains every step.
    rows = timeline_rows(out)
    train = sorted((r for r in rows if r["phase"] == "train"), key=lambda r: r["start"])
    assert [r["run"] for r in train] == ["control", "narrow", "lr-high"]
    narrow, nxt = train[1], train[2]
    assert narrow["outcome"].startswith("failed: futile: cannot win")
    pilot_steps = 5
    assert narrow["steps"] == stop["step"] - pilot_steps
    assert parse_time(nxt["start"]) >= parse_time(narrow["end"])
    assert nxt["steps"] == planned - pilot_steps

    # The report: the GPU time saved is the steps not trained times the measured step time,
    # and names the segment and the run that took the lane.
    report = json.loads((out / "report.json").read_text())
    fut = report["futility"]
    (entry,) = fut["runs"]
    result = json.loads((out / "runs" / stop["run_id"] / "result.json").read_text())
    assert entry["step_s"] == result["timings"]["step_s"] == numbers["step_s"]
    assert entry["steps_saved"] == planned - result["steps_done"] == numbers["steps_saved"]
    assert entry["saved_s"] == pytest.approx(entry["steps_saved"] * entry["step_s"])
    assert fut["saved_s"] == pytest.approx(entry["saved_s"])
    assert entry["segment"]["steps"] == narrow["steps"]
    assert pilot_steps + entry["segment"]["steps"] + entry["steps_saved"] == planned
    assert (entry["segment"]["end"], entry["next"]["run"]) == (narrow["end"], "lr-high")
    md = (out / "report.md").read_text()
    assert "GPU time saved by early stops:" in md and "'narrow' stopped at step" in md

    # The stopped variant still has its predictions and its reload check.
    rid = stop["run_id"]
    assert (out / "runs" / rid / "predictions.csv").is_file()
    assert rid in verify_output(out, reload=True).reloaded_runs
