"""The embedded server starts early, in its own process, before Prefect loads in ``campaign
run``'s: it is adopted as this process's Prefect API once it answers (Prefect's own server
modules never load here), and stopped when the run is refused before that."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_ADOPT = """
import json, sys
from gpucampaign.cli.runner import load_flow
refused = load_flow("_embedded", "spawn_early")()  # a run refused by its checks
refused.stop()
refused_ended = refused.process.poll() is not None
early = load_flow("_embedded", "spawn_early")()
loaded_before = "prefect.server.api.server" in sys.modules
warmed = []
server = load_flow("_embedded", "start_detached")(early, warm=lambda: warmed.append(1))
from prefect.client.orchestration import get_client
from gpucampaign_prefect.orchestration.gpu_lock import _embedded_server_pid, embedded_api
with get_client(sync_client=True) as client:
    health = client.api_healthcheck()
    url = str(client.api_url)
out = {
    "loaded_before": loaded_before,
    "adopted": early.adopted,
    "same_process": server is early,
    "client_url": url == early.api_url + "/",
    "health": health is None,
    "server_module_loaded": "prefect.server.api.server" in sys.modules,
    "embedded": embedded_api(),
    "server_pid": _embedded_server_pid() == early.process.pid,
    "warmed_at_most_once": len(warmed) <= 1,
}
load_flow("_embedded", "stop")(server)
out["ended"] = early.process.wait(timeout=30) is not None
out["refused_ended"] = refused_ended
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
        "loaded_before": False,  # spawned before Prefect's server module loaded here
        "adopted": True,
        "same_process": True,
        "client_url": True,  # the client's get_client() talks to it, starts no other
        "health": True,
        "server_module_loaded": False,  # nor imports Prefect's server here: its process does
        "embedded": True,  # still this run's own temporary server for the GPU lock
        "server_pid": True,
        "warmed_at_most_once": True,
        "ended": True,
        "refused_ended": True,
    }
