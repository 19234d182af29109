"""The Prefect UI checked as a person sees it: headless Chromium (Debian's `chromium`) opens
the finished campaign's flow-run page and its closing-report artifact on the local stack.

The screenshot is kept: under the test's tmp folder and copied to tests/e2e/artifacts/
(ignored by git), or to $OUT when that is set (``keep_screenshot``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import CHROMIUM, api, chromium, keep_screenshot

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(),
        reason=f"no {CHROMIUM}: apt-get install -y chromium (.ci/run installs it)",
    ),
]


def test_flow_run_page_shows_task_runs_and_the_closing_report(stack, finished_campaign, tmp_path):
    flow_run_id = finished_campaign["id"]
    assert finished_campaign["state"].get("type") == "COMPLETED", finished_campaign["state"]
    ui = f"http://127.0.0.1:{stack['port']}"
    flow_run = api(stack["api"], "GET", f"/flow_runs/{flow_run_id}")
    task_runs = api(
        stack["api"], "POST", "/task_runs/filter", {"flow_runs": {"id": {"any_": [flow_run_id]}}}
    )
    names = {t["name"] for t in task_runs}
    assert {"close", "manifest", "predictions"} <= names
    assert any(n.startswith("train[") for n in names)

    shot = tmp_path / f"flow-run-{flow_run_id}.png"
    chromium(f"{ui}/runs/flow-run/{flow_run_id}", screenshot=shot)
    assert shot.is_file() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 20_000, "the screenshot is (nearly) blank"
    keep_screenshot(shot)

    text = chromium(f"{ui}/runs/flow-run/{flow_run_id}", dump_dom=True)
    assert flow_run["name"] in text
    assert "Completed" in text
    assert re.search(rf"\b{len(task_runs)} Task runs\b", text), text[:2000]
    # The run's log, as the page lists it, names the task runs of every phase.
    for name in ("data-audit", "close", "manifest", "predictions"):
        assert name in text, f"{name!r} not on the flow-run page:\n{text[:3000]}"
    assert any(n in text for n in names if n.startswith("train["))

    artifacts = api(
        stack["api"], "POST", "/artifacts/filter", {"flow_runs": {"id": {"any_": [flow_run_id]}}}
    )
    report = [a for a in artifacts if a["key"] and a["key"].startswith("report-")]
    assert len(report) == 1, [a["key"] for a in artifacts]
    page = chromium(f"{ui}/artifacts/artifact/{report[0]['id']}", dump_dom=True)
    assert report[0]["key"] in page
    assert "Closing report" in page
    assert "Verdict" in page and "Budget" in page
    verdict = (finished_campaign["out"] / "report.md").read_text()
    title = verdict.splitlines()[0].lstrip("# ").strip()
    assert title in page, f"{title!r} not on the artifact page:\n{page[:2000]}"
