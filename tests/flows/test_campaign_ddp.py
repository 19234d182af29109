"""A campaign whose control trains data-parallel (``gpus: 2``, two gloo processes on CPU) on a
B200 lot: it completes, verifies, and its restart check is identical."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpucampaign.verify.checks import verify_output
from tests.flows.test_campaign import run_flow, timeline_rows, tiny_campaign

pytestmark = [pytest.mark.slow, pytest.mark.process, pytest.mark.timeout(900)]


def _two_gpu_control(data: dict[str, Any]) -> None:
    """One B200 lot (two GPUs of one machine); the control on both; one variant."""
    data["packages"] = [{"gpu": "b200", "days": 3, "price_usd": 900}]
    data["control"] = {**data["control"], "gpus": 2}
    data["variants"] = [v for v in data["variants"] if v["name"] == "short"]
    gone = {"train-lr-high", "train-bf16"}
    data["calendar"] = [s for s in data["calendar"] if s["name"] not in gone]
    for step in data["calendar"]:
        if "after" in step:
            step["after"] = [a for a in step["after"] if a not in gone] or ["train-control"]


def test_a_campaign_with_a_two_process_control_completes_and_verifies(prefect_harness, tmp_path):
    spec = tiny_campaign(tmp_path, edit=_two_gpu_control)
    out = tmp_path / "out"
    state = run_flow(spec, out)
    assert state.is_completed(), state.message
    summary = state.result()
    assert summary["verified"] is True and summary["problems"] == []
    assert set(summary["runs"].values()) == {"completed"}
    assert verify_output(out, reload=True).verified
    restart = json.loads((out / "restart.json").read_text())
    assert restart["identical"] is True and restart["run"] == "control"
    control = next(r for r in timeline_rows(out) if r["phase"] == "train" and r["run"] == "control")
    params = json.loads((out / "runs" / control["note"] / "params.json").read_text())
    assert params["config"]["gpus"] == 2 and params["world_size"] == 2
    report = (out / "report.md").read_text()
    assert "## Data-parallel scaling" in report and "| control | 2 |" in report
