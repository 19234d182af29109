"""Closing a campaign's output folder: run states, deliveries, metrics, verdict, figures, the
runs table, RELOAD.md, the closing report and, last, the manifest.

A pure function of the records the campaign wrote and of the spec: nothing is re-measured.
``close_runs`` does the work that counts as the close phase's busy time; the closing
documents follow once that interval is on the timeline (so the close step is observed);
``close_folder`` does both, and ``seal_folder`` writes the manifest after everything else.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpucampaign.close import figures
from gpucampaign.close.budget import close_budget
from gpucampaign.close.error_analysis import error_analysis, rows_analysis
from gpucampaign.close.evidence import closing_verdict, run_evidence, run_metrics, verdict_splits
from gpucampaign.close.forecast import aligned_intervals, forecast_vs_actual
from gpucampaign.close.futility import futility_savings
from gpucampaign.close.goodput import folder_attribution
from gpucampaign.close.inputs import closing_inputs
from gpucampaign.close.ledger import read_ledger
from gpucampaign.close.looks import looks_taken, round_text
from gpucampaign.close.manifest import build_manifest, collect_environment, reference_corpus
from gpucampaign.close.predictions import (
    predictions_file,
    read_predictions,
    reload_check,
    write_run_predictions,
)
from gpucampaign.close.reload_md import write_reload_md
from gpucampaign.close.report import build_report, write_report
from gpucampaign.close.scores import write_run_scores
from gpucampaign.close.verdict import Verdict
from gpucampaign.close.verdict_steps import refuse_rejected
from gpucampaign.config import CampaignSpec, ResolvedRun, run_size
from gpucampaign.config.recipefile import recipe_file
from gpucampaign.core.files import sha256_bytes, sha256_file
from gpucampaign.core.text import say_number
from gpucampaign.folder.layout import (
    ATTRIBUTION_PNG,
    CALENDAR_PNG,
    CONFUSION_PNG,
    CURVES_PNG,
    ERROR_ANALYSIS_FILE,
    METRICS_FILE,
    MODEL_DIR,
    MODEL_WEIGHTS,
    REFORECAST_FILE,
    REPORT_HTML,
    REPORT_JSON,
    REPORT_MD,
    SCORES_ERROR_FILE,
    OutputFolder,
    model_config,
    run_path,
    run_relpath,
)
from gpucampaign.folder.metrics import read_metrics
from gpucampaign.folder.records import (
    DecisionRecord,
    RunState,
    StopRecord,
    decision_after_pilot,
    read_decisions,
    read_pilot,
    read_plan,
    read_rounds,
    read_stops,
    read_timeline,
    run_states,
    spec_with_rounds,
)
from gpucampaign.modelfolder.recipe_reload import write_recipe_predictions
from gpucampaign.modelfolder.refresh import refresh_recipe_copy
from gpucampaign.plan import calendar
from gpucampaign.recipe.contract import RecipeError
from gpucampaign.recipe.runtime import recipe_module_path
from gpucampaign.tracking import track_close

log = logging.getLogger(__name__)


@dataclass
class ClosedRuns:
    """What ``close_runs`` established; ``write_closing_documents`` and the seal read it."""

    states: dict[str, RunState]
    verdict: Verdict
    budget: dict[str, Any]
    runs: list[dict[str, Any]]
    metrics: dict[str, list[dict[str, Any]]]
    figures: dict[str, str]
    stops: list[StopRecord]
    decisions: list[DecisionRecord]
    environment: dict[str, Any]
    corpus_ref: dict[str, Any] | None
    deliveries: list[dict[str, Any]] = field(default_factory=list)
    changed_inputs: list[str] = field(default_factory=list)  # inputs changed mid-campaign

    def table_rows(self) -> list[dict[str, str]]:
        """The runs as short text cells (run ID, tier, status, metric, stop) for a UI table;
        a metric has the digits that show how it compares with the threshold."""
        limit = self.verdict.numbers.get("threshold")
        return [
            {
                "run_id": r["run_id"],
                "tier": r["tier"],
                "status": r["status"],
                "metric": "" if r["metric"] is None else say_number(r["metric"], against=limit),
                "stop": r["stop_id"] or "",
            }
            for r in self.runs
        ]

    def summary(self, campaign_id: str) -> dict[str, Any]:
        """JSON-ready: what the flow reports and what the seal needs."""
        return {
            "campaign_id": campaign_id,
            "verdict": self.verdict.to_dict(),
            "expected_runs": expected_runs(self.states),
            "budget": self.budget,
            "environment": self.environment,
            "corpus_ref": self.corpus_ref,
            "spent_usd": self.budget["spent_usd"],
            "rental_per_accepted_usd": self.budget["rental_per_accepted_usd"],
        }


def analyse_runs(
    spec: CampaignSpec, *, root: str | Path, corpus: Any, runs: list[str]
) -> dict[str, dict[str, Any]]:
    """Write ``predictions.csv`` (unless already written) and ``error_analysis.json`` of each
    run that saved a model, on the decision split, and (with a decision rule, when its recipe
    has ``score``) its per-example scores on the selection and report splits.

    Returns:
        The error analysis per run name (with flips against the control when it has one).
    """
    folder = OutputFolder(root)
    preds = {}
    recipe_analyses: dict[str, dict[str, Any]] = {}
    resolved = {run: spec.resolve_run(run) for run in runs}
    for run in runs:
        rid = resolved[run].run_id
        _refresh_recipe(folder, resolved[run])
        if spec.decision_rule:
            _score_run(spec, folder, run, corpus=corpus)
        if not resolved[run].config.builtin:
            found = _analyse_recipe_run(folder, rid, corpus=corpus, split=spec.decision_split)
            if found.get("task"):
                recipe_analyses[run] = found
            continue
        for split in verdict_splits(spec):
            name = predictions_file(split, report_split=spec.decision_split)
            path = folder.run(rid).path / name
            if path.is_file():
                got = read_predictions(path)
            else:
                got = write_run_predictions(folder.root, rid, corpus=corpus, split=split, name=name)
            if split == spec.decision_split:
                preds[run] = got
    analyses: dict[str, dict[str, Any]] = dict(recipe_analyses)
    for run, pred in preds.items():
        control = None if run == "control" else preds.get("control")
        analyses[run] = error_analysis(
            pred, control=control, class_names=[str(c) for c in corpus.classes]
        )
        folder.write_json(run_relpath(resolved[run].run_id, ERROR_ANALYSIS_FILE), analyses[run])
    return analyses


def _refresh_recipe(folder: OutputFolder, run: ResolvedRun) -> None:
    """A run of a user's recipe edited only in ``predict`` or ``score`` since it trained (same
    run ID): its model folder takes the edited file, so its predictions and scores are made
    again with it, and its training is not."""
    if run.config.builtin or run.recipe_sha256 is None or run.training_sha256 is None:
        return
    if not folder.path(model_config(run.run_id)).is_file():
        return
    model = folder.path(run_relpath(run.run_id, MODEL_DIR))
    if refresh_recipe_copy(
        model,
        recipe=run.config.recipe,
        src=recipe_file(run.config.recipe),
        file_sha256=run.recipe_sha256,
        training_sha256=run.training_sha256,
    ):
        log.warning(
            "run %s: its recipe changed only in predict or score since it trained; its "
            "predictions and scores are made again with the edited file (no training again)",
            run.run_id,
        )


def _score_run(spec: CampaignSpec, folder: OutputFolder, run: str, *, corpus: Any) -> None:
    """The run's per-example scores on the verdict's splits; a ``score`` that fails here
    leaves them out (the verdict then says the run has no interval, and why)."""

    try:
        write_run_scores(
            folder.root,
            spec.resolve_run(run).run_id,
            config=spec.run_config(run),
            corpus=corpus,
            splits=verdict_splits(spec),
        )
    except RecipeError as exc:
        folder.write_text(run_relpath(spec.resolve_run(run).run_id, SCORES_ERROR_FILE), f"{exc}\n")


def _analyse_recipe_run(
    folder: OutputFolder, run_id: str, *, corpus: Any, split: str
) -> dict[str, Any]:
    """A user's recipe run: its predictions file keyed by example ID, and their analysis (a
    classifier's or a regressor's when the rows carry a label and a prediction)."""
    rows = write_recipe_predictions(folder.root, run_id, corpus=corpus, split=split)
    found = rows_analysis(rows, split=split)
    folder.write_json(run_relpath(run_id, ERROR_ANALYSIS_FILE), found)
    return found


def keep_recipe_sources(spec: CampaignSpec, *, root: str | Path) -> list[str]:
    """Copy each user's recipe file next to the folder's ``spec.yaml``, at its module path.

    The copy is byte for byte the file the run IDs hash, so the kept spec resolves its recipes
    and its run IDs from the output folder alone (``campaign verify``, ``status``, a reload).
    """

    folder = OutputFolder(root)
    kept = []
    for run in spec.run_names():
        config = spec.run_config(run)
        rel = None if config.builtin else recipe_module_path(config.recipe)
        if rel is None or rel in kept:
            continue
        source = recipe_file(config.recipe)
        if source.resolve() != folder.path(rel).resolve():
            folder.copy_in(source, rel)
        kept.append(rel)
    return kept


def expected_runs(states: Mapping[str, RunState]) -> dict[str, dict[str, Any]]:
    """The manifest's ``runs``: ``{run_id: {run, tier, status, stop_id?, reason?}}``."""
    return {rid: s.to_dict() for rid, s in states.items()}


