"""Training phases: the pilot of a run and the full run, under the GPU lock (R5, R10, R11)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prefect import task
from prefect.artifacts import create_progress_artifact, update_progress_artifact

from gpucampaign.corpus import load_spec_corpus
from gpucampaign.files import median
from gpucampaign.spec import CampaignSpec
from gpucampaign.stoprules import STOP_RULES, StopRule
from gpucampaign.storage import open_store
from gpucampaign.training import train_run
from tasks._common import PHASE_OPTIONS, artifact_key, busy, out_folder, record_stop
from tasks.gpu_lock import gpu_slot

PROGRESS_EVERY_S = 2.0


def recorded_stop(out: str, run_id: str) -> StopRule | None:
    """The stop already recorded for this run ID: a stopped run is finished, never redone."""
    for rec in out_folder(out).read_jsonl("stops.jsonl"):
        if rec.get("run_id") == run_id and rec.get("rule") in STOP_RULES:
            cls = STOP_RULES[rec["rule"]]
            return cls(run_id, rec.get("reason", ""), step=rec.get("step"), stop_id=rec.get("stop_id"))
    return None


def _median_or_zero(values: Any) -> float:
    vals = values if isinstance(values, list) else [values]
    return float(median(v for v in vals if isinstance(v, int | float)) or 0.0)


def pilot_measures(spec: CampaignSpec, *, run: str, result: dict[str, Any], n_train: int) -> dict[str, Any]:
    """What the re-forecast needs from a pilot: load, step, eval and save costs and their counts."""
    cfg = spec.run_config(run)
    t = result["timings"]
    planned = int(result["planned_steps"])
    steps_per_epoch = cfg.steps_per_epoch(n_train)
    evals = planned // cfg.eval_every if cfg.eval_every else -(-planned // steps_per_epoch)
    every = result.get("checkpoint_every") or planned
    return {
        "run_id": result["run_id"],
        "steps_done": result["steps_done"],
        "planned_steps": planned,
        "batch_size": cfg.batch_size,
        "n_train": n_train,
        "load_s": float(t.get("load_s") or 0.0),
        "step_s": float(t.get("step_s") or 0.0),
        "eval_s": _median_or_zero(t.get("eval_s")),
        "save_s": _median_or_zero(t.get("save_s")),
        "restore_s": float(t.get("restore_s") or 0.0),
        "evals": evals,
        "saves": max(1, -(-planned // max(1, int(every)))),
        "checkpoint_every": result.get("checkpoint_every"),
    }


def _run_training(
    spec: CampaignSpec,
    *,
    base_dir: str,
    out: str,
    run: str,
    phase: str,
    stop_after_steps: int | None,
) -> dict[str, Any]:
    folder = out_folder(out)
    run_id = spec.run_id(run)
    stopped = recorded_stop(out, run_id)
    if stopped is not None:
        raise stopped
    corpus = load_spec_corpus(spec, base_dir=base_dir, run_id=run_id)
    store = open_store(spec.storage.url, out_dir=Path(out))
    artifact_id = create_progress_artifact(
        progress=0.0, key=artifact_key(phase, run_id), description=f"{phase} of {run_id}"
    )

    last = [time.monotonic()]

    def progress(info: dict[str, Any]) -> None:
        # One API call per PROGRESS_EVERY_S at most: short runs would spend more time reporting
        # than training.
        if time.monotonic() - last[0] < PROGRESS_EVERY_S:
            return
        last[0] = time.monotonic()
        done = 100.0 * info["step"] / max(1, info["planned_steps"])
        update_progress_artifact(artifact_id=artifact_id, progress=min(100.0, done))

    try:
        with gpu_slot(spec.gpu_lock.name, timeout_s=spec.gpu_lock.timeout_s, lease_s=spec.gpu_lock.lease_s):
            with busy(folder, spec, phase=phase, run=run, note=run_id) as row:
                result = train_run(
                    spec,
                    run=run,
                    corpus=corpus,
                    store=store,
                    out_dir=folder.run_dir(run_id),
                    stop_after_steps=stop_after_steps,
                    progress=progress,
                )
                row["steps"] = 0 if result.reused else result.steps_done - (result.resumed_from_step or 0)
                if result.reused:
                    row["note"] = f"{run_id}: recorded result reused, nothing trained"
    except StopRule as exc:
        record_stop(folder, exc, run=run, phase=phase)
        raise
    update_progress_artifact(artifact_id=artifact_id, progress=100.0)
    out_dict = result.to_dict()
    out_dict["n_train"] = len(corpus.split("train"))
    return out_dict


@task(
    name="pilot",
    task_run_name="pilot[{run}]",
    **PHASE_OPTIONS,
)
def pilot(spec: CampaignSpec, *, base_dir: str, out: str, run: str) -> dict[str, Any]:
    """The first ``pilot.steps`` steps of a run, measured; the full run resumes from them."""
    result = _run_training(
        spec, base_dir=base_dir, out=out, run=run, phase="pilot", stop_after_steps=spec.pilot.steps
    )
    return pilot_measures(spec, run=run, result=result, n_train=result["n_train"])


@task(
    name="train",
    task_run_name="train[{run_id}]",
    **PHASE_OPTIONS,
)
def train(spec: CampaignSpec, *, base_dir: str, out: str, run: str, run_id: str) -> dict[str, Any]:
    """A full training run (control or variant); resumes from its last good checkpoint."""
    if run_id != spec.run_id(run):
        raise ValueError(f"run_id {run_id} is not the ID of run '{run}' ({spec.run_id(run)})")
    return _run_training(spec, base_dir=base_dir, out=out, run=run, phase="train", stop_after_steps=None)
