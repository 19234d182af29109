"""Training phases: the pilot of a run and the full run, under the GPU lock."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.runtime import task_run

from gpucampaign.close.futility import futile_segment
from gpucampaign.config import CampaignSpec, ResolvedRun
from gpucampaign.core.interrupt import raise_if_stopped
from gpucampaign.core.stoprules import STOP_RULES, Futile, StopRule
from gpucampaign.data.corpus import load_spec_corpus
from gpucampaign.engine.loop import train_run
from gpucampaign.engine.parts import n_train_of
from gpucampaign.folder.metrics import read_metrics
from gpucampaign.folder.records import read_stops
from gpucampaign.folder.runresult import RunResult
from gpucampaign.folder.segments import heartbeat
from gpucampaign.plan.decision import early_losses, pilot_measures
from gpucampaign.storage import open_store, spooled_keys
from gpucampaign.storage.open import read_wait_s
from gpucampaign.storage.sharedtimeline import share_timeline
from gpucampaign.tracking import tracking_note
from gpucampaign_prefect.orchestration.gpu_lock import gpu_slot
from gpucampaign_prefect.orchestration.phases import (
    PHASE_OPTIONS,
    busy,
    cancel_on_interrupt,
    ends_on_stop,
    out_folder,
)
from gpucampaign_prefect.orchestration.ui import TrainingView


def recorded_stop(out: str, run_id: str) -> StopRule | None:
    """The stop already recorded for this run ID: a stopped run is finished, never redone."""
    for rec in read_stops(out):
        if rec.run_id == run_id and rec.rule in STOP_RULES:
            return STOP_RULES[rec.rule](run_id, rec.reason, step=rec.step, stop_id=rec.stop_id)
    return None


def _run_training(
    spec: CampaignSpec,
    *,
    base_dir: str,
    out: str,
    run: ResolvedRun,
    phase: str,
    stop_after_steps: int | None,
    lane: int = 0,
) -> tuple[RunResult, int]:
    """Train under the GPU slot with the busy time recorded; returns the result and the number
    of training rows."""
    folder = out_folder(out)
    run_id = run.run_id
    raise_if_stopped(what=f"{phase} of {run_id}")
    stopped = recorded_stop(out, run_id)
    if stopped is not None:
        raise stopped
    # The inputs are checked again at each start: one changed since the audit is a stop
    # (``EssentialInputMissing``), recorded by the task (``ends_on_stop``) like any other.
    corpus = load_spec_corpus(spec, base_dir=base_dir, run_id=run_id)
    store = open_store(spec.storage.url, out=Path(out), read_wait_s=read_wait_s(spec))
    progress = TrainingView(phase, run_id, out=out, campaign=spec.name, store=store)
    try:
        result = _train_under_lock(
            spec,
            out=out,
            run=run,
            phase=phase,
            store=store,
            corpus=corpus,
            progress=progress,
            stop_after_steps=stop_after_steps,
            lane=lane,
        )
        progress.finish(folder)
    finally:
        progress.close()  # a stop or an error: the UI's thread ends too
    if (unsent := tracking_note(folder.run(run_id).path)) is not None:
        get_run_logger().warning(unsent)
    return result, n_train_of(folder.run(run_id), run=run, corpus=corpus)


def _train_under_lock(
    spec: CampaignSpec,
    *,
    out: str,
    run: ResolvedRun,
    phase: str,
    store: Any,
    corpus: Any,
    progress: TrainingView,
    stop_after_steps: int | None,
    lane: int,
) -> RunResult:
    """``train_run`` under the GPU slot, with the busy time recorded."""
    folder, run_id = out_folder(out), run.run_id
    lock = spec.gpu_lock
    with (
        gpu_slot(
            lock.name,
            timeout_s=lock.timeout_s,
            lease_s=lock.lease_s,
            campaign=spec.name,
            out=out,
            run=f"{phase} of {run_id}",
            slots=run.size.processes,  # a data-parallel run holds one slot per GPU
        ),
        busy(folder, spec, phase=phase, run=run.name, note=run_id) as row,
    ):

        def saved(info: dict[str, Any]) -> None:  # a durable checkpoint: on the timeline
            heartbeat(folder.root, row, checkpoint_step=info["step"])
            share_timeline(folder.root, store=store)

        try:
            result = train_run(
                spec,
                run=run,
                corpus=corpus,
                store=store,
                run_folder=folder.run(run_id),
                stop_after_steps=stop_after_steps,
                progress=progress,
                on_save=saved,
                lane=lane,
            )
        except Futile as exc:  # the segment says what it trained before the lane was freed
            row.steps, row.note = futile_segment(folder.root, exc)
            raise
        finally:
            progress.drain()  # no write of the UI's beside the lock's release
        row.steps = 0 if result.reused else result.steps_done - (result.resumed_from_step or 0)
        if result.reused:
            row.note = f"{run_id}: recorded result reused, nothing trained"
    return result


@task(name="pilot", task_run_name="pilot[{run}]", **PHASE_OPTIONS)
@cancel_on_interrupt
@ends_on_stop("pilot")
def pilot(
    spec: CampaignSpec, *, base_dir: str, out: str, run: str, lane: int = 0
) -> dict[str, Any]:
    """The first ``pilot.steps`` steps of a run, measured (costs and early losses); the full
    run resumes from them."""
    resolved = spec.resolve_run(run)
    result, n_train = _run_training(
        spec,
        base_dir=base_dir,
        out=out,
        run=resolved,
        phase="pilot",
        stop_after_steps=spec.pilot.steps,
        lane=lane,
    )
    metrics = out_folder(out).run(resolved.run_id).metrics
    rows = read_metrics(metrics) if metrics.is_file() else []
    losses = early_losses(rows, steps=spec.pilot.steps)
    return pilot_measures(resolved, result=result, n_train=n_train, losses=losses, rows=rows)


def _train_run_name() -> str:
    """``train[<run ID>]``, from the task run's parameters: the ID the spec resolved once (a
    look-up, not a resolution)."""
    params = task_run.parameters
    return f"train[{params['spec'].resolve_run(params['run']).run_id}]"


@task(name="train", task_run_name=_train_run_name, **PHASE_OPTIONS)
@cancel_on_interrupt
@ends_on_stop("train")
def train(
    spec: CampaignSpec, *, base_dir: str, out: str, run: str, lane: int = 0
) -> dict[str, Any]:
    """A full training run (control or variant) on its lane's GPU; resumes from its last good
    checkpoint."""
    resolved = spec.resolve_run(run)
    result, n_train = _run_training(
        spec,
        base_dir=base_dir,
        out=out,
        run=resolved,
        phase="train",
        stop_after_steps=None,
        lane=lane,
    )
    spooled = spooled_keys(out)
    if spooled:
        get_run_logger().warning(
            "%d checkpoint file(s) are not yet off the machine (the S3 "
            "server is unreachable; spooled in %s/spool, retried in the "
            "background)",
            len(spooled),
            out,
        )
    return {**result.to_dict(), "n_train": n_train, "spooled": spooled}
