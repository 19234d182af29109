"""Data audit (essential): the corpus is there, as pinned, and sound."""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.artifacts import create_markdown_artifact

from gpucampaign.config import CampaignSpec
from gpucampaign.folder.layout import AUDIT_FILE
from gpucampaign.recipe.audit import audit_corpus
from gpucampaign_prefect.orchestration.phases import (
    PHASE_OPTIONS,
    artifact_key,
    busy,
    cancel_on_interrupt,
    ends_on_stop,
    out_folder,
)


@task(name="data-audit", task_run_name="data-audit", **PHASE_OPTIONS)
@cancel_on_interrupt
@ends_on_stop("audit")
def data_audit(spec: CampaignSpec, *, base_dir: str, out: str) -> dict[str, Any]:
    """Audit the pinned corpus; hard findings raise a stop rule, soft ones are listed."""
    folder = out_folder(out)
    with busy(folder, spec, phase="audit"):
        report = audit_corpus(spec, base_dir=base_dir)
    folder.write_json(AUDIT_FILE, report)
    findings = report.get("findings") or []
    lines = [f"- **{f['severity']}** {f['check']}: {f['message']}" for f in findings]
    create_markdown_artifact(
        markdown="# Data audit\n\n" + ("\n".join(lines) or "No findings."),
        key=artifact_key("audit", spec.name),
        description="Corpus audit",
    )
    return report
