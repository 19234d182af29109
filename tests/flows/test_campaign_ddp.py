"""A campaign whose control trains data-parallel (``gpus: 2``, two gloo processes on CPU) on a
B200 lot: it completes, verifies, and its restart check is identical; so does a renter's own
recipe from their own folder, run by `campaign run` where a one-GPU campaign made the default
GPU lock first."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.flows.test_campaign import run_flow, timeline_rows, tiny_campaign
from tests.helpers.userproject import write_regress_project

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
    # Verified by the close itself: the folder against its manifest (anchored by its sha256),
    # every model reloaded in a fresh process (verify_output(reload=True) again would repeat it).
    assert summary["verified"] is True and summary["problems"] == []
    assert set(summary["runs"].values()) == {"completed"}
    restart = json.loads((out / "restart.json").read_text())
    assert restart["identical"] is True and restart["run"] == "control"
    control = next(r for r in timeline_rows(out) if r["phase"] == "train" and r["run"] == "control")
    params = json.loads((out / "runs" / control["note"] / "params.json").read_text())
    assert params["config"]["gpus"] == 2 and params["world_size"] == 2
    report = (out / "report.md").read_text()
    assert "## Data-parallel scaling" in report and "| control | 2 |" in report


def _campaign(*args: str, cwd: Path, home: Path) -> subprocess.CompletedProcess[str]:
    """``campaign ARGS`` in a new process standing in ``cwd``, on the embedded Prefect of
    ``home`` (its database keeps the GPU lock from one run to the next, as a renter's does)."""
    env = {**os.environ, "PREFECT_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "gpucampaign.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


#: A one-GPU campaign's first call on its embedded server, ``ensure_gpu_limit(spec.gpu_lock.name,
#: slots=<its lanes>)``, for the default lock and one lane; the server stops after it.
_MAKE_ONE_GPU_LOCK = """
import os
from gpucampaign.cli.runner import load_embedded, prefect_environment
from gpucampaign.config.parts import GpuLockSpec
for key, value in prefect_environment(logging_level="WARNING").items():
    os.environ.setdefault(key, value)
server = load_embedded("start_detached")()
try:
    from gpucampaign_prefect.orchestration.gpu_lock import embedded_api, ensure_gpu_limit
    print(ensure_gpu_limit(GpuLockSpec().name, slots=1, clear_stale=embedded_api()))
finally:
    load_embedded("stop")(server)
"""


def test_a_users_own_recipe_trains_on_two_processes_after_a_one_gpu_campaign(tmp_path):
    """The default lock `gpu` was made with 1 slot by a one-GPU campaign; the renter's recipe
    (their seqreg.py beside their spec, run from another folder: neither the working directory
    nor PYTHONPATH holds it) trains its control on 2 ranks, which import it as the launching
    process does, and the campaign completes, verifies and restarts identically."""
    home = tmp_path / "prefect-home"
    # What a one-GPU campaign does first on the default lock (its flow's first call, with its
    # one lane's slot), without training it: the lock is all the second campaign meets of it.
    made = subprocess.run(
        [sys.executable, "-c", _MAKE_ONE_GPU_LOCK],
        env={**os.environ, "PREFECT_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert made.returncode == 0, made.stderr[-3000:]
    created = re.search(r"'gpu' on this Prefect server with 1 slot", made.stdout)
    assert created, (made.stdout + made.stderr)[-3000:]

    write_regress_project(tmp_path / "mine", gpus=2)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    ran = _campaign("run", "../mine/campaign.yaml", "--out", "out", cwd=elsewhere, home=home)
    said = ran.stdout + ran.stderr
    assert ran.returncode == 0, said[-4000:]
    assert "Traceback" not in said and "does not import" not in said
    assert re.search(r"'gpu' from 1 to 2 slot", said), said[-3000:]
    out = elsewhere / "out"
    assert "output folder verified" in ran.stdout
    restart = json.loads((out / "restart.json").read_text())
    assert restart["identical"] is True and restart["run"] == "control"
    control = next(r for r in timeline_rows(out) if r["phase"] == "train" and r["run"] == "control")
    params = json.loads((out / "runs" / control["note"] / "params.json").read_text())
    assert params["world_size"] == 2 and params["recipe"] == "seqreg:Regress"
    sha = re.search(r"manifest.json sha256: ([0-9a-f]{64})", ran.stdout)
    assert sha is not None, ran.stdout[-2000:]
    verify = _campaign("verify", "out", "--expect", sha.group(1), cwd=elsewhere, home=home)
    assert verify.returncode == 0, (verify.stdout + verify.stderr)[-3000:]
