"""Closing the campaign (R1, R13-R16): verdict, budget, forecast vs actual, figures, report,
then the manifest (always last) and the verification of the folder in a fresh process."""

from __future__ import annotations

import hashlib
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from gpucampaign import calendar, figures
from gpucampaign.close import (
    actual_intervals,
    build_report,
    close_budget,
    decide_verdict,
    forecast_vs_actual,
    render_report_md,
    write_report,
)
from gpucampaign.corpus import corpus_path, load_spec_corpus
from gpucampaign.metrics import read_metrics
from gpucampaign.outputs import (
    OutputFolder,
    build_manifest,
    collect_environment,
    reference_corpus,
    reload_check,
    verify_output,
    write_reload_md,
)
from gpucampaign.spec import CampaignSpec
from tasks._common import PHASE_OPTIONS, TASK_OPTIONS, artifact_key, busy, out_folder


def run_statuses(
    spec: CampaignSpec, *, folder: OutputFolder, decision: dict[str, Any] | None, stops: list[dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Every run of the spec with its status: completed, stopped, dropped or not_run (and why)."""
    stop_of = {s.get("run_id"): s for s in stops}
    dropped = set((decision or {}).get("dropped_runs") or [])
    out: dict[str, dict[str, Any]] = {}
    for run in spec.run_names():
        rid = spec.run_id(run)
        info: dict[str, Any] = {"run": run, "tier": spec.tier_of(run)}
        result = folder.read_json(f"runs/{rid}/result.json")
        if rid in stop_of:
            info.update(status="stopped", stop_id=stop_of[rid]["stop_id"])
        elif run in dropped:
            info.update(status="dropped", reason="dropped at the decision point")
        elif result and result.get("completed"):
            info.update(status="completed")
        else:
            why = "the question was re-posed" if (decision or {}).get("action") == "re-pose" else "the campaign stopped"
            info.update(status="not_run", reason=why)
        info["result"] = result
        out[rid] = info
    return out


def _delivery(folder: OutputFolder, rid: str, info: dict[str, Any], *, corpus: Any) -> dict[str, Any]:
    """A run as a delivery candidate: accepted only when complete and its model reproduces its
    predictions here (the fresh-process check of ``campaign verify`` follows the manifest)."""
    model_file = folder.path(f"runs/{rid}/model/model.safetensors")
    sha = hashlib.sha256(model_file.read_bytes()).hexdigest() if model_file.is_file() else hashlib.sha256(
        rid.encode()).hexdigest()
    if info["status"] != "completed":
        reason = info.get("reason") or f"{info['status']} (stop {info.get('stop_id')})"
        return {"id": rid, "content_sha256": sha, "accepted": False, "reason": reason}
    check = reload_check(folder.root, [rid], corpus=corpus)[rid]
    if check["error"]:
        return {"id": rid, "content_sha256": sha, "accepted": False, "reason": f"does not reload: {check['error']}"[:300]}
    if not check["ok"]:
        return {"id": rid, "content_sha256": sha, "accepted": False,
                "reason": f"reloaded predictions differ on {check['mismatches']} row(s)"}
    return {"id": rid, "content_sha256": sha, "accepted": True, "reason": "complete; model reloads and reproduces"}


@task(name="close", task_run_name="close", **PHASE_OPTIONS)
def close_campaign(
    spec: CampaignSpec,
    *,
    base_dir: str,
    out: str,
    campaign_id: str,
    catalog: Any,
    decision: dict[str, Any] | None,
    analyses: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """Verdict, budget, forecast vs actual, figures, report and RELOAD.md (the manifest follows)."""
    folder = out_folder(out)
    with busy(folder, spec, phase="close"):
        stops = folder.read_jsonl("stops.jsonl")
        decisions = folder.read_jsonl("decisions.jsonl")
        statuses = run_statuses(spec, folder=folder, decision=decision, stops=stops)
        rule = spec.decision_rule
        metric_of: dict[str, float | None] = {}
        for info in statuses.values():
            res = info["result"] or {}
            value = (res.get("metrics") or {}).get(rule.metric) if rule else None
            metric_of[info["run"]] = value if info["status"] in ("completed", "stopped") else None

        repose = "; ".join(decision["reasons"]) if decision and decision.get("action") == "re-pose" else None
        verdict = decide_verdict(
            rule,
            control_metric=metric_of.get("control"),
            variant_metrics={r: v for r, v in metric_of.items() if r != "control"},
            stops=stops,
            repose_reason=repose,
        ) if rule else None
        verdict_dict = verdict.to_dict() if verdict else {"kind": "stopped", "run": None,
                                                          "text": "The spec has no decision rule.", "numbers": {}}

        corpus = load_spec_corpus(spec, base_dir=base_dir) if spec.corpus else None
        deliveries = [_delivery(folder, rid, info, corpus=corpus) for rid, info in statuses.items()]
        budget = close_budget(spec.packages, catalog=catalog, expenses=spec.expenses, deliveries=deliveries,
                              unit=spec.deliveries.unit, result_text=verdict_dict["text"])

        metrics = {
            info["run"]: read_metrics(folder.path(f"runs/{rid}/metrics.jsonl"))
            for rid, info in statuses.items() if folder.path(f"runs/{rid}/metrics.jsonl").is_file()
        }
        figs = {"calendar": "figures/calendar.png"}
        if metrics:
            figs["curves"] = "figures/curves.png"
            figures.plot_curves(metrics, folder.path(figs["curves"]))
        shown = verdict_dict.get("run") or "control"
        if shown in analyses:
            figs["confusion"] = "figures/confusion.png"
            a = analyses[shown]
            figures.plot_confusion(a["confusion"], a["classes"], folder.path(figs["confusion"]), title=shown)

        runs_out = [
            {"run_id": rid, "run": info["run"], "tier": info["tier"], "status": info["status"],
             "metric": metric_of.get(info["run"]), "stop_id": info.get("stop_id"),
             "analysis": analyses.get(info["run"])}
            for rid, info in statuses.items()
        ]
        corpus_ref = reference_corpus(folder.root, corpus_path(spec, base_dir=base_dir),
                                      sha256=spec.corpus.sha256) if spec.corpus else None
        environment = collect_environment(cwd=base_dir)
        write_reload_md(
            folder.root,
            runs={rid: info["run"] for rid, info in statuses.items() if info["status"] == "completed"},
            corpus_ref=corpus_ref, environment=environment,
        )

    # Forecast vs actual is written after the close interval is on the timeline, so the close
    # step itself is observed; what follows is a few file writes.
    plan0 = calendar.plan(spec, catalog=catalog, base_dir=base_dir)
    timeline = folder.read_jsonl("timeline.jsonl")
    forecast = forecast_vs_actual(
        folder.read_json("plan.json"), reforecast=folder.read_json("reforecast.json"), timeline=timeline,
        decisions=decisions, stops=stops, pilot=folder.read_json("pilot.json"), metrics=metrics,
    )
    figures.plot_calendar(plan0, folder.path(figs["calendar"]), actual=_aligned_intervals(plan0.to_dict(), timeline))
    report = build_report(
        campaign_id=campaign_id, name=spec.name, question=spec.question, verdict=verdict_dict,
        budget=budget, forecast=forecast, runs=runs_out, stops=stops, decisions=decisions, figures=figs,
    )
    write_report(folder.root, report)
    create_markdown_artifact(markdown=render_report_md(report), key=artifact_key("report", spec.name),
                             description=f"Closing report: {verdict_dict['kind']}")
    create_table_artifact(
        table=[{"run_id": r["run_id"], "tier": r["tier"], "status": r["status"],
                "metric": "" if r["metric"] is None else f"{r['metric']:.4f}", "stop": r["stop_id"] or ""}
               for r in runs_out],
        key=artifact_key("runs", spec.name), description="Runs of the campaign",
    )
    return {
        "campaign_id": campaign_id,
        "verdict": verdict_dict,
        "expected_runs": {rid: {k: v for k, v in info.items() if k != "result"} for rid, info in statuses.items()},
        "budget": budget,
        "environment": environment,
        "corpus_ref": corpus_ref,
        "spent_usd": budget["spent_usd"],
        "rental_per_accepted_usd": budget["rental_per_accepted_usd"],
    }


def _aligned_intervals(plan: dict[str, Any], timeline: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Observed intervals on the plan's clock: the first observed step starts where it was planned."""
    rows = [r for r in timeline if r.get("start") and r.get("end")]
    if not rows:
        return []
    first = min(rows, key=lambda r: r["start"])
    planned = {s["name"]: s for s in plan.get("steps", [])}
    offset = float(planned.get(first.get("step") or "", {}).get("start_hours") or 0.0)
    return [{**iv, "start_hours": iv["start_hours"] + offset, "end_hours": iv["end_hours"] + offset}
            for iv in actual_intervals(rows)]


@task(name="manifest", task_run_name="manifest", **TASK_OPTIONS)
def seal(spec: CampaignSpec, *, out: str, closed: dict[str, Any]) -> dict[str, Any]:
    """Write the manifest (nothing is written into the folder after it), then verify the folder."""
    folder = out_folder(out)
    build_manifest(
        folder.root, spec=spec, campaign_id=closed["campaign_id"], expected_runs=closed["expected_runs"],
        verdict=closed["verdict"], stops=folder.read_jsonl("stops.jsonl"),
        decisions=folder.read_jsonl("decisions.jsonl"), budget=closed["budget"],
        environment=closed["environment"], corpus_ref=closed["corpus_ref"],
    )
    report = verify_output(folder.root, reload=True)
    logger = get_run_logger()
    if report.verified:
        logger.info("output folder verified: %s files, models reloaded in a fresh process: %s",
                    report.checked_files, ", ".join(report.reloaded_runs) or "none")
    else:
        logger.error("output folder NOT verified: %s", "; ".join(f"{p.code} {p.path}" for p in report.problems))
    return report.to_dict()
