"""Where a secret of a real campaign on the stack could land, searched: the worker's terminal
(its log), every file of the output folder, the Prefect records of the flow run (its states,
its task runs and their states, its logs and artifacts, read through the Prefect client) and
every MLflow run of the stack's tracking server (params, tags, metrics' names, artifacts).

The session's campaign (``finished_campaign``) tracks to the stack's MLflow server through
``MLFLOW_TRACKING_URI=http://alice:<password>@host``, a password holding a quote (the form
that once reached the terminal, ``mlflow.json`` and Prefect's database). Its distinctive core
is what is searched for, so the raw, quoted, percent-encoded and basic-auth (base64) forms are
all found.
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
    basic = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    return (SECRET_CORE.encode(), quote(PASSWORD, safe="").encode(), basic.encode())


def leaked(data: bytes | str) -> bool:
    """Whether ``data`` holds the secret in any form."""
    raw = data.encode() if isinstance(data, str) else data
    return any(form in raw for form in _forms())


def file_leaks(root: Path) -> list[str]:
    """Each file under ``root`` that holds the secret."""
    return [str(p) for p in sorted(root.rglob("*")) if p.is_file() and leaked(p.read_bytes())]


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
        if leaked(json.dumps(text, default=str)):
            found.append(f"prefect {what}: {json.dumps(text, default=str)[:300]}")
    return found


def mlflow_leaks(uri: str) -> tuple[list[str], int]:
    """Each MLflow record of the server at ``uri`` that holds the secret, and how many
    campaign (parent) runs it holds (the campaign reached it through the secret-bearing URI)."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=uri)
    found, n_runs = [], 0
    for exp in client.search_experiments():
        for run in client.search_runs([exp.experiment_id]):
            n_runs += run.data.tags.get("gpucampaign.kind") == "campaign"
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
