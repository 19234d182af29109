"""The lot's end under the campaign flow: the runs stop before the end minus the margin with a
verified checkpoint, the segment says "lot ended"; on a second open lot the campaign goes on
and completes; without one it closes resumable and a later run completes it."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gpucampaign.engine import lotend
from gpucampaign.verify.checks import verify_output
from tests.flows.test_campaign import jsonl, run_flow, timeline_rows, tiny_campaign
from tests.helpers.lots import LotClock, lot_clock, lot_packages

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture
def clock(monkeypatch):
    yield from lot_clock(monkeypatch, datetime.now(UTC))


def _lots(clock: LotClock, *, ends_in_s: float, second: bool):
    def edit(data: dict[str, Any]) -> None:
        data["packages"] = lot_packages(now=clock.start, first_ends_in_s=ends_in_s, second=second)

    return edit


def _lot_end_rows(out: Path) -> list[dict[str, Any]]:
    return [
        r
        for path in sorted((out / "runs").glob("*/metrics.jsonl"))
        for r in jsonl(path)
        if r["kind"] == "lot_end"
    ]


def test_the_lot_ends_and_the_campaign_goes_on_on_the_second_lot(prefect_harness, tmp_path, clock):
    spec = tiny_campaign(
        tmp_path, stop_rules={"futility": False}, packages=_lots(clock, ends_in_s=90, second=True)
    )
    out = tmp_path / "out"
    state = run_flow(spec, out)
    assert state.is_completed(), state.message
    assert verify_output(out, reload=False).verified
    ends = _lot_end_rows(out)  # one per run training when the lot ended (two GPU lanes)
    assert ends and all(e["lot"] == 1 and 0 < e["left_s"] <= e["margin_s"] for e in ends)
    # The local store: verified, and said not to be off the machine.
    assert all(e["off_machine"] is False and "NOT OFF THE MACHINE" in e["where"] for e in ends)
    rows = timeline_rows(out)
    stopped = [r for r in rows if (r.get("outcome") or "").startswith("lot ended")]
    assert len(stopped) == len(ends) and all("lot 1" in r["outcome"] for r in stopped)
    assert {r["checkpoint_step"] for r in stopped if r.get("checkpoint_step")} <= {
        e["step"] for e in ends
    }
    # Each stopped run trained on: a later segment of it resumed and completed it.
    for cut in stopped:
        later = [
            r
            for r in rows
            if r["run"] == cut["run"] and r["phase"] == cut["phase"] and r["start"] > cut["start"]
        ]
        assert later and later[-1]["outcome"] == "ok", cut
    summary = state.result()
    assert set(summary["runs"].values()) == {"completed"}


def test_without_a_later_lot_the_campaign_closes_resumable_and_a_rerun_completes(
    prefect_harness, tmp_path, clock
):
    def lots(data: dict[str, Any]) -> None:  # lot 2 opens a day after the start
        data["packages"] = lot_packages(now=clock.start, first_ends_in_s=60, second=False)
        later = clock.start + timedelta(days=1)
        data["packages"].append({"gpu": "rtx4090", "days": 3, "starts_at": later.isoformat()})

    spec = tiny_campaign(tmp_path, stop_rules={"futility": False}, packages=lots)
    out = tmp_path / "out"
    state = run_flow(spec, out)
    assert state.is_cancelled(), state.message
    assert "No later lot" in state.message and "resumes from its checkpoints" in state.message
    ends = _lot_end_rows(out)
    assert ends and (out / "report.md").is_file() and (out / "manifest.json").is_file()
    # On the later lot, the same command resumes and completes.
    clock.advance(timedelta(days=2).total_seconds())
    lotend.forget_ended_lots()
    again = run_flow(spec, out)
    assert again.is_completed(), again.message
    assert set(again.result()["runs"].values()) == {"completed"}
    restored = [
        r
        for path in (out / "runs").glob("*/metrics.jsonl")
        for r in jsonl(path)
        if r["kind"] == "restore"
    ]
    assert {e["step"] for e in ends if e["step"]} <= {r["step"] for r in restored}
    assert json.loads((out / "manifest.json").read_text())


def test_after_the_lot_ends_no_queued_phase_starts_and_the_close_verifies(
    prefect_harness, tmp_path, clock
):
    """One lot, one GPU lane: the control stops at the lot's end with its step saved; the
    restart check and the variants queued behind it in the lane are not started (no segment,
    no step), recorded as not run because the lot ended (not as missing files), and the close
    verifies, resumable."""
    spec = tiny_campaign(
        tmp_path, stop_rules={"futility": False}, packages=_lots(clock, ends_in_s=60, second=False)
    )
    out = tmp_path / "out"
    state = run_flow(spec, out)
    assert state.is_cancelled(), state.message
    assert "No later lot" in state.message
    rows = timeline_rows(out)
    stopped = [r for r in rows if (r.get("outcome") or "").startswith("lot ended")]
    assert [(r["phase"], r["run"]) for r in stopped] == [("train", "control")], rows
    after = [r for r in rows if r["start"] > stopped[0]["start"]]
    assert [r["phase"] for r in after] == ["close"], after  # nothing trained after it
    summary = state.result(raise_on_failure=False)
    assert summary["verified"] and summary["problems"] == [], summary["problems"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert {r["status"] for r in manifest["runs"].values()} == {"not_run"}
    assert all("the lot ended" in r["reason"] for r in manifest["runs"].values())
    assert "no metric (the lot ended before it finished)" in manifest["verdict"]["text"]
    assert verify_output(out, reload=False).verified
    # Every lot has ended: a rerun is refused before anything starts, dates named.
    clock.advance(timedelta(days=1).total_seconds())
    again = run_flow(spec, out)
    assert again.is_failed() and "every lot of the spec has ended" in again.message
    assert json.loads((out / "manifest.json").read_text()) == manifest
