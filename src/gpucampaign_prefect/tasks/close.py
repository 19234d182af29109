"""Closing the campaign: the close itself is ``gpucampaign.close.closing``; here its busy time, the
UI artifacts, then the manifest (always last) and the verification of the folder in a fresh
process."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from gpucampaign.close.closing import close_runs, seal_folder, track_closed, write_closing_documents
from gpucampaign.close.report import render_report_md
from gpucampaign.config import CampaignSpec
from gpucampaign.core.files import sha256_file
from gpucampaign.core.storageurl import is_local
from gpucampaign.folder.layout import MANIFEST
from gpucampaign.storage.mirror import Fence, mirror_output
from gpucampaign.tracking import tag_manifest
from gpucampaign.verify.checks import verify_output
from gpucampaign_prefect.orchestration.phases import (
    PHASE_OPTIONS,
    TASK_OPTIONS,
    artifact_key,
    busy,
    cancel_on_interrupt,
    out_folder,
)


@task(name="close", task_run_name="close", **PHASE_OPTIONS)
@cancel_on_interrupt
def close_campaign(
    spec: CampaignSpec,
    *,
    base_dir: str,
    out: str,
    campaign_id: str,
    catalog: Any,
    analyses: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """Verdict, budget, forecast vs actual, figures, report and RELOAD.md (the manifest follows)."""
    folder = out_folder(out)
    with busy(folder, spec, phase="close"):
        closed = close_runs(
            spec, root=folder.root, base_dir=base_dir, catalog=catalog, analyses=analyses
        )
    # Written once the close interval is on the timeline, so the close step itself is observed.
    report = write_closing_documents(
        spec, closed, root=folder.root, base_dir=base_dir, campaign_id=campaign_id, catalog=catalog
    )
    tracked = track_closed(spec, closed, root=folder.root, campaign_id=campaign_id)
    if tracked is not None:
        logger = get_run_logger()
        (logger.warning if "did not answer" in tracked else logger.info)(tracked)
    create_markdown_artifact(
        markdown=f"Output folder: `{folder.root}`\n\n" + render_report_md(report),
        key=artifact_key("report", spec.name, campaign_id),
        description=f"Closing report: {closed.verdict.kind} ({folder.root})",
    )
    create_table_artifact(
        table=closed.table_rows(),
        key=artifact_key("runs", spec.name, campaign_id),
        description=f"Runs of the campaign, output folder {folder.root}",
    )
    return closed.summary(campaign_id)


@task(name="manifest", task_run_name="manifest", **TASK_OPTIONS)
@cancel_on_interrupt
def seal(spec: CampaignSpec, *, out: str, closed: dict[str, Any]) -> dict[str, Any]:
    """Write the manifest (nothing is written into the folder after it), then verify the folder."""
    folder = out_folder(out)
    seal_folder(spec, root=folder.root, summary=closed)
    # The close wrote the folder and knows the sha256 of its manifest: the anchor of this
    # verification, printed and kept outside the folder (artifact, MLflow tag, S3 metadata).
    anchor = sha256_file(folder.path(MANIFEST))
    report = verify_output(folder.root, reload=True, expect=anchor)
    logger = get_run_logger()
    logger.info(
        "manifest.json sha256: %s (keep it outside the folder; check the folder anywhere with "
        "`campaign verify OUT --expect %s`)",
        anchor,
        anchor,
    )
    campaign_id = str(closed.get("campaign_id", ""))
    create_markdown_artifact(
        markdown=(
            f"Output folder: `{folder.root}`\n\nmanifest.json sha256: `{anchor}`\n\n"
            f"Check a copy of the folder anywhere with `campaign verify OUT --expect {anchor}`."
        ),
        key=artifact_key("manifest", spec.name, campaign_id),
        description=f"The manifest's sha256 of {folder.root}, kept outside the folder",
    )
    tagged = tag_manifest(spec, campaign_id=campaign_id, sha256=anchor)
    if tagged is not None:
        (logger.warning if "not tagged" in tagged else logger.info)(tagged)
    if report.verified:
        logger.info(
            "output folder verified: %s files, models reloaded in a fresh process: %s",
            report.checked_files,
            ", ".join(report.reloaded_runs) or "none",
        )
    else:
        logger.error(
            "output folder NOT verified: %s",
            "; ".join(f"{p.code} {p.path}" for p in report.problems),
        )
    return {**report.to_dict(), "manifest_sha256": anchor}


@task(name="mirror", task_run_name="mirror", **TASK_OPTIONS)
@cancel_on_interrupt
def mirror(spec: CampaignSpec, *, out: str, fence: Fence | None = None) -> dict[str, Any]:
    """Copy the sealed output folder to the campaign's store, so it outlives the rental (only
    while the store's manifest is the one ``fence`` found at the run's start)."""
    result = mirror_output(out_folder(out).root, url=spec.storage.url, fence=fence)
    logger = get_run_logger()
    if "error" in result:
        logger.error(
            "output folder NOT mirrored to %s, it is only on this machine: %s",
            result["url"],
            result["error"],
        )
    elif not is_local(result["url"]):
        logger.info(
            "output folder mirrored to %s: %s files (%s sent); its manifest.json object keeps "
            "the sha256 %s in its metadata",
            result["url"],
            result["files"],
            result["uploaded"],
            result.get("manifest_sha256"),
        )
    return result
