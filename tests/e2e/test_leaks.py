"""No credential leaks from a real `campaign deploy` and a recipe that fails on the stack.

`campaign deploy --name leaks` is run as a user runs it, its environment holding credentials in
several forms: ``PREFECT_API_URL=http://deployer:PASSWORD@host/api`` (the server ignores the
basic auth the client then sends), an ``MLFLOW_TRACKING_URI`` whose password holds a ``'``, and
AWS keys. Its terminal and the deployments as the Prefect API shows them (parameters, job
variables, pull steps) hold none of them. Then the stack's worker runs ``campaign/leaks``: the
user's recipe fails in its loss with ``password='...'``, an access key ID and a secret key in
its exception's text and in the one it was handling, its flow run tracked to the stack's
MLflow server through the URI with the password. The worker's log (the flow run's terminal)
and the stack's other logs, the Prefect records (the flow run, its states, task runs, logs and
artifacts), the result files of Prefect's storage, every file of the output folder
(``recipe-error.txt`` included) and the MLflow records hold none of them either.

The deployments have their own name, so the session's ``campaign/main`` that the other tests
here run is left as it is; they are deleted at the end.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import api, run_deployment, worker_log
from tests.helpers.leaks import (
    AWS_KEY_ID,
    AWS_SECRET_KEY,
    DEPLOY_PASSWORD,
    DEPLOY_USER,
    NO_SERVER,
    RECIPE_PASSWORD,
    file_leaks,
    leaked,
    log_leaks,
    mlflow_leaks,
    plain_tracking_uri,
    prefect_leaks,
    record_leaks,
    secret_tracking_uri,
)
from tests.helpers.userproject import RECIPE_MODULE, write_regress_project

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

NAME = "leaks"
DEPLOYMENTS = (f"campaign/{NAME}", f"restart-verification/{NAME}")

#: The user's loss, failing on its fourth call (after the preflight's batch and the pilot's
#: first steps, so a run folder keeps ``recipe-error.txt``) with the credentials it read from
#: a file of the project (none of them is in the recipe's source, which the folder keeps), in
#: its own error and in the one it was handling (which the kept traceback chains).
FAILING_LOSS = """    calls = 0

    def loss(self, model, batch):
        Regress.calls += 1
        if Regress.calls > 3:
            import json, pathlib
            db = json.loads((pathlib.Path(__file__).parent / "db-secret.json").read_text())
            try:
                raise ConnectionError(
                    f"connect(host='db', password='{db['password']}') "
                    f"aws_secret_access_key={db['secret_key']}"
                )
            except ConnectionError:
                raise RuntimeError(
                    f"metrics db refused: password='{db['password']}' with "
                    f"aws_access_key_id={db['key_id']}"
                )
        x, y = batch
"""


def _failing_project(folder: Path) -> Path:
    """The renter's regression project of ``userproject``, its loss failing as above."""
    # One GPU: a lot of two (the helper's default b200) would raise the shared stack's `gpu`
    # limit to two slots, which test_many_hosts needs at one.
    spec = write_regress_project(folder, gpu="rtx4090")
    recipe = folder / f"{RECIPE_MODULE}.py"
    text = recipe.read_text()
    plain = "    def loss(self, model, batch):\n        x, y = batch\n"
    assert plain in text
    recipe.write_text(text.replace(plain, FAILING_LOSS))
    secrets = {"password": RECIPE_PASSWORD, "key_id": AWS_KEY_ID, "secret_key": AWS_SECRET_KEY}
    (folder / "db-secret.json").write_text(json.dumps(secrets))
    return spec


def _deploy(stack: dict[str, Any], project: Path) -> str:
    """`campaign deploy campaign.yaml --out out --name leaks` in ``project``, with credentials
    in its environment; its terminal (stdout and stderr)."""
    scheme, rest = stack["api"].split("://", 1)
    env = {
        **stack["env"],
        "PREFECT_API_URL": f"{scheme}://{DEPLOY_USER}:{DEPLOY_PASSWORD}@{rest}",
        "MLFLOW_TRACKING_URI": secret_tracking_uri(stack),
        "AWS_ACCESS_KEY_ID": AWS_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": AWS_SECRET_KEY,
    }
    campaign = str(Path(sys.executable).parent / "campaign")
    done = subprocess.run(
        [campaign, "deploy", "campaign.yaml", "--out", "out", "--name", NAME],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    terminal = done.stdout + done.stderr
    assert done.returncode == 0, terminal
    assert f"deployed campaign/{NAME}" in terminal and "***" in terminal, terminal
    return terminal


def test_deploy_and_a_failing_recipe_leak_nothing(stack, tmp_path):
    project = tmp_path / "project"
    _failing_project(project)
    try:
        terminal = _deploy(stack, project)
        leaks = [f"deploy terminal: {line}" for line in terminal.splitlines() if leaked(line)]
        for name in DEPLOYMENTS:
            dep = api(stack["api"], "GET", f"/deployments/name/{name}")
            leaks += record_leaks(f"deployment {name}", dep)
        main = api(stack["api"], "GET", f"/deployments/name/campaign/{NAME}")
        assert main["parameters"] == {"spec": "campaign.yaml", "out": "out"}
        assert main["job_variables"]["working_dir"] == str(project.resolve())
        leaks += record_leaks("work pool", api(stack["api"], "GET", "/work_pools/gpucampaign"))

        # The flow run tracks to MLflow through the URI that holds a password (the test sets it
        # as the run's env: its job_variables alone hold it, by the test's doing).
        env = {"MLFLOW_TRACKING_URI": secret_tracking_uri(stack)}
        run_id, state = run_deployment(stack, f"campaign/{NAME}", job_variables={"env": env})
        message = state.get("message") or ""
        assert state.get("type") == "FAILED", f"{state}\n{worker_log(stack)}"
        assert "loss()" in message and "password='***'" in message, message
        out = project / "out"
        kept = sorted(out.rglob("recipe-error.txt"))
        trace = kept[0].read_text() if kept else ""
        assert "ConnectionError" in trace and "RuntimeError" in trace, sorted(out.rglob("*"))

        leaks += log_leaks(stack)
        leaks += file_leaks(out)
        leaks += file_leaks(stack["dir"] / "prefect-home")  # Prefect's persisted results
        leaks += prefect_leaks(stack["api"], run_id)
        uri = plain_tracking_uri(stack)
        if uri != NO_SERVER:
            found, n_runs = mlflow_leaks(uri, experiment="seqreg", kind=None)
            leaks += found
            assert n_runs >= 1, f"the flow run tracked nothing to {uri}"
        assert leaks == [], "\n".join(leaks[:10])
    finally:  # both of this test's deployments (the scheduled one fires every 6 hours)
        for dep in api(stack["api"], "POST", "/deployments/filter", {"limit": 200}):
            if dep["name"] == NAME:
                api(stack["api"], "DELETE", f"/deployments/{dep['id']}")