def delivery(
    root: str | Path, state: RunState, *, corpus: Any, need_corpus: bool = True
) -> dict[str, Any]:
    """A run as a delivery candidate: accepted only when complete and its model reproduces its
    predictions here (the fresh-process check of ``campaign verify`` follows the manifest);
    with ``need_corpus`` and no ``corpus`` (no file holds its pin any more), not checked."""
    model_file = run_path(root, state.run_id, MODEL_WEIGHTS)
    sha = sha256_file(model_file) if model_file.is_file() else sha256_bytes(state.run_id.encode())
    out = {"id": state.run_id, "content_sha256": sha, "accepted": False}
    if state.status != "completed":
        reason = state.reason or state.status
        if state.stop_id:
            reason = f"{state.status} (stop {state.stop_id})"
        return {**out, "reason": reason}
    if corpus is None and need_corpus:
        return {
            **out,
            "reason": "not reload-checked: the corpus changed during the campaign and no copy "
            "with its pinned sha256 is kept",
        }
    check = reload_check(root, [state.run_id], corpus=corpus)[state.run_id]
    if check["error"]:
        return {**out, "reason": f"does not reload: {check['error']}"[:300]}
    if not check["ok"]:
        return {**out, "reason": f"reloaded predictions differ on {check['mismatches']} row(s)"}
    return {**out, "accepted": True, "reason": "complete; model reloads and reproduces"}


