"""``campaign deploy``: the deployments of the package's ``deployments/prefect.yaml``,
registered for a project folder on the Prefect server at ``PREFECT_API_URL``.

The installed package carries ``prefect.yaml`` (``gpucampaign_prefect/deployments``), the one
definition of the deployments: ``campaign/main`` and ``restart-verification/scheduled``, their
installed entrypoints (``gpucampaign_prefect.flows.*``), tags, job variables and schedule. Here
``{{ $GPUCAMPAIGN_ROOT }}`` becomes the project folder (the flow-run process starts there, so
the spec's and the output's relative paths resolve in it, as for ``campaign run``), the
parameters become the project's spec and output folder, and each deployment is created (or
updated: registering again replaces it) through the client, with the process work pool when
the server has none of that name. ``prefect deploy`` from a checkout does the same from the
file itself.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import DeploymentScheduleCreate, WorkPoolCreate
from prefect.client.schemas.schedules import CronSchedule
from prefect.exceptions import ObjectNotFound
from prefect.settings import get_current_settings
from prefect.utilities.callables import parameter_schema
from prefect.workers.process import ProcessWorker

from gpucampaign.core.errors import SettingError
from gpucampaign_prefect.orchestration.embedded import require_named_server

#: The placeholder of ``prefect.yaml`` that names the project folder.
ROOT_PLACEHOLDER = "{{ $GPUCAMPAIGN_ROOT }}"


@dataclass(frozen=True)
class Deployed:
    """One deployment as registered: ``flow/name``, its parameters and its schedules."""

    name: str
    parameters: dict[str, Any]
    crons: tuple[str, ...]


def deployments_file() -> dict[str, Any]:
    """``deployments/prefect.yaml`` as the installed package carries it."""
    text = (resources.files("gpucampaign_prefect") / "deployments" / "prefect.yaml").read_text(
        encoding="utf-8"
    )
    data: dict[str, Any] = yaml.safe_load(text)
    return data


def deploy_project(
    *, project: Path, spec: str, out: str, pool: str | None = None, name: str | None = None
) -> tuple[str, list[Deployed]]:
    """Register the deployments for ``project`` on the server at ``PREFECT_API_URL``.

    Args:
        project: the project folder (absolute): the flow runs' working directory.
        spec: the campaign's spec, as a path relative to ``project`` (or absolute).
        out: the output folder, relative to ``project`` (or absolute).
        pool: the work pool (default: ``prefect.yaml``'s); made as a process pool if missing.
        name: each deployment's name (default: ``prefect.yaml``'s, ``main`` and
            ``scheduled``): ``campaign/NAME`` and ``restart-verification/NAME``.

    Returns:
        The server's URL and the deployments registered.

    Raises:
        SpecError: ``PREFECT_API_URL`` is unset, or the server does not answer.
    """
    url = get_current_settings().api.url
    if not url:
        raise SettingError(
            "PREFECT_API_URL is not set: `campaign deploy` registers the deployments on a "
            "running Prefect server. Start one (`prefect server start`, or `make stack-up` in "
            "the checkout) and export PREFECT_API_URL=http://127.0.0.1:4200/api; `campaign "
            "run` needs no server.",
            field="PREFECT_API_URL",
        )
    data = _filled(deployments_file(), root=str(project))
    params = {"main": {"spec": spec, "out": out}, "scheduled": {"out": out}}
    require_named_server(fix="point PREFECT_API_URL at the running one.")
    with get_client(sync_client=True) as client:
        deployed = []
        for entry in data["deployments"]:
            work_pool = {**entry["work_pool"], **({"name": pool} if pool else {})}
            _ensure_pool(client, work_pool["name"])
            deployed.append(
                _register(
                    client,
                    {**entry, "name": name or entry["name"]},
                    work_pool=work_pool,
                    pull=data.get("pull") or [],
                    parameters={**entry.get("parameters", {}), **params.get(entry["name"], {})},
                )
            )
    return str(url), deployed


def _register(
    client: Any,
    entry: dict[str, Any],
    *,
    work_pool: dict[str, Any],
    pull: list[dict[str, Any]],
    parameters: dict[str, Any],
) -> Deployed:
    """Create (or replace) the deployment ``entry`` of ``prefect.yaml``."""
    module, _, attr = entry["entrypoint"].partition(":")
    flow = getattr(importlib.import_module(module), attr)
    schedules = [
        DeploymentScheduleCreate(
            schedule=CronSchedule(cron=s["cron"], timezone=s.get("timezone") or "UTC"),
            active=bool(s.get("active", True)),
        )
        for s in entry.get("schedules") or []
    ]
    client.create_deployment(
        flow_id=client.create_flow_from_name(flow.name),
        name=entry["name"],
        entrypoint=entry["entrypoint"],
        description=" ".join(str(entry.get("description", "")).split()),
        tags=list(entry.get("tags") or []),
        parameters=parameters,
        parameter_openapi_schema=parameter_schema(flow).model_dump_for_openapi(),
        work_pool_name=work_pool["name"],
        job_variables=work_pool.get("job_variables") or {},
        pull_steps=pull,
        schedules=schedules,
    )
    crons = tuple(s["cron"] for s in entry.get("schedules") or [])
    return Deployed(name=f"{flow.name}/{entry['name']}", parameters=parameters, crons=crons)


def _ensure_pool(client: Any, name: str) -> None:
    """The process work pool ``name``, made with the process worker's job template if missing."""
    try:
        client.read_work_pool(name)
    except ObjectNotFound:
        template = ProcessWorker.get_default_base_job_template()
        client.create_work_pool(
            WorkPoolCreate(name=name, type="process", base_job_template=template)
        )


def _filled(value: Any, *, root: str) -> Any:
    """``value`` with every ``{{ $GPUCAMPAIGN_ROOT }}`` replaced by ``root``."""
    if isinstance(value, dict):
        return {k: _filled(v, root=root) for k, v in value.items()}
    if isinstance(value, list):
        return [_filled(v, root=root) for v in value]
    if isinstance(value, str):
        return value.replace(ROOT_PLACEHOLDER, root)
    return value
