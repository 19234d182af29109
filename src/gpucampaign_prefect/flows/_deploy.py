"""``campaign deploy``: the deployments of the package's ``deployments/prefect.yaml``,
registered for a project folder on the Prefect server at ``PREFECT_API_URL``.

The installed package carries ``prefect.yaml`` (``gpucampaign_prefect/deployments``), the one
definition of the deployments: ``campaign/main``, ``lane/main`` (one machine's lanes, which
``campaign/main`` starts on each lot's work queue) and ``restart-verification/scheduled``, their
installed entrypoints (``gpucampaign_prefect.flows.*``), tags, job variables and schedule. Here
``{{ $GPUCAMPAIGN_ROOT }}`` becomes the project folder (the flow-run process starts there, so
the spec's and the output's relative paths resolve in it, as for ``campaign run``), the
parameters become the project's spec and output folder, and each deployment is created (or
updated: registering again from the same folder replaces it) through the client, with the
process work pool when the server has none of that name. A deployment of the same name that
runs in another project folder is never replaced unless asked (``--replace``): a second
project takes names of its own (``--name``), so each project's runs, and the relaunches of its
crashed campaigns (the same deployment run again), start in its own folder. ``prefect deploy``
from a checkout does the same from the file itself.
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

from gpucampaign.core.errors import ArgumentError, SettingError
from gpucampaign_prefect.flows._naming import CAMPAIGN_TAG
from gpucampaign_prefect.orchestration.embedded import require_named_server

#: The placeholder of ``prefect.yaml`` that names the project folder.
ROOT_PLACEHOLDER = "{{ $GPUCAMPAIGN_ROOT }}"
_SET_DIR = "prefect.deployments.steps.set_working_directory"


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
    *,
    project: Path,
    spec: str,
    out: str,
    pool: str | None = None,
    name: str | None = None,
    replace: bool = False,
    campaign: str | None = None,
) -> tuple[str, list[Deployed]]:
    """Register the deployments for ``project`` on the server at ``PREFECT_API_URL``.

    Args:
        project: the project folder (absolute): the flow runs' working directory.
        spec: the campaign's spec, as a path relative to ``project`` (or absolute).
        out: the output folder, relative to ``project`` (or absolute).
        pool: the work pool (default: ``prefect.yaml``'s); made as a process pool if missing.
        name: the deployments' name (``campaign/NAME``, ``restart-verification/NAME``) for a
            project beside another; default ``prefect.yaml``'s (``main``, ``scheduled``).
        replace: replace deployments of that name registered from another project folder.
        campaign: the campaign's name: ``campaign/...`` carries its tag ``campaign:<name>``,
            so each of its flow runs has it from its creation (a relaunch waiting for a
            worker too, which the UI's tag filter would otherwise hide).

    Returns:
        The server's URL and the deployments registered.

    Raises:
        SettingError: ``PREFECT_API_URL`` is unset, or the server does not answer.
        ArgumentError: (without ``replace``) a
            deployment of that name runs in another project folder: nothing was registered.
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
    entries = _named(data["deployments"], name=name)
    if campaign:
        tag = CAMPAIGN_TAG.format(name=campaign)
        entries = [
            (role, {**e, "tags": [*(e.get("tags") or []), tag]} if _is_campaign(e) else e)
            for role, e in entries
        ]
    params = {"main": {"spec": spec, "out": out}, "scheduled": {"out": out}}  # lane/main: too
    require_named_server(fix="point PREFECT_API_URL at the running one.")
    with get_client(sync_client=True) as client:
        if not replace:  # every deployment checked before any is written
            _refuse_other_projects(client, entries, project=project)
        deployed = []
        for role, entry in entries:
            work_pool = {**entry["work_pool"], **({"name": pool} if pool else {})}
            _ensure_pool(client, work_pool["name"])
            deployed.append(
                _register(
                    client,
                    entry,
                    work_pool=work_pool,
                    pull=data.get("pull") or [],
                    parameters={**entry.get("parameters", {}), **params.get(role, {})},
                )
            )
    return str(url), deployed


def _is_campaign(entry: dict[str, Any]) -> bool:
    """Whether ``entry`` deploys the campaign flow: its runs alone carry the campaign's tag
    (a machine's lane run is never one of the campaign's copies its lock counts or closes)."""
    return str(entry.get("entrypoint", "")).endswith(":campaign")


def _named(entries: list[dict[str, Any]], *, name: str | None) -> list[tuple[str, dict[str, Any]]]:
    """Each deployment of ``prefect.yaml`` with its role (its name in the file: ``main``,
    ``scheduled``), renamed ``name`` when given."""
    return [(e["name"], {**e, "name": name} if name else e) for e in entries]


def _refuse_other_projects(
    client: Any, entries: list[tuple[str, dict[str, Any]]], *, project: Path
) -> None:
    """Refuse when a deployment of these names runs in another project folder: replacing it
    would move that project's runs, and its crashed campaigns' relaunches, into this one."""
    taken = []
    for _, entry in entries:
        full = f"{_flow_of(entry).name}/{entry['name']}"
        try:
            existing = client.read_deployment_by_name(full)
        except ObjectNotFound:
            continue
        where = _deployed_from(existing)
        if where is not None and Path(where) != project:
            taken.append((full, where))
    if taken:
        names = ", ".join(f"{full} (from '{where}')" for full, where in taken)
        raise ArgumentError(
            f"{names} {'is' if len(taken) == 1 else 'are'} registered from another project "
            f"folder: registering {'it' if len(taken) == 1 else 'them'} from '{project}' would "
            "run that project's campaigns, and the relaunches of its crashed ones, in this "
            "folder. Nothing was registered. Give this project deployments of its "
            "own with `campaign deploy SPEC --name NAME` (then `prefect deployment run "
            "campaign/NAME`), or add --replace to move them here.",
            field="--name",
        )


def _deployed_from(deployment: Any) -> str | None:
    """The folder a registered deployment's flow runs start in (its working directory)."""
    folder = (deployment.job_variables or {}).get("working_dir")
    for step in deployment.pull_steps or []:
        folder = folder or (step.get(_SET_DIR) or {}).get("directory")
    return str(folder) if folder else None


def _flow_of(entry: dict[str, Any]) -> Any:
    """The flow object of a ``prefect.yaml`` deployment (its installed entrypoint)."""
    module, _, attr = entry["entrypoint"].partition(":")
    return getattr(importlib.import_module(module), attr)


def _register(
    client: Any,
    entry: dict[str, Any],
    *,
    work_pool: dict[str, Any],
    pull: list[dict[str, Any]],
    parameters: dict[str, Any],
) -> Deployed:
    """Create (or replace) the deployment ``entry`` of ``prefect.yaml``."""
    flow = _flow_of(entry)
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


def ensure_work_queues(*, pool: str, queues: list[str]) -> list[str]:
    """The work pool ``pool`` and its queues ``queues`` on the server at ``PREFECT_API_URL``,
    made when missing (``campaign worker --lot K``, before it becomes the worker).

    A Prefect worker asked to poll a queue that does not exist polls none of its queues (the
    server answers 404 and the worker says nothing), so lot 1's worker, which polls ``lot-1``
    and ``default``, would never start ``campaign/main`` before a run was sent to ``lot-1``.

    Returns:
        The queues made (none when all were there).
    """
    made = []
    with get_client(sync_client=True) as client:
        _ensure_pool(client, pool)
        for queue in queues:
            try:
                client.read_work_queue_by_name(queue, work_pool_name=pool)
            except ObjectNotFound:
                client.create_work_queue(name=queue, work_pool_name=pool)
                made.append(queue)
    return made


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