def read_run_metrics(
    root: str | Path, states: Mapping[str, RunState]
) -> dict[str, list[dict[str, Any]]]:
    """``metrics.jsonl`` rows per run name, for the runs that wrote one."""
    out = {}
    for rid, s in states.items():
        path = Path(root) / run_relpath(rid, METRICS_FILE)
        if path.is_file():
            out[s.run] = read_metrics(path)
    return out


def draw_run_figures(
    root: str | Path,
    *,
    metrics: Mapping[str, list[dict[str, Any]]],
    analyses: Mapping[str, Mapping[str, Any]],
    shown: str,
    verdict: Verdict | None = None,
    split: str = "test",
) -> dict[str, str]:
    """Curves of every run (with the verdict's threshold and the control's final value on
    the selection split) and the confusion matrix of ``shown`` on ``split`` (when it was
    analysed); returns ``{calendar, curves?, confusion?}`` relative paths (the calendar is
    drawn last)."""
    folder = OutputFolder(root)
    figs = {"calendar": CALENDAR_PNG}
    numbers = verdict.numbers if verdict is not None else {}
    if metrics:
        figs["curves"] = CURVES_PNG
        sel = numbers.get("select_split")
        figures.plot_curves(
            dict(metrics),
            folder.path(CURVES_PNG),
            metric=numbers.get("metric"),
            threshold=numbers.get("threshold"),
            control_final=verdict.control.get(sel) if verdict is not None and sel else None,
            split=sel,
            continued={
                run: float(m["steps_done"])
                for run, m in read_pilot(root).items()
                if isinstance(m, Mapping) and isinstance(m.get("steps_done"), int | float)
            },
        )
    if "confusion" in analyses.get(shown, {}):
        figs["confusion"] = CONFUSION_PNG
        a = analyses[shown]
        figures.plot_confusion(
            a["confusion"],
            a["classes"],
            folder.path(CONFUSION_PNG),
            title=f"confusion matrix of '{shown}' on {split}",
        )
    return figs


