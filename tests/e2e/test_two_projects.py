"""Two projects deployed side by side, and a relaunch of each in its own folder (issue 45), on
the real stack.

The stack registered ``campaign/main`` from the checkout. A second project's `campaign deploy`
under the same names is refused (the stack's deployment stays as it was); with ``--name`` each
of two projects gets deployments of its own. Each project holds a campaign closed for good
under the same relative paths (``src/campaign.yaml``, ``out``), with different results. A flow
run of each project's deployment is set Crashed, the stack's relaunch automation runs that
deployment again (``relaunch`` 1), and each relaunch starts in its own project folder: it finds
its own spec and its own sealed folder there, verifies it (naming that folder's manifest
sha256) and rewrites nothing.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ROOT, RUN_TIMEOUT_S, api, start_worker, stop_worker, wait_flow_run
from tests.helpers.closing import build_closed_folder

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

POOL = "gpucampaign-projects"
NAMES = {"one": "e2e-project-one", "two": "e2e-project-two"}


def deploy(stack: dict[str, Any], project: Path, *args: str) -> subprocess.Popen:
    """`campaign deploy src/campaign.yaml --out out` from ``project``, started (``said``)."""
    return subprocess.Popen(
        [sys.executable, "-m", "gpucampaign.cli", "deploy", "src/campaign.yaml", "--out", "out"]
        + ["--pool", POOL, *args],
        cwd=project,
        env={**stack["env"], "COLUMNS": "1000"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finished(proc: subprocess.Popen) -> tuple[int, str]:
    """A started `campaign deploy`'s exit code and output, its spaces joined."""
    out = proc.communicate(timeout=300)[0]
    return proc.returncode, " ".join(out.split())


def process_pool(stack: dict[str, Any]) -> None:
    """The process work pool ``POOL`` (as ``campaign deploy`` makes it), made at once."""
    from prefect.workers.process import ProcessWorker

    template = ProcessWorker.get_default_base_job_template()
    body = {"name": POOL, "type": "process", "base_job_template": template}
    api(stack["api"], "POST", "/work_pools/", body)


def relaunch_of(stack: dict[str, Any], deployment_id: str, crashed: str) -> dict[str, Any]:
    """The run the relaunch automation made of ``deployment_id`` after ``crashed``."""
    give_up = time.monotonic() + RUN_TIMEOUT_S
    while True:
        runs = api(
            stack["api"],
            "POST",
            "/flow_runs/filter",
            {"deployments": {"id": {"any_": [deployment_id]}}},
        )
        found = [r for r in runs if r["id"] != crashed]
        if found:
            return found[0]
        assert time.monotonic() < give_up, f"no relaunch of {deployment_id}"
        time.sleep(1)


def stacks_main(stack: dict[str, Any]) -> dict[str, Any]:
    """What says where ``campaign/main``'s runs start and with what (not its poll times)."""
    main = api(stack["api"], "GET", "/deployments/name/campaign/main")
    keys = ("id", "entrypoint", "parameters", "job_variables", "pull_steps", "tags")
    return {key: main[key] for key in keys}


def run_logs(stack: dict[str, Any], flow_run_id: str) -> str:
    """The flow run's log lines, joined."""
    logs = api(
        stack["api"],
        "POST",
        "/logs/filter",
        {"logs": {"flow_run_id": {"any_": [flow_run_id]}}, "limit": 200},
    )
    return "\n".join(log["message"] for log in logs)


def test_two_projects_deploy_side_by_side_and_each_relaunch_runs_in_its_own_folder(stack, tmp_path):
    projects = {"one": tmp_path / "one", "two": tmp_path / "two"}
    build_closed_folder(projects["one"])
    build_closed_folder(projects["two"], threshold=1.5)  # another result: another manifest
    sealed = {
        k: hashlib.sha256((p / "out" / "manifest.json").read_bytes()).hexdigest()
        for k, p in projects.items()
    }
    assert sealed["one"] != sealed["two"]
    began = time.monotonic()
    before = stacks_main(stack)
    process_pool(stack)  # its workers start while the projects deploy
    workers = [
        start_worker(stack, pool=POOL, name=f"projects-{k}", log=tmp_path / f"{k}.log")
        for k in projects
    ]
    ids: dict[str, str] = {}
    try:
        # The stack's names from a second project: refused. Each project's own names: beside it.
        refused = deploy(stack, projects["two"])
        named = {k: deploy(stack, p, "--name", NAMES[k]) for k, p in projects.items()}
        code, text = finished(refused)
        assert code == 2 and "Traceback" not in text, text
        assert f"campaign/main (from '{ROOT}')" in text and "Nothing was registered" in text
        for key, proc in named.items():
            code, text = finished(proc)
            assert code == 0 and f"deployed campaign/{NAMES[key]}" in text, text
            ids[key] = api(stack["api"], "GET", f"/deployments/name/campaign/{NAMES[key]}")["id"]
        assert stacks_main(stack) == before
        deployed_s = time.monotonic() - began
        relaunched = {}
        for key, dep in ids.items():
            # A run of the project's deployment whose machine died: the stack relaunches it.
            first = api(stack["api"], "POST", f"/deployments/{dep}/create_flow_run", {})["id"]
            api(
                stack["api"],
                "POST",
                f"/flow_runs/{first}/set_state",
                {
                    "state": {"type": "CRASHED", "message": "its host died (the test)"},
                    "force": True,
                },
            )
            relaunched[key] = relaunch_of(stack, dep, first)
        states = {k: wait_flow_run(stack, r["id"]) for k, r in relaunched.items()}
        print(
            f"deployed side by side {deployed_s:.0f} s, both relaunches ended "
            f"{time.monotonic() - began:.0f} s after the start"
        )
    finally:
        for proc in workers:  # both asked at once: they stop side by side
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
        for proc in workers:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                stop_worker(proc)  # SIGINT again, then SIGKILL
        for dep in ids.values():
            api(stack["api"], "DELETE", f"/deployments/{dep}")
        for key in ids:
            check = f"/deployments/name/restart-verification/{NAMES[key]}"
            api(stack["api"], "DELETE", f"/deployments/{api(stack['api'], 'GET', check)['id']}")

    worker_logs = "\n".join((tmp_path / f"{k}.log").read_text()[-3000:] for k in projects)
    for key, run in relaunched.items():
        assert run["parameters"] == {"spec": "src/campaign.yaml", "out": "out", "relaunch": 1}
        assert "campaign:closing-test" in run["tags"], run["tags"]  # tagged while it waited
        assert states[key].get("type") == "COMPLETED", f"{key}: {states[key]}\n{worker_logs}"
        said = run_logs(stack, run["id"])
        other = sealed["two" if key == "one" else "one"]
        assert "closed for good" in said and sealed[key] in said and other not in said, said
        out = projects[key] / "out" / "manifest.json"
        assert hashlib.sha256(out.read_bytes()).hexdigest() == sealed[key]
