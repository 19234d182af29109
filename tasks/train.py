"""Training phases: the pilot of a run and the full run, under the GPU lock."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, cast
from uuid import UUID

from prefect import get_run_logger, task
from prefect.artifacts import (
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)

from gpucampaign.close.futility import futile_segment
from gpucampaign.core.interrupt import raise_if_stopped
from gpucampaign.core.stoprules import STOP_RULES, Futile, StopRule
from gpucampaign.data.corpus import load_spec_corpus
from gpucampaign.engine.loop import n_train_of, train_run
from gpucampaign.folder.layout import METRICS_FILE
from gpucampaign.folder.metrics import read_metrics
from gpucampaign.folder.progress import evaluation_table, read_progress, render_line
from gpucampaign.folder.records import read_stops
from gpucampaign.folder.runresult import RunResult
from gpucampaign.folder.segments import heartbeat
from gpucampaign.plan.decision import early_losses, pilot_measures
from gpucampaign.spec import CampaignSpec, ResolvedRun
from gpucampaign.storage import open_store, spooled_keys
from gpucampaign.tracking import tracking_note
from tasks import notify
from tasks._common import (
    PHASE_OPTIONS,
    artifact_key,
    busy,
    cancel_on_interrupt,
    out_folder,
    record_stop,
)
from tasks.gpu_lock import gpu_slot

PROGRESS_EVERY_S = 2.0


def recorded_stop(out: str, run_id: str) -> StopRule | None:
    """The stop already recorded for this run ID: a stopped run is finished, never redone."""
    for rec in read_stops(out):
        if rec.run_id == run_id and rec.rule in STOP_RULES:
            return STOP_RULES[rec.rule](run_id, rec.reason, step=rec.step, stop_id=rec.stop_id)
    return None


class _Progress:
    """What the Prefect UI shows of a training call while it runs, updated once per
    PROGRESS_EVERY_S at most (short runs would otherwise spend more time reporting than
    training): the progress artifact (its description: loss, the last evaluation, the ETA),
    the run's table of evaluations (a new version under one key per run whenever a new
    evaluation is seen), and one notification when checkpoint files stop leaving the machine.
    """

    def __init__(
        self, phase: str, run_id: str, *, out: str = "", campaign: str = "", store: Any = None
    ) -> None:
        # sync_compatible: called from sync code, it returns the UUID, not a coroutine.
        self.id = cast(
            UUID,
            create_progress_artifact(
                progress=0.0, key=artifact_key(phase, run_id), description=f"{phase} of {run_id}"
            ),
        )
        self.last = time.monotonic()
        self.description = f"{phase} of {run_id}"
        self.run_id, self.out, self.campaign = run_id, out, campaign
        self.store = store  # the checkpoint store: its URL and last refusal name the outage
        self.table_step: int | None = None  # the newest evaluation in the table artifact
        self.told_spool = False

    def __call__(self, info: dict[str, Any]) -> None:
        if time.monotonic() - self.last < PROGRESS_EVERY_S:
            return
        self.last = time.monotonic()
        done = 100.0 * info["step"] / max(1, info["planned_steps"])
        # The description carries what the bar cannot: loss, the last evaluation, the ETA.
        self.description = render_line(info)
        update_progress_artifact(
            artifact_id=self.id, progress=min(100.0, done), description=self.description
        )
        self.live_tables(info)

    def live_tables(self, info: dict[str, Any], *, final: bool = False) -> None:
        """A new version of the evaluation table when a new evaluation is seen (always at the
        ``final`` call, after the last evaluation), then the spool check."""
        try:  # a live view is never worth stopping a training for
            seen = info.get("metric_step")
            if final or (seen is not None and seen != self.table_step):
                self.publish_table(info)
            if self.out and not self.told_spool:
                self.check_spool()
        except Exception as exc:
            logging.getLogger(__name__).debug("live tables of %s: %s", self.run_id, exc)

    def publish_table(self, info: dict[str, Any]) -> None:
        """A new version of the run's evaluation table (every evaluation so far, from
        metrics.jsonl, so a resumed run's table holds its earlier evaluations too)."""
        if not self.out:
            return
        rows = read_metrics(out_folder(self.out).run_dir(self.run_id) / METRICS_FILE)
        planned = int(info.get("planned_steps") or max((r.get("step", 0) for r in rows), default=0))
        table = evaluation_table(rows, metric=info.get("metric"), planned_steps=planned)
        if not table:
            return
        self.table_step = table[-1]["step"]
        create_table_artifact(
            table=table,
            key=evaluations_key(self.run_id),
            description=f"Evaluations of {self.run_id} on val"
            + (f": {render_line(info)}" if info else ""),
        )

    def check_spool(self) -> None:
        """Say once (a notification event) that the store stopped taking uploads."""
        pending = spooled_keys(self.out)
        if pending:
            self.told_spool = True
            notify.storage_unreachable(
                campaign=notify.campaign_id_of(self.out) or self.campaign,
                name=self.campaign,
                run_id=self.run_id,
                pending=len(pending),
                out=self.out,
                store=str(getattr(self.store, "url", "") or ""),
                error=str(getattr(self.store, "last_error", "") or ""),
            )


