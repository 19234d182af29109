"""The embedded server starts early, in its own process, before Prefect loads in ``campaign
run``'s: it is adopted as Prefect's temporary server once it answers, and stopped when the run
is refused before that."""

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
early = load_flow("_embedded", "spawn_early")()
loaded_before = "prefect.server.api.server" in sys.modules
server = load_flow("_embedded", "start_detached")(early)
import httpx
from prefect.server.api.server import SubprocessASGIServer
health = httpx.get(server.api_url + "/health").status_code
out = {
    "loaded_before": loaded_before,
    "adopted": early.adopted,
    "same_process": server.server_process is early.process,
    "singleton": SubprocessASGIServer() is server,
    "health": health,
}
load_flow("_embedded", "stop")(server)
out["ended"] = early.process.wait(timeout=30) is not None
refused = load_flow("_embedded", "spawn_early")()
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
        "loaded_before": False,  # spawned before Prefect's server module loaded here
        "adopted": True,
        "same_process": True,
        "singleton": True,  # the client's get_client() finds it, starts no other
        "health": 200,
        "ended": True,
        "refused_ended": True,
    }
