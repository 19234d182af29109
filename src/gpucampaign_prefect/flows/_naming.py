"""What the Prefect UI shows of a campaign's flow runs: a name with the campaign and its
output folder (instead of a random nickname), and a tag with the campaign's name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from prefect.client.orchestration import get_client
from prefect.context import FlowRunContext
from prefect.runtime import flow_run

from gpucampaign.folder.layout import SPEC_COPY

CAMPAIGN_TAG = "campaign:{name}"


def spec_name(spec: Any, *, out: str | None = None) -> str:
    """The campaign's ``name``: from a spec object, a spec file, or the output folder's copy;
    the file's stem (or ``campaign``) when it cannot be read."""
    name = getattr(spec, "name", None)
    if isinstance(name, str) and name:
        return name
    candidates = [Path(spec)] if isinstance(spec, str | Path) else []
    if out:
        candidates.append(Path(out) / SPEC_COPY)
    for path in candidates:
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8")[:1_000_000])
        except (OSError, ValueError, yaml.YAMLError):
            continue
        if isinstance(data, dict) and isinstance(data.get("name"), str) and data["name"]:
            return str(data["name"])
    return Path(spec).stem if isinstance(spec, str | Path) else "campaign"


def campaign_run_name() -> str:
    """``<campaign name> -> <output folder>``, from the flow run's parameters."""
    params = flow_run.parameters
    out = str(params.get("out") or "")
    return f"{spec_name(params.get('spec'), out=out)} -> {out}"


def restart_check_run_name() -> str:
    """``restart check of <campaign name> -> <output folder>``."""
    params = flow_run.parameters
    out = str(params.get("out") or "")
    return f"restart check of {spec_name(params.get('spec'), out=out)} -> {out}"


def tag_flow_run(*tags: str) -> None:
    """Add ``tags`` to the current flow run (best effort: the UI's filter, nothing depends
    on it)."""
    ctx = FlowRunContext.get()
    if ctx is None or ctx.flow_run is None:
        return
    try:
        with get_client(sync_client=True) as client:
            current = list(client.read_flow_run(ctx.flow_run.id).tags or [])
            wanted = current + [t for t in tags if t not in current]
            if wanted != current:
                client.update_flow_run(ctx.flow_run.id, tags=wanted)
    except Exception:  # the server unreachable: the campaign goes on untagged
        return
