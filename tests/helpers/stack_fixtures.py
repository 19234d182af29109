"""Fixtures of the tests on the real stack: one stack per session (infra/stack.sh: S3 server,
PostgreSQL, Prefect server, worker) and one tiny campaign run on it through its deployment,
its checkpoints and outputs on the stack's S3 server, tracked to the stack's MLflow server
through a URI that holds a password (searched for in every channel after).

tests/conftest.py imports them, so tests/e2e and tests/faults share the one stack.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.leaks import secret_tracking_uri
from tests.helpers.receiver import set_automations
from tests.helpers.stack import STACK, free_port, run_deployment, stack_s3_env, tiny_spec

ROOT = Path(__file__).resolve().parents[2]
#: Where the session's campaign keeps its checkpoints and its mirrored output folder.
FINISHED_PREFIX = "e2e/finished"
#: The dead-run window of a test module that waits for the detector: the shortest the stack
#: accepts, two missed heartbeats of a deployment that sends one every 30 s.
SHORT_DEAD_RUN_S = 60


@pytest.fixture(scope="session")
def stack():
    """A private real stack on a free port; always taken down again.

    Its folder is made outside pytest's temporary root (which is private to its owner): as
    root, PostgreSQL runs as the user postgres, which must be able to reach its data folder.
    """
    stack_dir = Path(tempfile.mkdtemp(prefix="gpucampaign-stack-"))
    stack_dir.chmod(0o711)
    port = free_port()
    env = {
        **os.environ,
        "STACK_DIR": str(stack_dir),
        "GPUCAMPAIGN_PREFECT_PORT": str(port),
        "GPUCAMPAIGN_ROOT": str(ROOT),
        "PREFECT_WORKER_QUERY_SECONDS": "2",  # the worker picks a new run up sooner than every 10 s
        # What a user's stack logs (the test session runs quieter): the UI shows these lines.
        "PREFECT_LOGGING_LEVEL": "INFO",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    env.pop("PREFECT_API_URL", None)
    try:
        up = subprocess.run(
            ["bash", str(STACK), "up"], env=env, capture_output=True, text=True, timeout=600
        )
        assert up.returncode == 0, f"stack up failed:\n{up.stdout}\n{up.stderr}"
        api = f"http://127.0.0.1:{port}/api"
        assert f"export PREFECT_API_URL={api}" in up.stdout
        # What a user sources (`. .stack/env`): workers started by the tests get the S3 keys.
        s3 = stack_s3_env(stack_dir)
        yield {
            "api": api,
            "env": {**env, **s3, "PREFECT_API_URL": api},
            "dir": stack_dir,
            "port": port,
        }
    finally:
        down = subprocess.run(
            ["bash", str(STACK), "down"], env=env, capture_output=True, text=True, timeout=180
        )
        shutil.rmtree(stack_dir, ignore_errors=True)
        assert down.returncode == 0, f"stack down failed:\n{down.stdout}\n{down.stderr}"


@pytest.fixture(scope="session")
def finished_campaign(stack, tmp_path_factory) -> dict[str, Any]:
    """`prefect deployment run campaign/main` of the tiny spec with its storage on the stack's
    S3 server (``s3://gpucampaign/e2e/finished``), run once for the session.

    Returns the flow run ID, its last state, the output folder and the bucket prefix; tests
    that change the folder or the bucket must leave what the others read (manifest, report,
    the flow run) in place.
    """
    base = tmp_path_factory.mktemp("campaign")
    spec = tiny_spec(base / "spec", storage={"url": f"s3://gpucampaign/{FINISHED_PREFIX}"})
    out = base / "out"
    # Tracked to the stack's MLflow server through a URI whose password holds a quote: the
    # run's every channel is then searched for it (tests/helpers/leaks.py).
    env = {"MLFLOW_TRACKING_URI": secret_tracking_uri(stack)}
    flow_run_id, state = run_deployment(
        stack, "campaign/main", job_variables={"env": env}, spec=str(spec), out=str(out)
    )
    return {"id": flow_run_id, "state": state, "out": out, "spec": spec, "prefix": FINISHED_PREFIX}


@pytest.fixture(scope="module")
def short_dead_run_window(stack):
    """The stack's dead-run window at ``SHORT_DEAD_RUN_S`` for one test module, then the
    stack's own again (``infra/stack.sh automations``, as for a running server).

    Take it before the module's runs start: the updated trigger knows no run until that run's
    next heartbeat. Its runs must send heartbeats every 30 s (campaign/main sends one a minute).
    """

    set_automations(stack, GPUCAMPAIGN_CRASHED_AFTER_S=str(SHORT_DEAD_RUN_S))
    try:
        yield SHORT_DEAD_RUN_S
    finally:
        set_automations(stack)