def evaluations_key(run_id: str) -> str:
    """The key of a run's evaluation table artifact (one per run, a new version per update)."""
    return artifact_key("evaluations", run_id)


def _done_description(folder: Any, run_id: str) -> str:
    """The artifact's last description: the run's final live line (its last evaluation)."""
    record = read_progress(folder.run_dir(run_id))
    return render_line(record) if record else f"{run_id}: done"


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
    corpus = load_spec_corpus(spec, base_dir=base_dir, run_id=run_id)
    store = open_store(spec.storage.url, out_dir=Path(out))
    progress = _Progress(phase, run_id, out=out, campaign=spec.name, store=store)
    lock = spec.gpu_lock
    try:
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
            try:
                result = train_run(
                    spec,
                    run=run,
                    corpus=corpus,
                    store=store,
                    out_dir=folder.run_dir(run_id),
                    stop_after_steps=stop_after_steps,
                    progress=progress,
                    on_save=lambda info: heartbeat(folder.root, row, checkpoint_step=info["step"]),
                    lane=lane,
                )
            except Futile as exc:  # the segment says what it trained before the lane was freed
                row.steps, row.note = futile_segment(folder.root, exc)
                raise
            row.steps = 0 if result.reused else result.steps_done - (result.resumed_from_step or 0)
            if result.reused:
                row.note = f"{run_id}: recorded result reused, nothing trained"
    except StopRule as exc:
        record_stop(folder, exc, run=run.name, phase=phase)
        raise
    update_progress_artifact(
        artifact_id=progress.id, progress=100.0, description=_done_description(folder, run_id)
    )
    progress.live_tables(read_progress(folder.run_dir(run_id)) or {}, final=True)
    if (unsent := tracking_note(folder.run_dir(run_id))) is not None:
        get_run_logger().warning(unsent)
    return result, n_train_of(folder.run_dir(run_id), run=run, corpus=corpus)


@task(name="pilot", task_run_name="pilot[{run}]", **PHASE_OPTIONS)
@cancel_on_interrupt
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
    metrics = out_folder(out).run_dir(resolved.run_id) / METRICS_FILE
    rows = read_metrics(metrics) if metrics.is_file() else []
    losses = early_losses(rows, steps=spec.pilot.steps)
    return pilot_measures(resolved, result=result, n_train=n_train, losses=losses)


@task(name="train", task_run_name="train[{run_id}]", **PHASE_OPTIONS)
@cancel_on_interrupt
def train(
    spec: CampaignSpec, *, base_dir: str, out: str, run: str, run_id: str, lane: int = 0
) -> dict[str, Any]:
    """A full training run (control or variant) on its lane's GPU; resumes from its last good
    checkpoint."""
    resolved = spec.resolve_run(run)
    if run_id != resolved.run_id:
        raise ValueError(f"run_id {run_id} is not the ID of run '{run}' ({resolved.run_id})")
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