def runs_table(
    states: Mapping[str, RunState],
    *,
    metric_of: Mapping[str, float | None],
    analyses: Mapping[str, Any],
    resume_of: Mapping[str, str] | None = None,
    gpus_of: Mapping[str, int] | None = None,
    metrics: Mapping[str, list[dict[str, Any]]] | None = None,
) -> list[dict[str, Any]]:
    """The report's runs: ``{run_id, run, tier, status, metric, stop_id, analysis, resume,
    interrupted, gpus, step_s, reached_step}`` (``resume``: the run config's choice after an
    interruption, ``training`` by default; ``interrupted``: what an inference restart recorded,
    else None; ``gpus``: its data-parallel processes; ``step_s``: its measured median step time;
    ``reached_step``: the last training step its ``metrics`` record, None when it trained none)."""
    reached = {
        run: max((r["step"] for r in rows if r.get("kind") == "train"), default=None)
        for run, rows in (metrics or {}).items()
    }
    return [
        {
            "run_id": rid,
            "run": s.run,
            "tier": s.tier,
            "status": s.status,
            "metric": metric_of.get(s.run),
            "stop_id": s.stop_id,
            "analysis": analyses.get(s.run),
            "resume": (resume_of or {}).get(s.run, "training"),
            "interrupted": s.result.interrupted if s.result is not None else None,
            "gpus": (gpus_of or {}).get(s.run, 1),
            "step_s": s.result.timings.get("step_s") if s.result is not None else None,
            "reached_step": reached.get(s.run),
        }
        for rid, s in states.items()
    ]


def folder_verdict(
    spec: CampaignSpec,
    *,
    root: str | Path,
    catalog: Any = None,
    run_ids: Mapping[str, str] | None = None,
) -> tuple[dict[str, RunState], Verdict]:
    """The run states and the verdict of an output folder, from its records alone: the
    decisions, the stops, each run's result, predictions and per-example scores. The close
    and ``campaign verify`` (which recomputes the sealed verdict) both call it.

    Args:
        spec: the campaign.
        root: its output folder.
        catalog: the ``tariffs.Catalog`` the lots are priced with (more evidence's price).
        run_ids: the run IDs by run name as the manifest records them (else resolved).
    """
    decision = decision_after_pilot(read_decisions(root))
    spec = spec_with_rounds(spec, root)  # the runs of the rounds bought beyond the plan too
    states = run_states(spec, root=root, decision=decision, run_ids=run_ids)
    evidence = run_evidence(spec, root=root, states=states)
    verdict = closing_verdict(
        spec,
        evidence=evidence,
        stops=read_stops(root),
        decision=decision,
        catalog=catalog,
        look=looks_taken(root),
    )
    return states, verdict


def close_runs(
    spec: CampaignSpec,
    *,
    root: str | Path,
    base_dir: str | Path,
    catalog: Any = None,
    analyses: Mapping[str, Mapping[str, Any]],
) -> ClosedRuns:
    """Run states, verdict, deliveries, budget, figures of the runs, the runs table, RELOAD.md.

    Args:
        spec: the campaign.
        root: its output folder.
        base_dir: the folder the spec's paths are relative to.
        catalog: the ``tariffs.Catalog`` to price the packages with.
        analyses: ``error_analysis.error_analysis`` results per run name.
    """
    decisions = read_decisions(root)
    stops = read_stops(root)
    spec = spec_with_rounds(spec, root)  # the rounds' runs are the campaign's runs too
    states, verdict = folder_verdict(spec, root=root, catalog=catalog)
    metric_of = run_metrics(
        states, metric=spec.decision_rule.metric if spec.decision_rule else None
    )
    # An input changed during the campaign: read from the copy the folder kept, and named.
    inputs = closing_inputs(spec, root=root, base_dir=base_dir)
    deliveries = [
        delivery(root, s, corpus=inputs.corpus, need_corpus=spec.corpus is not None)
        for s in states.values()
    ]
    verdict = refuse_rejected(
        verdict,
        rejected={states[d["id"]].run: d["reason"] for d in deliveries if not d["accepted"]},
    )
    budget = close_budget(
        spec.packages,
        catalog=catalog,
        expenses=[*spec.expenses, *(e.as_expense() for e in read_ledger(root))],
        deliveries=deliveries,
        unit=spec.deliveries.unit,
        result_text=verdict.answer or verdict.text,
    )
    metrics = read_run_metrics(root, states)
    figs = draw_run_figures(
        root,
        metrics=metrics,
        analyses=analyses,
        shown=verdict.run or "control",
        verdict=verdict,
        split=spec.decision_split,
    )
    corpus_ref = None
    if spec.corpus and inputs.path is not None:
        corpus_ref = reference_corpus(root, inputs.path, sha256=spec.corpus.sha256)
    keep_recipe_sources(spec, root=root)
    environment = collect_environment(cwd=base_dir)
    write_reload_md(
        root,
        runs={rid: s.run for rid, s in states.items() if s.status == "completed"},
        corpus_ref=corpus_ref,
        environment=environment,
        shown=verdict.run,
    )
    return ClosedRuns(
        states=states,
        verdict=verdict,
        budget=budget,
        runs=runs_table(
            states,
            metric_of=metric_of,
            analyses=analyses,
            resume_of={r: spec.run_config(r).resume for r in spec.run_names()},
            gpus_of={r: run_size(spec.run_config(r)).processes for r in spec.run_names()},
            metrics=metrics,
        ),
        metrics=metrics,
        figures=figs,
        stops=stops,
        decisions=decisions,
        environment=environment,
        corpus_ref=corpus_ref,
        deliveries=deliveries,
        changed_inputs=inputs.changed,
    )


