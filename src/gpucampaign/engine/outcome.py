"""What one call of a run produced: an evaluation row, and the ``RunResult`` of the call.

Shared by the training loop and the inference restart (``resume: inference``).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from gpucampaign.engine.futility import look_costs
from gpucampaign.engine.setup import LiveRun
from gpucampaign.folder.runresult import RunResult
from gpucampaign.plan.lots import this_machine
from gpucampaign.plan.stopping import futility_role
from gpucampaign.recipe.contract import has_score
from gpucampaign.recipe.runtime import evaluate_split, score_split


def evaluate(r: LiveRun, split: str, *, final: bool) -> dict[str, float] | None:
    """Evaluate on ``split`` and log an ``eval`` row; None when the split is empty.

    Data-parallel: rank 0 evaluates the whole split (exact, the same numbers as one
    process would get from these weights); the other ranks return None.
    """
    if not r.dist.is_main:
        return None
    dataset = r.split(split)
    if dataset is None or len(dataset) == 0:
        return None
    metrics, seconds = _timed_evaluation(r, dataset)
    r.eval_times.append(seconds)
    r.mlog.write(
        {
            "kind": "eval",
            "step": r.state.global_step,
            "epoch": r.state.epoch,
            "split": split,
            **metrics,
            "eval_s": r.eval_times[-1],
            "final": final,
        }
    )
    return metrics


def time_probes(r: LiveRun) -> None:
    """What a pilot times after its last save for the re-forecast: an evaluation when its
    steps held none, the restore of the call that resumes from that save, the scores futility
    asks for at the training's evaluations and the looks at them."""
    if not r.eval_times:
        time_evaluation(r)
    time_restore(r)
    time_looks(r)


def time_evaluation(r: LiveRun, split: str = "val") -> None:
    """Time one evaluation of ``split`` that records nothing (``probe_eval_s``): a pilot whose
    few steps held none measures what each of the run's evaluations will cost, for the
    re-forecast. After the pilot's last save: its checkpoint holds the generators' states
    from before, so the run's training is the same with or without it."""
    dataset = r.split(split)
    if not r.dist.is_main or dataset is None or len(dataset) == 0:
        return
    _, r.probe_eval_s = _timed_evaluation(r, dataset)


def time_restore(r: LiveRun) -> None:
    """Time a read of the checkpoint the pilot just saved (``probe_restore_s``), as the call
    that resumes the run reads it (``CheckpointManager.load_latest``, the one ``_restore``
    calls): the re-forecast adds it to that call's time outside the loop. Nothing is applied:
    the state is the one saved."""
    t0 = time.perf_counter()
    ck, _ = r.manager.load_latest()
    if ck is not None:
        r.probe_restore_s = time.perf_counter() - t0


def time_looks(r: LiveRun) -> None:
    """Time futility's looks at the evaluations of the training calls when the campaign's
    rule will ask for them (``plan.stopping.futility_role``: the control records, a variant
    checks; neither in its pilot): the per-example scores of the selection split,
    then the control's record of them (``probe_record_s``) and a variant's look at such a
    record (``probe_check_s``), each with the scores; the whole probe in ``probe_looks_s``.
    Nothing of the run is recorded; like ``time_evaluation``, after the last save."""
    spec, rule = r.spec, r.spec.decision_rule
    # The role of the run's training calls (``plan.stopping.futility_role``), not the pilot's
    if not r.dist.is_main or rule is None or futility_role(spec, run=r.run)[0] == "off":
        return
    if not has_score(r.recipe):
        return
    dataset = r.split(spec.selection_split)
    if dataset is None or len(dataset) == 0:
        return
    t0 = time.perf_counter()
    # Twice, the second kept: the first after the save pays for what is cold (caches, code
    # paths), which the training call's looks, one an evaluation, do not (the demo: its
    # records and checks were over-forecast by a quarter from a single cold probe). The kept
    # one after an evaluation, as a call's look follows one: timed back to back, the scores
    # ran 0.85x a call's (two demos, medians: 1.14 ms in the probes, 1.29-1.34 ms in the
    # calls). The cold one needs none: its time is dropped, and an evaluation is a pass over
    # the split, as long as the scores on a real model.
    for kept in (False, True):
        if kept:
            _timed_evaluation(r, dataset)
        t1 = time.perf_counter()
        ids, columns = score_split(
            r.recipe, r.state.model, dataset, config=r.config, device=r.device
        )
        scores_s = time.perf_counter() - t1
    if rule.metric in columns:  # else the hook says why no look is made, and none is priced
        record_s, check_s = look_costs(
            ids=list(ids),
            values=list(columns[rule.metric]),
            step=r.state.global_step,
            planned=r.planned,
            metric=rule.metric,
            split=spec.selection_split,
            direction=rule.direction,
            min_gain=rule.min_gain,
        )
        r.probe_record_s, r.probe_check_s = scores_s + record_s, scores_s + check_s
    r.probe_looks_s = time.perf_counter() - t0


