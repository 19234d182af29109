"""``campaign deploy``: the campaign's deployments on a running Prefect server, for the folder
the user stands in (``gpucampaign_prefect.flows._deploy`` registers them; it is imported by
name, like the flows, so every other command works without Prefect).

It is registered on the one ``app`` of ``cli/common.py`` when ``cli`` imports this module.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

from gpucampaign.cli.common import SpecFile, app, esc, handle_errors, say


@app.command("deploy")
@handle_errors
def deploy_cmd(
    spec: SpecFile,
    out: Path | None = typer.Option(
        None, "--out", help="Output folder of the deployed runs (default: out/<name>)."
    ),
    pool: str | None = typer.Option(
        None, "--pool", help="Work pool (default: gpucampaign; made as a process pool if missing)."
    ),
    name: str | None = typer.Option(
        None,
        "--name",
        help="Deployment name for a project beside another: campaign/NAME and "
        "restart-verification/NAME (default: campaign/main, restart-verification/scheduled).",
    ),
    replace: bool = typer.Option(
        False, "--replace", help="Replace deployments of that name registered from another folder."
    ),
) -> None:
    """Register the deployments for this folder on the Prefect server at PREFECT_API_URL.

    campaign/main and restart-verification/scheduled, or campaign/NAME and
    restart-verification/NAME with --name (exit 2: PREFECT_API_URL unset or not answering,
    SPEC invalid, or the names registered from another project folder, which is replaced only
    with --replace). Their flow runs start in this folder, so SPEC and --out are relative to
    it, as for `campaign run`; a worker of the work pool runs them (`prefect worker start
    --pool gpucampaign`, started where this tool is installed). Registering again from this
    folder replaces them.
    """
    from gpucampaign.cli.runner import load_flow
    from gpucampaign.config import load_spec

    cs = load_spec(spec)  # a spec that does not validate is refused here, not at its first run
    target = out or Path("out") / cs.name
    project = Path.cwd().resolve()
    deploy = load_flow("deploy_project")
    url, deployed = deploy(
        project=project,
        spec=os.fspath(spec),
        out=os.fspath(target),
        pool=pool,
        name=name,
        replace=replace,
        campaign=cs.name,
    )
    for d in deployed:
        params = ", ".join(f"{k}={v}" for k, v in d.parameters.items())
        crons = f"; cron {', '.join(d.crons)} (UTC)" if d.crons else ""
        say(f"deployed {esc(d.name)} ({esc(params)}{esc(crons)})")
    say(f"on {esc(url)}, flow runs in {esc(project)}")
    say(
        f"next: prefect worker start --pool {esc(pool or 'gpucampaign')}  (from this "
        "environment; on rented lots: campaign worker --lot K on lot K's machine), then: "
        f"prefect deployment run campaign/{esc(name or 'main')} --watch"
    )
