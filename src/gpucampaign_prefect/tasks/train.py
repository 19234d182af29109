"""Training phases: the pilot of a run and the full run, under the GPU lock."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from prefect import get_run_logger, task
from prefect.runtime import task_run

from gpucampaign.close.futility import futile_segment
from gpucampaign.config import CampaignSpec, ResolvedRun
from gpucampaign.core.interrupt import raise_if_stopped
from gpucampaign.core.stoprules import Futile
from gpucampaign.engine.loop import train_run
from gpucampaign.engine.runside import RunSide, TrainingNotes
from gpucampaign.folder.metrics import read_metrics
from gpucampaign.folder.runresult import RunResult
from gpucampaign.plan.decision import early_losses
from gpucampaign.plan.machines import machine_limit
from gpucampaign.plan.reforecast import pilot_measures
from gpucampaign_prefect.orchestration.gpu_lock import gpu_slot
from gpucampaign_prefect.orchestration.phases import (
    PHASE_OPTIONS,
    calendar_step,
    cancel_on_interrupt,
    ends_on_stop,
)
from gpucampaign_prefect.orchestration.ui import TrainingView


def _run_training(
    spec: CampaignSpec,
    *,
    base_dir: str,
    out: str,
    run: ResolvedRun,
    phase: str,
    stop_after_steps: int | None,
    lane: int = 0,
    lot: int | None = None,
    probe_eval: bool = False,
) -> tuple[RunResult, RunSide, TrainingNotes]:
    """``train_run`` under the GPU slot, with the busy time recorded (its segment, a heartbeat
    at each durable checkpoint: ``SegmentWriter.saved``); returns the result, the call's side of the
    folder and what it left to say (a note of unsent metrics is logged here).

    ``lot``: the machine this call trains on when each lot's lanes run on their own machine
    (``flows/lane.py``): the slot is one of that machine's GPU limit, and the timeline's copy
    in the store goes to that machine's own key."""
    raise_if_stopped(what=f"{phase} of {run.run_id}")
    # The run's stop recorded, and the inputs checked again at each start: one changed since
    # the audit is a stop (``EssentialInputMissing``), recorded by the task (``ends_on_stop``).
    side = RunSide.open(spec, base_dir=base_dir, out=out, run=run, phase=phase, lot=lot)
    progress = TrainingView(phase, run_folder=side.run_folder, campaign=spec.name, store=side.store)
    lock = spec.gpu_lock
    try:
        with (
            gpu_slot(
                lock.name if lot is None else machine_limit(lock.name, lot=lot),
                timeout_s=lock.timeout_s,
                lease_s=lock.lease_s,
                campaign=spec.name,
                out=str(side.out.root),
                run=f"{phase} of {run.run_id}",
                slots=run.size.processes,  # a data-parallel run holds one slot per GPU
            ),
            side.segment(phase=phase, step=calendar_step(spec, run=run.name, phase=phase)) as seg,
        ):
            progress.start()  # its first update 2 s into the training, not after the wait
            try:
                result = train_run(
                    spec,
                    run=run,
                    corpus=side.corpus,
                    store=side.store,
                    run_folder=side.run_folder,
                    stop_after_steps=stop_after_steps,
                    progress=progress,
                    on_save=seg.saved,
                    lane=lane,
                    probe_eval=probe_eval,
                )
            except Futile as exc:  # the segment says what it trained before the lane was freed
                seg.row.steps, seg.row.note = futile_segment(side.out.root, exc)
                raise
            finally:
                progress.drain()  # no write of the UI's beside the lock's release
            steps = 0 if result.reused else result.steps_done - (result.resumed_from_step or 0)
            seg.row.steps = steps
            if result.reused:
                seg.row.note = f"{run.run_id}: recorded result reused, nothing trained"
        progress.finish()
    finally:
        progress.close()  # a stop or an error: the UI's thread ends too
    notes = replace(side.notes(), segment_s=seg.row.seconds)
    if notes.unsent is not None:
        get_run_logger().warning(notes.unsent)
    return result, side, notes


@task(name="pilot", task_run_name="pilot[{run}]", **PHASE_OPTIONS)
@cancel_on_interrupt
@ends_on_stop("pilot")
def pilot(
    spec: CampaignSpec, *, base_dir: str, out: str, run: str, lane: int = 0
) -> dict[str, Any]:
    """The first ``pilot.steps`` steps of a run, measured (costs and early losses); the full
    run resumes from them."""
    resolved = spec.resolve_run(run)
    result, side, notes = _run_training(
        spec,
        base_dir=base_dir,
        out=out,
        run=resolved,
        phase="pilot",
        stop_after_steps=spec.pilot.steps,
        lane=lane,
        probe_eval=True,  # an evaluation's cost, when its steps held none
    )
    metrics = side.run_folder.metrics
    rows = read_metrics(metrics) if metrics.is_file() else []
    losses = early_losses(rows, steps=spec.pilot.steps)
    return pilot_measures(
        resolved,
        result=result,
        n_train=notes.n_train,
        losses=losses,
        rows=rows,
        segment_s=notes.segment_s,
    )


def _train_run_name() -> str:
    """``train[<run ID>]``, from the task run's parameters: the ID the spec resolved once (a
    look-up, not a resolution)."""
    params = task_run.parameters
    return f"train[{params['spec'].resolve_run(params['run']).run_id}]"


@task(name="train", task_run_name=_train_run_name, **PHASE_OPTIONS)
@cancel_on_interrupt
@ends_on_stop("train")
def train(
    spec: CampaignSpec, *, base_dir: str, out: str, run: str, lane: int = 0, lot: int | None = None
) -> dict[str, Any]:
    """A full training run (control or variant) on its lane's GPU; resumes from its last good
    checkpoint. ``lane``: the GPU's index on the machine; ``lot``: the machine, when each
    lot's lanes run on their own (``flows/lane.py``)."""
    resolved = spec.resolve_run(run)
    result, _, notes = _run_training(
        spec,
        base_dir=base_dir,
        out=out,
        run=resolved,
        phase="train",
        stop_after_steps=None,
        lane=lane,
        lot=lot,
    )
    spooled = notes.spooled
    if spooled:
        get_run_logger().warning(
            "%d checkpoint file(s) are not yet off the machine (the S3 "
            "server is unreachable; spooled in %s/spool, retried in the "
            "background)",
            len(spooled),
            out,
        )
    return {**result.to_dict(), "n_train": notes.n_train, "spooled": spooled}
