"""Predictions and error analysis of every finished run, against the control (R1, R15)."""

from __future__ import annotations

from typing import Any

from prefect import task

from gpucampaign.corpus import load_spec_corpus
from gpucampaign.predictions import error_analysis, read_predictions, write_run_predictions
from gpucampaign.spec import CampaignSpec
from tasks._common import PHASE_OPTIONS, busy, out_folder


@task(name="predictions", task_run_name="predictions", **PHASE_OPTIONS)
def predictions(spec: CampaignSpec, *, base_dir: str, out: str, runs: list[str]) -> dict[str, dict[str, Any]]:
    """Write ``predictions.csv`` and ``error_analysis.json`` of each run that saved a model.

    Returns:
        The error analysis per run name (with flips against the control when it has one).
    """
    folder = out_folder(out)
    corpus = load_spec_corpus(spec, base_dir=base_dir)
    split = spec.decision_rule.split if spec.decision_rule else "test"
    names = [str(c) for c in corpus.classes]
    analyses: dict[str, dict[str, Any]] = {}
    with busy(folder, spec, phase="predict", note=", ".join(runs)):
        preds = {}
        for run in runs:
            rid = spec.run_id(run)
            path = folder.run_dir(rid) / "predictions.csv"
            preds[run] = read_predictions(path) if path.is_file() else write_run_predictions(
                folder.root, rid, corpus=corpus, split=split
            )
        for run, pred in preds.items():
            control = None if run == "control" else preds.get("control")
            analysis = error_analysis(pred, control=control, class_names=names)
            folder.write_json(f"runs/{spec.run_id(run)}/error_analysis.json", analysis)
            analyses[run] = analysis
    return analyses
