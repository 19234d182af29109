"""Where a secret of a real campaign on the stack could land, searched: the worker's terminal
(its log), every file of the output folder, the Prefect records of the flow run (its states,
its task runs and their states, its logs and artifacts, read through the Prefect client) and
every MLflow run of the stack's tracking server (params, tags, metrics' names, artifacts).

The session's campaign (``finished_campaign``) tracks to the stack's MLflow server through
``MLFLOW_TRACKING_URI=http://alice:<password>@host``, a password holding a quote (the form
that once reached the terminal, ``mlflow.json`` and Prefect's database). Its distinctive core
is what is searched for, so the raw, quoted, percent-encoded and basic-auth (base64) forms are
all found.

The other secrets are those of ``tests/e2e/test_leaks.py``: the password of a
``PREFECT_API_URL`` that `campaign deploy` is given, AWS keys in its environment, and the
password a failing recipe puts in its exception. ``leaked`` looks for every one of them, so a
test of one channel also catches another test's secret that reached it.
"""

from __future__ import annotations

import base64
import json
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import quote

#: The password's core: found in any form, the secret leaked.
SECRET_CORE = "Zq9Xk2Lm4LeakE2e"
#: The password itself: a quote inside it, as a shell or a Python repr would quote it.
PASSWORD = f"Pw'{SECRET_CORE}"
USER = "alice"
#: An MLflow URI where none answers: the campaign still runs (tracking never stops it).
NO_SERVER = "http://127.0.0.1:9"

#: ``PREFECT_API_URL``'s password (``http://deployer:DEPLOY_PASSWORD@host/api``).
DEPLOY_CORE = "Hy7Rt3Vb8DeployE2e"
DEPLOY_USER = "deployer"
DEPLOY_PASSWORD = f"Dp-{DEPLOY_CORE}"
#: AWS keys of the shape real ones have (an access key ID, a 40-character secret key).
AWS_KEY_ID = "AKIAZQ9XK2LM4LEAKE2E"
AWS_SECRET_CORE = "wS3cr3tAccessKeyE2eLeak"
AWS_SECRET_KEY = f"{AWS_SECRET_CORE}/7Qm9Xk2Lm4Ab0Cd1"
#: The password a failing recipe reads from a file and puts in its exception's text.
RECIPE_CORE = "Pw9Xk2RecipeE2e"
RECIPE_PASSWORD = f"Rc'{RECIPE_CORE}"


def plain_tracking_uri(stack: dict[str, Any]) -> str:
    """The stack's MLflow URI from the env file a user sources (``NO_SERVER`` without one)."""
    env_file = Path(stack["dir"]) / "env"
    for line in env_file.read_text().splitlines():
        name, sep, value = line.removeprefix("export ").partition("=")
        if sep and name == "MLFLOW_TRACKING_URI" and value:
            return value.strip().strip("'\"")
    return NO_SERVER


def secret_tracking_uri(stack: dict[str, Any]) -> str:
    """``plain_tracking_uri`` with ``alice:PASSWORD@`` as its userinfo (the stack's MLflow
    server has no auth: it ignores the credentials, the client sends them)."""
    scheme, rest = plain_tracking_uri(stack).split("://", 1)
    return f"{scheme}://{USER}:{PASSWORD}@{rest}"


def _forms() -> tuple[bytes, ...]:
    cores = (SECRET_CORE, DEPLOY_CORE, AWS_KEY_ID, AWS_SECRET_CORE, RECIPE_CORE)
    whole = (PASSWORD, DEPLOY_PASSWORD, AWS_SECRET_KEY, RECIPE_PASSWORD)
    pairs = ((USER, PASSWORD), (DEPLOY_USER, DEPLOY_PASSWORD))
    found = {c.encode() for c in cores} | {quote(w, safe="").encode() for w in whole}
    found |= {base64.b64encode(w.encode()) for w in whole}
    found |= {base64.b64encode(f"{u}:{p}".encode()) for u, p in pairs}
    return tuple(sorted(found))