def _timed_evaluation(r: LiveRun, dataset: Any) -> tuple[dict[str, Any], float]:
    """One evaluation of ``dataset``: its metrics and its seconds."""
    t0 = time.perf_counter()
    rule = r.spec.decision_rule
    # Inside the run's RNG slot: a DataLoader's iterator draws its base seed from torch's
    # global generator, which a run training in another lane of this process checkpoints.
    with r.rng.held():
        metrics = evaluate_split(
            r.recipe,
            r.state.model,
            dataset,
            config=r.config,
            device=r.device,
            need=rule.metric if rule else None,
        )
    return metrics, time.perf_counter() - t0


def _costs_of_checkpoint(meta: dict[str, Any]) -> dict[str, Any]:
    """Step time and save cost as a checkpoint's meta recorded them (absent ones left out)."""
    costs: dict[str, Any] = {}
    if isinstance(meta.get("step_s"), int | float):
        costs["step_s"] = float(meta["step_s"])
    write_s, upload_s = meta.get("write_s"), meta.get("upload_s")
    if isinstance(write_s, int | float) and isinstance(upload_s, int | float):
        costs.update(save_s=[write_s + upload_s], write_s=[write_s], upload_s=[upload_s])
    if isinstance(meta.get("stall_s"), int | float):
        costs["stall_s"] = [float(meta["stall_s"])]
    return costs


def run_result(
    r: LiveRun,
    *,
    completed: bool,
    metrics: dict[str, float] | None = None,
    eval_metrics: dict[str, dict[str, float]] | None = None,
    train_s: float = 0.0,
    stop: dict[str, Any] | None = None,
    measured: dict[str, Any] | None = None,
) -> RunResult:
    """The ``RunResult`` of this call so far.

    ``measured``: the restored checkpoint's meta, for a call that trained nothing; its step
    time and save cost stand in for the ones this call could not measure.
    """
    saves, interval = r.saver.saves, r.saver.policy.interval
    timings = {
        "load_s": r.corpus.load_s + r.setup_s,
        "setup_s": r.setup_s,
        "corpus_load_s": r.corpus.load_s,
        "step_s": r.step_s(),
        "steps_s_sum": r.state.steps_s_sum,
        "eval_s": r.eval_times,
        "save_s": [s.save_s for s in saves],
        "stall_s": r.saver.stalls,
        "write_s": [s.write_s for s in saves],
        "upload_s": [s.upload_s for s in saves],
        "restore_s": r.restore_s,
        "train_s": train_s,  # the loop's steps, without the wait for the last save
        "loop_start_s": r.loop_start_s,  # of train_s: before the call's first step
        "reports": r.reports,  # of train_s: the live view's reports, and their seconds
        "report_s": r.report_s,
        "looks": r.looks,  # of train_s: the hooks' looks after evaluations, and their seconds
        "look_s": r.look_s,
        "marks": r.marks,  # a pilot's: its loop's counters (plan.reforecast.pilot_marks), its end
        "final_save_s": r.final_save_s,
        "probe_eval_s": r.probe_eval_s,  # of total_s, after the loop: a pilot's, when timed
        "probe_restore_s": r.probe_restore_s,  # of total_s, after the loop: a pilot's
        "probe_looks_s": r.probe_looks_s,  # of total_s, after the loop: a pilot's
        "probe_record_s": r.probe_record_s,  # of probe_looks_s: a record's, a check's
        "probe_check_s": r.probe_check_s,
        "total_s": time.perf_counter() - r.t_call,
    }
    if measured is not None and not r.step_times and not saves:
        timings.update(_costs_of_checkpoint(measured))
    # Who wrote it; the wall clock, not the campaign's (see folder.segments: no deadline).
    machine = this_machine(r.spec, now=datetime.now(UTC), env=os.environ)
    return RunResult(
        run_id=r.run_id,
        run=r.run,
        completed=completed,
        steps_done=r.state.global_step,
        planned_steps=r.planned,
        metrics=metrics or {},
        eval_metrics=eval_metrics or {},
        timings=timings,
        n_checkpoints=len(saves),
        checkpoint_every=interval.every_steps,
        save_interval=asdict(interval),
        resumed_from_step=r.resumed_from,
        refused_checkpoints=r.refused,
        stop=stop,
        device=r.device.type,
        threads=r.config.threads,
        precision=r.config.precision,
        lot=machine.lot,
        host=machine.host,
        worker=machine.worker,
    )