def write_closing_documents(
    spec: CampaignSpec,
    closed: ClosedRuns,
    *,
    root: str | Path,
    base_dir: str | Path,
    campaign_id: str,
    catalog: Any = None,
) -> dict[str, Any]:
    """Forecast vs actual, the calendar figure (planned vs observed) and the report files.

    Returns:
        The report (``report.json``'s content).
    """
    folder = OutputFolder(root)
    plan = read_plan(root)
    assert plan is not None, "plan.json is written at the campaign's start"
    timeline = read_timeline(root)
    forecast = forecast_vs_actual(
        plan,
        reforecast=read_plan(root, relative=REFORECAST_FILE),
        timeline=timeline,
        decisions=closed.decisions,
        stops=closed.stops,
        pilot=read_pilot(root),
        metrics=closed.metrics,
    )
    plan0 = calendar.plan(spec, catalog=catalog, base_dir=base_dir)
    figures.plot_calendar(
        plan0, folder.path(CALENDAR_PNG), actual=aligned_intervals(plan, timeline)
    )
    attribution = folder_attribution(root, spec, catalog=catalog)
    shown = dict(closed.figures)
    if attribution is not None:
        figures.plot_attribution(attribution, folder.path(ATTRIBUTION_PNG))
        shown["attribution"] = ATTRIBUTION_PNG
    report = build_report(
        campaign_id=campaign_id,
        name=spec.name,
        question=spec.question,
        verdict=closed.verdict,
        budget=closed.budget,
        forecast=forecast,
        runs=closed.runs,
        stops=closed.stops,
        decisions=closed.decisions,
        figures=shown,
        futility=futility_savings(root, stops=closed.stops, timeline=timeline),
        changed_inputs=closed.changed_inputs,
        attribution=attribution,
        rounds=[
            {**r.to_dict(), "text": round_text(r, bound=spec.decision_point.rounds)}
            for r in read_rounds(root)
        ],
    )
    write_report(root, report)
    return report


def track_closed(
    spec: CampaignSpec, closed: ClosedRuns, *, root: str | Path, campaign_id: str
) -> str | None:
    """Send the close to MLflow when tracking is on (``tracking.mlflow.track_close``): the
    verdict and budget as tags of the campaign's parent run, the report and figures as its
    artifacts, and the metrics an outage kept back.

    Returns:
        The line that says what was tracked, or why not; None when tracking is off.
    """
    return track_close(
        spec,
        root=root,
        campaign_id=campaign_id,
        verdict=closed.verdict.to_dict(),
        budget=closed.budget,
        files=[REPORT_MD, REPORT_HTML, REPORT_JSON, *closed.figures.values()],
    )


def close_folder(
    spec: CampaignSpec,
    *,
    root: str | Path,
    base_dir: str | Path,
    campaign_id: str,
    catalog: Any = None,
    analyses: Mapping[str, Mapping[str, Any]],
) -> tuple[ClosedRuns, dict[str, Any]]:
    """The whole close of an output folder but the manifest: ``close_runs`` then
    ``write_closing_documents``.

    Returns:
        What ``close_runs`` established, and the report.
    """
    closed = close_runs(spec, root=root, base_dir=base_dir, catalog=catalog, analyses=analyses)
    report = write_closing_documents(
        spec, closed, root=root, base_dir=base_dir, campaign_id=campaign_id, catalog=catalog
    )
    return closed, report


def seal_folder(
    spec: CampaignSpec, *, root: str | Path, summary: Mapping[str, Any]
) -> dict[str, Any]:
    """Write the manifest (nothing may be written into the folder after it).

    Args:
        spec: the campaign.
        root: its output folder.
        summary: ``ClosedRuns.summary``'s result.

    Returns:
        The manifest written.
    """
    return build_manifest(
        root,
        spec=spec,
        campaign_id=summary["campaign_id"],
        expected_runs=summary["expected_runs"],
        verdict=summary["verdict"],
        stops=[s.to_dict() for s in read_stops(root)],
        decisions=[d.to_dict() for d in read_decisions(root)],
        budget=summary["budget"],
        environment=summary["environment"],
        corpus_ref=summary["corpus_ref"],
    )