def leaked(data: bytes | str) -> bool:
    """Whether ``data`` holds any of the secrets in any form."""
    raw = data.encode() if isinstance(data, str) else data
    return any(form in raw for form in _forms())


def file_leaks(root: Path) -> list[str]:
    """Each file under ``root`` that holds a secret."""
    return [str(p) for p in sorted(root.rglob("*")) if p.is_file() and leaked(p.read_bytes())]


def log_leaks(stack: dict[str, Any]) -> list[str]:
    """Each line of the stack's logs (the worker's, the Prefect and MLflow servers', ...)
    that holds a secret."""
    found = []
    for path in sorted(Path(stack["dir"]).rglob("*.log")):
        lines = path.read_text(errors="replace").splitlines()
        found += [f"{path.name}: {line[:300]}" for line in lines if leaked(line)]
    return found


def record_leaks(what: str, record: Any) -> list[str]:
    """``[what: the record]`` when the record (JSON, e.g. a deployment as the Prefect API
    shows it) holds a secret, else ``[]``."""
    text = json.dumps(record, default=str)
    return [f"{what}: {text[:300]}"] if leaked(text) else []


def prefect_leaks(api: str, flow_run_id: str) -> list[str]:
    """Each Prefect record of the flow run that holds the secret, read through the client.

    The flow run's ``job_variables`` are left out: the test itself put the URI there (a user
    sets it on the worker's environment instead, which Prefect does not record).
    """
    from uuid import UUID

    from prefect.client.orchestration import SyncPrefectClient
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterId,
        LogFilter,
        LogFilterFlowRunId,
    )

    found = []
    rid = UUID(flow_run_id)
    with SyncPrefectClient(api=api) as client:
        flow_run = client.read_flow_run(rid).model_dump(mode="json", exclude={"job_variables"})
        records: list[tuple[str, Any]] = [("flow run", flow_run)]
        records += [("flow run state", s) for s in client.read_flow_run_states(rid)]
        runs = FlowRunFilter(id=FlowRunFilterId(any_=[rid]))
        for task in client.read_task_runs(flow_run_filter=runs):
            records.append((f"task run {task.name}", task))
            records += [
                (f"task {task.name} state", s) for s in client.read_task_run_states(task.id)
            ]
        offset = 0
        while True:
            page = client.read_logs(
                LogFilter(flow_run_id=LogFilterFlowRunId(any_=[rid])), limit=200, offset=offset
            )
            records += [("log", line) for line in page]
            offset += len(page)
            if len(page) < 200:
                break
        records += [("artifact", a) for a in client.read_artifacts(flow_run_filter=runs)]
    for what, record in records:
        text = record if isinstance(record, dict) else record.model_dump(mode="json")
        found += record_leaks(f"prefect {what}", text)
    return found


def mlflow_leaks(
    uri: str, *, experiment: str | None = None, kind: str | None = "campaign"
) -> tuple[list[str], int]:
    """Each MLflow record of the server at ``uri`` (of the one ``experiment`` when named)
    that holds a secret, and how many runs of ``kind`` (the tag ``gpucampaign.kind``: the
    campaign's parent run by default; None: every run) it holds (the campaign reached it
    through the secret-bearing URI)."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=uri)
    found, n_runs = [], 0
    for exp in client.search_experiments():
        if experiment is not None and exp.name != experiment:
            continue
        for run in client.search_runs([exp.experiment_id]):
            n_runs += kind is None or run.data.tags.get("gpucampaign.kind") == kind
            data = {
                "params": run.data.params,
                "tags": run.data.tags,
                "metrics": sorted(run.data.metrics),
                "name": run.info.run_name,
                "artifact_uri": run.info.artifact_uri,
            }
            if leaked(json.dumps(data)):
                found.append(f"mlflow run {run.info.run_id}: {json.dumps(data)[:300]}")
            with tempfile.TemporaryDirectory() as tmp:
                got = Path(client.download_artifacts(run.info.run_id, "", tmp))
                found += [f"mlflow artifact {p}" for p in file_leaks(got)]
    return found, n_runs
