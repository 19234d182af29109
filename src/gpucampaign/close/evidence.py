"""The evidence the verdict rests on, read from the output folder, and the verdict it gives.

Each run's metric, predictions and per-example scores on the selection and report splits
(replicates folded into their base run), the decision metric per run, and the spec's decision
rule applied to them, with more evidence priced at the rented lots' price.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpucampaign.close.bootstrap import metric_value
from gpucampaign.close.budget import resolve_packages
from gpucampaign.close.looks import look_alpha
from gpucampaign.close.predictions import predictions_file, read_predictions
from gpucampaign.close.scores import no_scores_reason, read_scores
from gpucampaign.close.verdict import RunEvidence, Verdict, decide_verdict, no_rule_verdict
from gpucampaign.config import CampaignSpec
from gpucampaign.core.stoprules import EARLY_RULES
from gpucampaign.folder.layout import (
    METRICS_FILE,
    SCORES_ERROR_FILE,
    OutputFolder,
    run_relpath,
    scores_file,
)
from gpucampaign.folder.metrics import read_metrics
from gpucampaign.folder.records import NOT_RUN_LOT_ENDED, RunState, StopRecord
from gpucampaign.plan.decision import Decision

#: The run states whose recorded evaluation is evidence: a stopped run that measured, and an
#: interrupted one (``resume: inference``: its last good model, at its step).
MEASURED = ("completed", "stopped", "interrupted")


def verdict_splits(spec: CampaignSpec) -> list[str]:
    """The report split (``predictions.csv``), then the selection split when there is a rule."""
    return [spec.decision_split] + ([spec.selection_split] if spec.decision_rule else [])


def run_evidence(
    spec: CampaignSpec, *, root: str | Path, states: Mapping[str, RunState]
) -> dict[str, RunEvidence]:
    """Each run's metric, predictions and per-example scores on the selection and report
    splits.

    A split's value comes from the run's saved predictions or per-example scores when it has
    them (the very rows the intervals resample), otherwise from the evaluation in
    ``result.json``. Only a run that completed, stopped after measuring, or was interrupted
    under ``resume: inference`` (its last good model, noted as such) has values. Replicates
    (``<run>.s<seed>``) are folded into their base run: every replicate's rows, the mean of
    their values, the mean of their measured training times (one seed's).
    """
    single = _single_run_evidence(spec, root=root, states=states)
    out: dict[str, RunEvidence] = {}
    for base in spec.base_names():
        reps = [e for run, e in single.items() if (spec.replicate_of(run) or (run,))[0] == base]
        if base not in single:
            continue
        early = next((e for e in reps if e.futile is not None), None)
        if early is not None:
            # A seed stopped early: the run is not judged on its other seeds alone, and the
            # stopped seed (the base run or a replicate) is what the verdict names.
            reps = [replace(e, values={}, predictions={}, scores={}) for e in reps]
        first = early or single[base]
        values = {}
        for split in verdict_splits(spec):
            got = [v for e in reps if (v := e.values.get(split)) is not None]
            values[split] = round(sum(got) / len(got), 12) if got else None
        preds = {
            split: tuple(p for e in reps for p in e.predictions.get(split, ()))
            for split in verdict_splits(spec)
        }
        scores = {
            split: tuple(p for e in reps for p in e.scores.get(split, ()))
            for split in verdict_splits(spec)
        }
        times = [e.train_s for e in reps]  # one seed's measured training time: their mean
        out[base] = RunEvidence(
            values=values,
            predictions=preds,
            scores=scores,
            status=first.status,
            note="; ".join(dict.fromkeys(e.note for e in reps if e.note)),
            no_interval="; ".join(dict.fromkeys(e.no_interval for e in reps if e.no_interval)),
            train_s=None
            if None in times or not times
            else round(sum(t for t in times if t is not None) / len(times), 6),
            step=first.step,
            planned=first.planned,
            peak=single[base].peak,
            futile=first.futile,
            early_rule=next((e.early_rule for e in reps if e.early_rule), ""),
        )
    return out


def _single_run_evidence(
    spec: CampaignSpec, *, root: str | Path, states: Mapping[str, RunState]
) -> dict[str, RunEvidence]:
    """``run_evidence`` of each run on its own, replicates apart."""
    folder = OutputFolder(root)
    metric = spec.decision_rule.metric if spec.decision_rule else None
    out: dict[str, RunEvidence] = {}
    for rid, s in states.items():
        values: dict[str, float | None] = {}
        preds: dict[str, tuple[Any, ...]] = {}
        scores: dict[str, tuple[Any, ...]] = {}
        stop = s.stop if s.status == "stopped" else None
        early = stop.rule if stop is not None and stop.rule in EARLY_RULES else ""
        # A variant stopped early measured a model of fewer steps: never set against the
        # finished control (its stop's numbers are its evidence, said with the verdict).
        measured = metric and s.result is not None and s.status in MEASURED and not early
        # Classifier predictions are the built-in recipes' own rows; any recipe's per-example
        # scores are read where its score() wrote them.
        config = spec.run_config(s.run)
        builtin = config.builtin
        for split in verdict_splits(spec) if measured else []:
            assert s.result is not None and metric is not None
            path = folder.run(rid).path / predictions_file(split, report_split=spec.decision_split)
            # Each replicate's rows carry its seed: the verdict pairs the sides seed by seed.
            if builtin and path.is_file():
                preds[split] = (replace(read_predictions(path), seed=config.seed),)
            scored = folder.run(rid).path / scores_file(split)
            if scored.is_file() and metric in (got := read_scores(scored)).values:
                scores[split] = (replace(got, seed=config.seed),)
            value = metric_value(preds.get(split, ()), metric=metric)
            if value is None and split in scores:
                value = scores[split][0].mean(metric)
            if value is None:
                value = s.result.eval_metrics.get(split, {}).get(metric)
            if value is None and split == spec.decision_split:
                value = s.result.metrics.get(metric)
            values[split] = value
        rows = any(metric_value(p, metric=metric or "") is not None for p in preds.values())
        no_interval = ""
        if measured and not rows and not scores:
            assert metric is not None
            error = folder.path(run_relpath(rid, SCORES_ERROR_FILE))
            no_interval = (
                f"its score() failed at the close: {error.read_text('utf-8').strip()}"
                if error.is_file()
                else no_scores_reason(spec.run_config(s.run), metric=metric)
            )
        train_s = (s.result.timings or {}).get("steps_s_sum") if s.result is not None else None
        res = s.result if measured else None
        out[s.run] = RunEvidence(
            step=res.steps_done if res is not None else None,
            planned=res.planned_steps if res is not None else None,
            peak=_peak(spec, folder.path(run_relpath(rid, METRICS_FILE)))
            if res is not None
            else None,
            futile=stop.step if stop is not None and early else None,
            early_rule=early,
            values=values,
            predictions=preds,
            scores=scores,
            status=s.status,
            note=_evidence_note(s),
            no_interval=no_interval,
            train_s=None if train_s is None else float(train_s),
        )
    return out


def _peak(spec: CampaignSpec, metrics: Path) -> tuple[int, float] | None:
    """The step and value of a run's best evaluation on the selection split (the latest of
    equal ones); None without a rule or an evaluation."""
    rule = spec.decision_rule
    if rule is None:
        return None
    best: tuple[int, float] | None = None
    for row in read_metrics(metrics):
        value = row.get(rule.metric)
        if row.get("kind") != "eval" or row.get("split") != rule.select_split:
            continue
        if not isinstance(value, int | float) or not isinstance(row.get("step"), int):
            continue
        if best is None or not rule.better(best[1], float(value)):
            best = (int(row["step"]), float(value))
    return best


def _evidence_note(state: RunState) -> str:
    """What the verdict must say of a run's values: an interrupted run's are at step K, a run
    the lot's end left unfinished has none for that reason (a variant stopped early is said by
    ``verdict_steps.barred``)."""
    if state.status == "not_run" and state.reason == NOT_RUN_LOT_ENDED:
        return "the lot ended before it finished"
    res = state.result
    if state.status != "interrupted" or res is None:
        return ""
    return f"interrupted: the model of step {res.steps_done} of {res.planned_steps}"


def run_metrics(states: Mapping[str, RunState], *, metric: str | None) -> dict[str, float | None]:
    """The decision metric per run name; None for a run that neither completed nor stopped
    after measuring it."""
    out: dict[str, float | None] = {}
    for s in states.values():
        value = None
        if metric and s.result is not None and s.status in MEASURED:
            value = s.result.metrics.get(metric)
        out[s.run] = value
    return out


def closing_verdict(
    spec: CampaignSpec,
    *,
    evidence: Mapping[str, RunEvidence],
    stops: list[StopRecord],
    decision: Decision | None,
    catalog: Any = None,
    look: int = 0,
) -> Verdict:
    """The spec's decision rule applied to the runs' evidence (re-pose when the decision point
    re-posed the question); more evidence is priced at the rented lots' price. ``look``: the
    rounds of seeds bought beyond the plan, whose error is spent across the looks
    (``close.looks``)."""
    rule = spec.decision_rule
    if rule is None:
        return no_rule_verdict()
    repose = "; ".join(decision.reasons) if decision and decision.action == "re-pose" else None
    return decide_verdict(
        rule,
        control=evidence.get("control"),
        variants={r: e for r, e in evidence.items() if r != "control"},
        stops=[s.to_dict() for s in stops],
        repose_reason=repose,
        lot=lot_price(spec, catalog=catalog),
        look=look,
        alpha=look_alpha(look),
    )


def lot_price(spec: CampaignSpec, *, catalog: Any = None) -> dict[str, float] | None:
    """The rented lots' price and GPU hours: ``{usd, gpu_hours}``; None without a lot."""
    lots = resolve_packages(spec.packages, catalog=catalog)
    usd = sum(float(p["price_usd"]) * p["count"] for p in lots)
    gpu_hours = sum(p["days"] * 24 * p["count"] * (p.get("gpus") or 1) for p in lots)
    return {"usd": round(usd, 2), "gpu_hours": float(gpu_hours)} if lots else None
