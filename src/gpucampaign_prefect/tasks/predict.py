"""Predictions and error analysis of every finished run, against the control."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task

from gpucampaign.close.closing import analyse_runs
from gpucampaign.close.inputs import closing_inputs
from gpucampaign.config import CampaignSpec
from gpucampaign_prefect.orchestration.phases import (
    PHASE_OPTIONS,
    busy,
    cancel_on_interrupt,
    out_folder,
)


@task(name="predictions", task_run_name="predictions", **PHASE_OPTIONS)
@cancel_on_interrupt
def predictions(
    spec: CampaignSpec, *, base_dir: str, out: str, runs: list[str]
) -> dict[str, dict[str, Any]]:
    """Write ``predictions.csv`` and ``error_analysis.json`` of each run that saved a model.

    Returns:
        The error analysis per run name (with flips against the control when it has one).
    """
    folder = out_folder(out)
    # An input changed during the campaign is read from the copy the folder kept at the start.
    inputs = closing_inputs(spec, root=folder.root, base_dir=base_dir)
    if spec.corpus is not None and inputs.corpus is None:
        get_run_logger().warning(
            "no predictions: %s", "; ".join(inputs.changed) or "the corpus does not load"
        )
        return {}
    with busy(folder, spec, phase="predict", note=", ".join(runs)):
        return analyse_runs(spec, root=folder.root, corpus=inputs.corpus, runs=runs)
