"""The embedded server starts early, in its own process, before Prefect loads in ``campaign
run``'s: it is adopted as this process's Prefect API once it answers (Prefect's server modules
never load here, and no child process inherits its URL), and stopped when the run is refused
before that. It runs no automations (its triggers service is off) unless asked to."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_ADOPT = """
import hashlib, json, os, sys
from gpucampaign.cli.runner import load_embedded
early = load_embedded("spawn_early")()
loaded_before = "prefect.server.api.server" in sys.modules
server = load_embedded("start_detached")(early)
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.settings import get_current_settings
from gpucampaign_prefect.orchestration.gpu_lock import embedded_api, holders_dir

@flow
def hello() -> str:
    return "ran"

ran = hello()
with get_client(sync_client=True) as client:
    health = client.api_healthcheck() is None
    client_url = str(client.api_url).rstrip("/")
child = __import__("subprocess").run(
    [sys.executable, "-c", "import os; print(os.environ.get('PREFECT_API_URL'))"],
    capture_output=True, text=True,
).stdout.strip()


def env_of(pid):
    # the server's own environment: read once its process has exec'd (until then /proc shows
    # the spawning one's, or nothing)
    for _ in range(200):
        pairs = open(f"/proc/{pid}/environ").read().split(chr(0))
        env = dict(x.split("=", 1) for x in pairs if "=" in x)
        if "PREFECT__SERVER_EPHEMERAL" in env:
            return env
        __import__("time").sleep(0.05)
    return env

out = {
    "triggers": env_of(early.process.pid).get("PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED"),
    "loaded_before": loaded_before,
    "adopted": early.adopted,
    "same_process": server is early,
    "settings_url": get_current_settings().api.url == early.api_url,
    "client_url": client_url == early.api_url,
    "health": health,
    "flow": ran,
    "server_modules_loaded": "prefect.server.api.server" in sys.modules,
    "child_sees_a_url": child,
    "embedded": embedded_api(),
    "holders": holders_dir("gpu").parent.name == hashlib.sha256(b"embedded").hexdigest()[:12],
}
load_embedded("release")(server)  # the end of the run in this process
# A later flow in the same process, on another server (a test harness): its task runs reach
# that server, not the adopted one (Prefect's events worker is one per process).
from prefect import task
from prefect.testing.utilities import prefect_test_harness

@task
def step() -> int:
    return 1

@flow
def later() -> int:
    return step()

with prefect_test_harness(server_startup_timeout=None):
    state = later(return_state=True)
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id]))
        )
    out["later_task_runs"] = sorted(r.state.name for r in runs)
load_embedded("stop")(server)
out["ended"] = early.process.wait(timeout=30) is not None
os.environ["PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED"] = "true"  # asked for: it wins
refused = load_embedded("spawn_early")()
out["asked_triggers"] = env_of(refused.process.pid).get("PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED")
refused.stop()
out["refused_ended"] = refused.process.poll() is not None
print(json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.server
def test_an_early_server_is_adopted_and_a_refused_one_ends(tmp_path):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        "PREFECT_HOME": str(tmp_path / "home"),
    }
    env.pop("PREFECT_API_URL", None)
    done = subprocess.run(
        [sys.executable, "-c", _ADOPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got == {
        "triggers": "false",  # no automation on a run's temporary server: not started
        "asked_triggers": "true",
        "loaded_before": False,  # spawned before Prefect's server module loaded here
        "adopted": True,
        "same_process": True,
        "settings_url": True,  # this process's Prefect talks to it
        "client_url": True,
        "health": True,
        "flow": "ran",
        "server_modules_loaded": False,  # never imported here: its own process has them
        "child_sees_a_url": "None",  # the environment is untouched: a child inherits nothing
        "embedded": True,  # still this run's own server (the GPU lock clears stale holders)
        "holders": True,
        "later_task_runs": ["Completed"],  # on the other server, after this run's release
        "ended": True,
        "refused_ended": True,
    }
