"""The ``restart-verification`` flow ("before the rental period ends"), deployed on a cron
schedule as ``restart-verification/scheduled``.

For a campaign's output folder: every run's latest good checkpoint is retrieved from the
campaign's store, resumed in a fresh process and compared exactly with what the run recorded.
With an S3 store that holds the folder's mirror, the folder itself is first retrieved into a
fresh one, so the check reads what a user would get back, not the local disk.
The flow fails loudly when any run cannot be resumed, when there is nothing to resume, or
when the rental ends within the margin while some files are only on this machine. It never
passes on an older checkpoint: the latest kept one is checked (for a run a stop rule ended,
its last checkpoint must load whole, and only the steps it recorded after it are replayed), and
the report artifact names per run the checkpoint checked and why, the checkpoint
expected, what was wrong (missing object, sha256 mismatch with both hashes, not resumable) and
the older checkpoint that would still resume.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from gpucampaign.core.stoprules import NoUsableRestart, StopRule
from gpucampaign.folder.layout import SPEC_COPY
from gpucampaign.plan import calendar
from gpucampaign.plan.tariffs import load_catalog
from gpucampaign.restartcheck.scheduled import output_check_target
from gpucampaign.storage.status import RentalEnding, check_rental_margin, folder_to_check
from gpucampaign_prefect.flows._naming import (
    CAMPAIGN_TAG,
    restart_check_run_name,
    spec_name,
    tag_flow_run,
)
from gpucampaign_prefect.orchestration import notify
from gpucampaign_prefect.orchestration.gpu_lock import embedded_api, ensure_gpu_limit, say_lock_note
from gpucampaign_prefect.orchestration.phases import artifact_key
from gpucampaign_prefect.tasks.restart import resume_check

DEFAULT_OUT = "out/campaign"


@flow(name="restart-verification", flow_run_name=restart_check_run_name, log_prints=False)
def restart_verification(
    out: str = DEFAULT_OUT, spec: str | None = None, steps: int = 20, margin_hours: float = 12.0
) -> list[dict[str, Any]]:
    """Check that the campaign in ``out`` can be restarted exactly from its checkpoints.

    Args:
        out: the campaign's output folder (its ``spec.yaml`` copy names the store and corpus).
        spec: the campaign's spec file, when the output folder's copy is not to be used.
        steps: optimizer steps resumed and compared per run.
        margin_hours: fail when fewer hours than this remain before the rental ends while a
            checkpoint or an output file is only on this machine.

    Raises:
        NoUsableRestart: a run's checkpoint is missing, refused, or does not reproduce the run;
            or no run has a checkpoint at all.
        RentalEnding: the rental ends within ``margin_hours`` and something is only local.
    """
    logger = get_run_logger()
    root = Path(out).resolve()
    tag_flow_run(CAMPAIGN_TAG.format(name=spec_name(spec, out=out)))
    kept = (root / SPEC_COPY).is_file()  # else only --spec names the store and the lots
    ending = rental_ending(root, spec=spec, margin_hours=margin_hours) if kept else None
    if ending is not None:
        logger.error("%s", ending)
    with tempfile.TemporaryDirectory(prefix="gpucampaign-scheduled-") as work:
        checked = folder_to_check(root, dest=Path(work) / "out") if kept else root
        checked = checked.resolve()
        if checked != root:
            logger.info("checking a fresh copy retrieved from the store into %s", checked)
        reports = _check(checked, spec=spec, steps=steps)
    if ending is not None:
        raise ending
    return reports


def rental_ending(out: Path, *, spec: str | None, margin_hours: float) -> RentalEnding | None:
    """The rental margin of the folder's spec copy: None when nothing is at risk; else the
    error, once its notification (``gpucampaign.rental.ending``: the end in UTC and the files
    only on this machine) is emitted.

    Args:
        out: the campaign's output folder (with its ``spec.yaml``).
        spec: the spec file given to the flow, if any (its name names the campaign).
        margin_hours: hours before the rental's end under which local files are at risk.
    """
    try:
        check_rental_margin(out, margin_hours=margin_hours)
    except RentalEnding as exc:
        name = spec_name(spec, out=str(out))
        notify.rental_ending(
            campaign=notify.campaign_id_of(out) or name, name=name, message=str(exc), out=str(out)
        )
        return exc
    return None


def _check(out: Path, *, spec: str | None, steps: int) -> list[dict[str, Any]]:
    logger = get_run_logger()
    target = output_check_target(out, spec_path=spec)
    cs = target.spec
    lanes = calendar.plan(cs, catalog=load_catalog(spec=cs, base_dir=out)).gpu_lanes
    note = ensure_gpu_limit(cs.gpu_lock.name, slots=lanes, clear_stale=embedded_api())
    say_lock_note(note, logger=logger)  # what it made in our words, a held slot as a warning

    futures = {
        run: resume_check.submit(target, out=str(out), run=run, steps=steps) for run in target.runs
    }
    reports: list[dict[str, Any]] = []
    for run, fut in futures.items():
        try:
            reports.append(fut.result())
        except Exception as exc:  # noqa: BLE001 - every run gets its line in the report
            reports.append(_error_row(run, target.runs[run], exc))
    failures = [r["summary"] for r in reports if not r.get("ok")]
    create_markdown_artifact(
        markdown=restart_markdown(cs.name, out, reports),
        key=artifact_key("restart-check", cs.name),
        description="Restart verification of the latest checkpoints",
    )
    for line in failures:
        logger.error("restart verification: %s", line)
    if failures:
        raise NoUsableRestart(cs.name, "restart verification failed for " + "; ".join(failures))
    for r in reports:  # which checkpoint each check took, and why; a stopped run says so
        logger.info("restart verification: %s", r["summary"])
    return reports


def _error_row(run: str, run_id: str, exc: BaseException) -> dict[str, Any]:
    """A report row for a run whose check raised instead of answering."""
    reason = exc.reason if isinstance(exc, StopRule) else f"{type(exc).__name__}: {exc}"
    return {
        "run": run,
        "run_id": run_id,
        "ok": False,
        "identical": False,
        "expected_step": None,
        "problem": {"kind": "error", "detail": reason},
        "resumes_from": None,
        "summary": f"{run}: {reason}",
    }


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def restart_markdown(name: str, out: Path, reports: list[dict[str, Any]]) -> str:
    """The report artifact: per run the checkpoint expected (the latest kept), what was wrong
    with it, and the older checkpoint that would still resume."""
    bad = sum(1 for r in reports if not r.get("ok"))
    lines = [
        f"# Restart verification: {name}",
        "",
        f"Output folder: `{out}`",
        "",
        f"**{'FAILED' if bad else 'passed'}**: {len(reports) - bad} of {len(reports)} run(s) "
        "resume exactly from their latest kept checkpoint.",
        "",
        "| run | run ID | expected checkpoint | result | what was wrong | still resumes from | "
        "compared steps | max abs diff |",
        "|---|---|---:|---|---|---:|---:|---:|",
    ]
    for r in reports:
        problem = r.get("problem") or {}
        wrong = _problem_text(problem) if problem else ""
        if r.get("ok") and r.get("mode") == "stopped":
            result = "stopped run: its last checkpoint loads whole"
        elif r.get("ok"):
            result = "resumes exactly"
        elif problem:
            result = f"**{problem.get('kind')}**"
        else:
            result = "**not identical**"
        expected = r.get("expected_step")
        older = r.get("resumes_from")
        still = "" if r.get("ok") else (f"step {older}" if older is not None else "none")
        diff = r.get("max_abs_diff")
        lines.append(
            f"| {_cell(r['run'])} | `{r['run_id']}` | "
            f"{'step ' + str(expected) if expected is not None else '?'} | {result} | "
            f"{_cell(wrong)} | {still} | {r.get('compared_steps', '')} | "
            f"{'' if diff is None else format(diff, 'g')} |"
        )
    checked = [f"- {_cell(r['run'])}: {_cell(r['checked'])}" for r in reports if r.get("checked")]
    if checked:
        lines += ["", "Which checkpoint each check took, and why:", "", *checked]
    return "\n".join(lines)


def _problem_text(problem: dict[str, Any]) -> str:
    kind = problem.get("kind")
    obj = f" `{problem['obj']}`" if problem.get("obj") else ""
    if kind in ("sha256 mismatch", "checksum mismatch"):
        algo = problem.get("algorithm", "sha256")
        return (
            f"{kind}{obj}: expected {algo} `{problem.get('expected_sha256')}`, "
            f"got `{problem.get('actual_sha256')}`"
        )
    if kind == "missing object":
        return f"missing object{obj}"
    return f"{kind}{obj}: {problem.get('detail', '')}"
