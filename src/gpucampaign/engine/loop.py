"""One training run, top to bottom: setup, restore, save policy, the loop, the end.

One call of ``train_run``, as pseudocode::

    result.json there?  return it                 # a finished run is not trained again
    r = setup_run(); _restore(r)                  # the same seeded build; LATEST -> r.state
    r.saver = Checkpointer()                      # the policy: fixed, or from measured costs
    pilot already done here?  return it uncompleted
    _open_metrics                                 # the rows after the restored step dropped
    hooks = open_hooks                            # engine/registry.py, on a RunView; their
                                                  # states back from the checkpoint
    resume: inference after a cut?  _end(restart_inference)   # evaluate, keep that model
    TrainingMark.open; hooks.on_start             # in_progress.json; an interruption keeps it
    while step < target:                                            # _run_epoch
        batches = r.state.start_epoch(loader)     # the order re-drawn, consumed ones skipped
        for each batch left in the epoch, up to the target:
            _train_step                           # its row waits, the loss on the device
            step < quiet and no rows full?  on to the clock's and the stop's checks
            rows full?  _flush                    # hooks.on_train_rows (non_finite_loss)
            evaluate("val") at eval_every, else at the epoch's end; hooks.after_eval
              (futility: the control keeps its per-example scores; a variant may ask to stop)
            _save(step, last_step=step == target) # the saver decides if it is due; _flush first
            hooks due (a step of theirs, or the clock)?  hooks.wants_rows?  _flush;
              hooks.after_step                    # the live view; the lot's end
            stop requested?  _end(_interruption)
            something asked?  quiet = _quiet_until # the next step where something may be due
    _reach_target                                 # the pilot: its save durable, return it;
                                                  # the run's last step: final evals and
                                                  # model/ while the last save is written, wait
                                                  # for it, hooks.at_end, result.json
    finally: _close_rows: the rows written, hooks.on_close   # the tracker ends, the view stops

A hook never ends a run: an event returns a ``StopRequest`` and ``_end`` ends the run, one place
for every stop (a stop rule, futility, not learning, the lot's end, an interruption, a
non-finite loss, ``resume: inference``): it saves the step and waits until it is durable, reads
the checkpoint back, evaluates every split and writes ``model/`` and ``result.json``, each as
asked, records the end's row, then raises. Only this module writes a run's ``result.json`` and
``model/`` and saves at a run's end (``tests/engine/test_one_ending.py``).

The hooks (``engine/hooks.py``) are the stop rules, the MLflow tracker and the live view: the
loop calls them at those points and knows none of them by name. The loop fires every event
itself: each ``train`` row goes to them once its loss is fetched, before it is written
(``on_train_row``: ``non_finite_loss``), and every row written goes to them after (``on_rows``).

``train_run`` is the only entry point. It writes into the run folder ``OUT/runs/<run_id>/``:

- ``params.json``: the resolved config, run ID, planned steps (written at every start);
- ``metrics.jsonl``: a JSON row per event (``metrics.py``), one timeline (a resume drops rows);
- at completion ``model/`` (the reloadable model folder) and ``result.json`` (``RunResult``).

The corpus given is the loaded one, checked against the spec's pinned sha256: a table
``Corpus`` for the built-in recipes, a ``Pinned`` file or folder for the others. A call with
``stop_after_steps`` (the pilot) stops at that global step, checkpoints and returns with
``completed=False``; a later call resumes from that checkpoint. Neither that nor the GPU
``lane`` is in the config or the run ID. ``on_save`` is called after each committed save.

Checkpoints go to the ``Store`` under ``<run_id>/`` (``checkpoint/manager.py``); what they
hold is the run's ``TrainState`` (``checkpoint/trainstate.py``). The loop reaches the model,
data, loss and evaluation only through the run's ``Recipe`` (``recipe.py``; the built-in
``mlp`` and ``cnn`` are recipes too, in ``builtin/tabular.py``). The heap alive before the
steps is out of the garbage collector's walks while they run (``core.gcpause.heap_frozen``).

Determinism: python/numpy/torch seeded, a seeded DataLoader generator, a pinned thread
count; the checkpoint keeps the generator state from the TOP of the epoch, and a resume
re-draws that epoch's order and skips the consumed batches before restoring the global RNGs.
On CPU a resumed run is bit-identical to an uninterrupted one.

Host syncs: a step never waits for the device. Its loss stays there, its ``train`` row waits in
the ``MetricsLog`` (``defer``) and the waiting losses are fetched in one transfer when a record
needs them: every ``log_every_steps`` steps, when the live view is due (about twice a second),
before an evaluation or a checkpoint snapshot, at the end of the call and at a stop request.
The ``non_finite_loss`` rule checks them there (``engine/rules.py``): the stop names the first
non-finite step, and since a snapshot flushes first, no checkpoint ever holds a step after a
non-finite loss. A data-parallel run also checks the all-reduced loss of every step in
``_train_step``, before its backward pass: that check must precede the update on every rank.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any, NoReturn

import torch

from gpucampaign.checkpoint.manager import LoadedCheckpoint
from gpucampaign.checkpoint.trainstate import MODEL
from gpucampaign.config import CampaignSpec, ResolvedRun
from gpucampaign.config.parts import EVAL_SPLITS
from gpucampaign.core.files import atomic_write_bytes, json_bytes, sync_files
from gpucampaign.core.gcpause import heap_frozen
from gpucampaign.core.interrupt import PENDING, Interrupted
from gpucampaign.core.stoprules import NonFiniteLoss, NoUsableRestart, StopRule
from gpucampaign.engine.checkpointer import Checkpointer, SaveFn
from gpucampaign.engine.hooks import Ending, HookArgs, Hooks, ProgressFn, RunView, StopRequest
from gpucampaign.engine.inference_restart import (
    Interruption,
    TrainingMark,
    find_interruption,
    restart_inference,
)
from gpucampaign.engine.launch import launch
from gpucampaign.engine.outcome import evaluate, run_result, time_probes
from gpucampaign.engine.parts import close_loader
from gpucampaign.engine.process_group import Ranks
from gpucampaign.engine.registry import build_hooks
from gpucampaign.engine.save import save_model
from gpucampaign.engine.setup import LiveRun, RunJob, check_arguments, setup_run
from gpucampaign.folder.layout import RECIPE_ERROR_FILE, RunFolder
from gpucampaign.folder.metrics import MetricsLog
from gpucampaign.folder.runresult import RunResult, recorded_result, require_complete
from gpucampaign.recipe.contract import RecipeError, check_loss, raised_in_recipe, recipe_raised
from gpucampaign.recipe.runtime import batch_len
from gpucampaign.storage import Store

# Steps whose train rows may wait for one transfer of their losses (a GPU syncs once per flush).
LOG_EVERY_STEPS = 100


def _restore(r: LiveRun) -> LoadedCheckpoint | None:
    """Resume from LATEST when this run (same config hash) has a good checkpoint.

    The sampler's generator state and the global RNG states are applied at the top of the
    resumed epoch (``TrainState.start_epoch``).
    """
    t0 = time.perf_counter()
    ck, r.refused = r.manager.load_latest()
    if ck is not None:
        r.dist.check_resume(ck.meta)  # written by as many processes as this start has
    if ck is None and r.refused and r.spec.stop_rules.require_restart:
        raise NoUsableRestart(
            r.run_id, "checkpoints exist but none is usable: " + "; ".join(r.refused)
        )
    if ck is None:
        return None
    r.state.load_state_dict({MODEL: ck.model_state, **ck.train_state})
    r.restore_s = time.perf_counter() - t0
    r.resumed_from = ck.step
    return ck


def _open_metrics(r: LiveRun, *, restored: bool, log_every_steps: int = LOG_EVERY_STEPS) -> None:
    """Open ``metrics.jsonl`` for appending, dropping the rows after the restored step."""
    # Never flushed by itself: the loop flushes, handing each row to the hooks.
    r.mlog = MetricsLog(
        r.run_folder.metrics,
        every=log_every_steps,
        flush_when_full=False,
        through_step=r.state.global_step,
    )
    if restored:
        r.mlog.write(
            {
                "kind": "restore",
                "step": r.state.global_step,
                "restore_s": r.restore_s,
                "refused": r.refused,
            }
        )


def open_hooks(
    r: LiveRun, ck: LoadedCheckpoint | None, *, progress: ProgressFn | None, show_progress: bool
) -> Hooks:
    """The call's hooks (``engine/registry.py``), built once ``metrics.jsonl`` is open, on a
    read-only view of the run; each keyed hook takes back its state from the restored
    checkpoint, and the train state keeps theirs in every later one."""
    args = HookArgs(
        restored_meta=ck.meta if ck is not None else None,
        progress=progress,
        show_progress=show_progress,
    )
    hooks = build_hooks(RunView(r), args)
    hooks.load_state_dict(r.state.restored_hooks)
    r.state.hooks = hooks
    return hooks


# --- the rows -------------------------------------------------------------------------------------
def _flush(r: LiveRun, hooks: Hooks) -> None:
    """Fetch the waiting rows' losses (one transfer), hand each ``train`` row to the hooks
    before it is written, write them, and hand the hooks every row written since the last time.
    A stop asked at a row (``non_finite_loss``) keeps the rows before it and ends the run."""
    rows = r.mlog.fetch()
    if (stopped := hooks.on_train_rows(rows)) is not None:
        i, asked = stopped
        r.mlog.write_rows(rows[:i])
        _end(r, hooks, asked)
    r.mlog.write_rows(rows)
    _tell_rows(r, hooks)


def _tell_rows(r: LiveRun, hooks: Hooks) -> None:
    """Hand the hooks the rows written since the last time (``on_rows``: the tracker)."""
    written = r.mlog.take_written()
    if written:
        hooks.on_rows(written)


def _ask(r: LiveRun, hooks: Hooks, asked: StopRequest | None) -> None:
    """End the run when a hook asked for it. The rows written meanwhile reach the hooks at the
    next flush or at the end (nothing per step when nothing is written)."""
    if asked is not None:
        _end(r, hooks, asked)


def _save(r: LiveRun, hooks: Hooks, step: int, *, last_step: bool) -> None:
    """Checkpoint ``step`` when the saver says it is due: the waiting rows are checked and
    written first, so no checkpoint holds a step after a non-finite loss."""
    if r.saver.due(step, last_step=last_step):
        _flush(r, hooks)
        r.saver.submit(step)


# --- the loop ------------------------------------------------------------------------------------
def _recipe_failed(r: LiveRun, exc: RecipeError, *, method: str, step: int) -> RecipeError:
    """A recipe method that raised mid-training, as one paragraph: the step, the recipe's file
    and line, the exception; its traceback kept in the run's folder, and named."""
    cause = exc.__cause__
    if cause is None:  # a check of what it returned: its problem, with the step
        problem = str(exc).removeprefix(f"recipe '{r.config.recipe}', {method}(): ")
        return RecipeError(r.config.recipe, f"{method}()", f"{problem} (at step {step})")
    where, trace = raised_in_recipe(r.recipe, cause)
    kept = r.run_folder.path / RECIPE_ERROR_FILE
    atomic_write_bytes(kept, trace.encode("utf-8"))
    return RecipeError(
        r.config.recipe,
        f"{method}() at step {step}{where}",
        f"raised {type(cause).__name__}: {cause}; its traceback is in {kept}",
    )


def _train_step(r: LiveRun, batches: Iterator[Any]) -> StopRequest | None:
    """One optimizer step on the next batch; its ``train`` row waits in the log with the loss
    still on the device (no host sync here). A data-parallel run's non-finite loss asks to
    stop before the update."""
    t0 = time.perf_counter()
    s = r.state
    batch = next(batches)
    if r.copy_batch is not None:  # on CUDA: a side stream's copy (none when already there)
        batch = r.copy_batch(batch)
    lr = s.optimizer.param_groups[0]["lr"]
    dist = r.dist
    one_process = dist.world_size == 1
    # DistributedDataParallel when data-parallel (one process: the model, no call)
    model = s.model if one_process else dist.train_model(s.model)
    amp = r.autocast  # None in fp32: no context's two calls at every step
    # runtime.call_loss's work without its call (one less at every step): the recipe's loss,
    # a scalar tensor, else its check; what the recipe raised, worded as call_loss words it
    try:
        if amp is None:
            loss = r.recipe.loss(model, batch)
        else:
            with amp:
                loss = r.recipe.loss(model, batch)
        if type(loss) is not torch.Tensor or loss.ndim:
            loss = check_loss(r.resolved.config.recipe, loss)
    except RecipeError as exc:
        raise _recipe_failed(r, exc, method="loss", step=s.global_step + 1) from None
    except Exception as exc:
        failed = recipe_raised(r.resolved.config.recipe, "loss", exc)
        failed.__cause__ = exc
        raise _recipe_failed(r, failed, method="loss", step=s.global_step + 1) from None
    # batch_len's first case (a list of tensors: the built-in recipes') without its call
    first = batch[0] if type(batch) is list and batch else None
    n = first.shape[0] if type(first) is torch.Tensor and first.ndim else batch_len(batch)
    logged = loss  # fetched with the other waiting rows' losses, when a record needs them
    if not one_process:
        # Over all ranks, before the backward pass: one all-reduce of the loss, the rows and
        # the stop flag, so a non-finite loss on one rank stops every one. This syncs at every
        # step; the ranks must agree anyway.
        loss_value, n = r.dist.step_totals(loss, n)
        if not math.isfinite(loss_value) and r.spec.stop_rules.non_finite_loss:
            stop = NonFiniteLoss(
                r.run_id,
                f"training loss is {loss_value} at step {s.global_step + 1} "
                f"(epoch {s.epoch}, lr {lr:g}); the step was not applied",
                step=s.global_step + 1,
            )
            return StopRequest.of(stop, save=False)
        logged = torch.tensor(loss_value, dtype=torch.float64)
    s.optimizer.zero_grad(set_to_none=True)
    # fp16 (under autocast): the loss scaled, the step skipped on an overflow
    if amp is not None and s.scaler.is_enabled():
        s.scaler.scale(loss).backward()
        s.scaler.step(s.optimizer)
        s.scaler.update()
    else:  # what the disabled scaler's calls come to
        loss.backward()
        s.optimizer.step()
    if s.scheduler is not None:
        s.scheduler.step()
    s.global_step += 1
    s.batch_in_epoch += 1
    s.samples_seen += n
    step_s = time.perf_counter() - t0
    r.step_times.append(step_s)
    s.steps_s_sum += step_s
    row = {
        "kind": "train",
        "step": s.global_step,
        "epoch": s.epoch,
        "lr": lr,
        "step_s": step_s,
        "samples_per_s": n / step_s if step_s > 0 else None,
    }
    r.mlog.defer_value(row, "loss", logged)
    return None


def _run_epoch(r: LiveRun, hooks: Hooks) -> None:
    """Train the rest of the current epoch, or up to the target step.

    At most steps nothing but the step is due: no evaluation, no save, no hook, no flush. The
    step from which something may be (``quiet``, see ``_quiet_until``) is found after each
    step where something was asked, so the others cost a compare, a clock read (a hook may be
    due by the clock) and the stop flag."""
    s = r.state
    with r.rng.held():  # the run's own global generators (other runs may train in this process)
        batches = s.start_epoch(r.loader)
    every = r.config.eval_every
    per_epoch = r.steps_per_epoch
    rng, mlog, dist = r.rng, r.mlog, r.dist
    lock = rng.lock
    clock = time.monotonic
    pending = PENDING if dist.world_size == 1 else None
    quiet = 0  # the first step at which more than the step may be due
    while s.batch_in_epoch < per_epoch:
        with lock:  # the RNG slot's lock (a built-in's enter and exit: no call of ours)
            if not rng.owned:  # another run of this process drew meanwhile: ours back
                rng.take()
            if (asked := _train_step(r, batches)) is not None:
                _end(r, hooks, asked)
            step = s.global_step
            if busy := step >= quiet or mlog.full:
                _events(r, hooks, step, every=every, per_epoch=per_epoch)
        if (busy or clock() >= hooks.ask_time) and hooks.due(step):
            # only the steps a hook needs (the live view's, the lot's end)
            busy = True
            if hooks.wants_rows(step):  # the live view, when due, shows the last loss
                _flush(r, hooks)
            _ask(r, hooks, hooks.after_step(step))
        # One process reads the request itself (no call); the ranks agree on theirs.
        if (reason := pending.reason if pending else dist.stop_requested()) is not None:
            _end(r, hooks, _interruption(reason))
        if step >= r.target:
            break
        if busy:  # a hook asked at every step (the lot's deadline) leaves nothing to find
            ask = hooks.ask_step
            quiet = (
                ask
                if ask <= step + 1
                else _quiet_until(r, hooks, step, every=every, per_epoch=per_epoch)
            )
    if s.batch_in_epoch == per_epoch:
        s.epoch += 1


def _events(r: LiveRun, hooks: Hooks, step: int, *, every: int, per_epoch: int) -> None:
    """What may be due after ``step``, in the run's RNG slot: a full log's flush, the
    evaluation, the save (its snapshot holds this run's RNG); a pilot's mark."""
    if step == r.mark_step:
        r.take_mark()
    if r.mlog.full:
        _flush(r, hooks)
    if (every and step % every == 0) or (not every and r.state.batch_in_epoch == per_epoch):
        _flush(r, hooks)  # a non-finite loss stops the run before its evaluation
        evaluated = evaluate(r, "val", final=False)
        if evaluated is not None:
            r.last_eval = (step, evaluated)
            # futility: the control records, a variant may ask to stop (timed: a look's cost)
            t0 = time.perf_counter()
            asked = hooks.after_eval(evaluated)
            r.looks += 1
            r.look_s += time.perf_counter() - t0
            _ask(r, hooks, asked)
    _save(r, hooks, step, last_step=step == r.target)


def _quiet_until(r: LiveRun, hooks: Hooks, step: int, *, every: int, per_epoch: int) -> int:
    """The first step after ``step`` at which ``_events`` or a hook may have something to do
    (a full log is seen at every step, a hook due by the clock too): the next evaluation (at
    ``eval_every``, else the epoch's end), the saver's next check, a hook's next step, the
    call's target (its last save), a pilot's mark."""
    s = r.state
    evaluation = step - step % every + every if every else step + per_epoch - s.batch_in_epoch
    mark = r.mark_step if r.mark_step > step else r.target
    return min(evaluation, r.saver.quiet_until(step), hooks.ask_step, r.target, mark)


def _interruption(reason: str) -> StopRequest:
    """A stop was requested (SIGINT, SIGTERM): the step reached is saved, then ``Interrupted``."""
    return StopRequest(
        stop=lambda e: Interrupted(reason, step=e.step),
        row=lambda e: {"kind": "interrupt", "step": e.step, "reason": reason},
    )


# --- the end: one place, whatever ended the call --------------------------------------------------
def _end(r: LiveRun, hooks: Hooks, asked: StopRequest) -> NoReturn:
    """End the run at the step reached, as a hook (or the loop) asked: the step saved and
    durable, the checkpoint read back, the model reached kept as evidence with ``result.json``
    (each when asked), the end's row recorded, then the stop raised.

    Raises:
        StopRule | Interrupted: The stop the request words, always.
    """
    step = r.state.global_step
    _flush(r, hooks)  # a non-finite loss among the waiting rows is the first fault
    if asked.save:
        with r.rng.held():
            _save(r, hooks, step, last_step=True)
        r.saver.wait()  # written and recorded (the timeline's heartbeat) before stopping
    read_back = None
    kept = asked.save or r.resumed_from is not None
    if asked.read_back_s is not None and r.dist.is_main and kept:
        read_back = r.saver.read_back(step, timeout_s=asked.read_back_s)
    ending = Ending(step=step, saved=asked.save, read_back=read_back)
    stop = asked.stop(ending)
    result = None
    if asked.keep_model:
        eval_metrics = _final_evaluations(r)
        metrics = eval_metrics.get(r.spec.decision_split, {})
        save_model(r, metrics)
        record = stop.to_record() if isinstance(stop, StopRule) else None
        result = run_result(
            r,
            completed=False,
            metrics=metrics,
            eval_metrics=eval_metrics,
            train_s=sum(r.step_times),
            stop=record,
        )
        result.interrupted = asked.interrupted
    if (row := asked.row(ending)) is not None:
        r.mlog.write(row)
    r.mlog.sync()
    if result is not None:
        _write_result(r, result)
    _tell_rows(r, hooks)
    raise stop


def _final_evaluations(r: LiveRun) -> dict[str, dict[str, float]]:
    """Every evaluation split at the step reached (rank 0's; the others get none)."""
    return {s: m for s in EVAL_SPLITS if (m := evaluate(r, s, final=True)) is not None}


def _write_result(r: LiveRun, result: RunResult) -> None:
    """``result.json``: written last, once the checkpoint is durable and the rows synced."""
    atomic_write_bytes(r.run_folder.result, json_bytes(result.to_dict()))
    if result.interrupted is not None:  # resume: inference recorded the cut: nothing trains
        r.run_folder.in_progress.unlink(missing_ok=True)


def _last_save(r: LiveRun, hooks: Hooks, *, since: float) -> None:
    """Wait for the call's last save to be durable; the wait is measured apart from training
    (``final_save_s``: what the end of the call stalled on it, after any overlapped work)."""
    t0 = time.perf_counter()
    r.saver.wait()
    r.final_save_s = time.perf_counter() - max(t0, since)
    hooks.after_train()


def _reach_target(r: LiveRun, hooks: Hooks, *, train_s: float, t_trained: float) -> RunResult:
    """The call reached its target: a pilot's returns uncompleted once its save is durable; the
    run's last step gets its final evaluations and model folder (while the last save is written
    in the background), the hooks' ``at_end`` (the quality floor), then ``result.json``: the
    checkpoint is durable before anything that says the run completed.

    Raises:
        StopRule: The first stop ``at_end`` returned, after everything is written
            (``BelowThreshold``: the final metric misses the floor).
    """
    _flush(r, hooks)
    step = r.state.global_step
    if step < r.planned:  # the pilot's stop: a later call continues the same run
        _last_save(r, hooks, since=t_trained)
        if r.probe_eval:  # what the re-forecast needs that the pilot's steps did not time
            time_probes(r)
        _tell_rows(r, hooks)
        return run_result(r, completed=False, train_s=train_s)
    require_complete(r.run_id, steps_done=step, planned_steps=r.planned)
    # The final save's write (and upload) overlaps the evaluation and the model folder's
    # write: its snapshot was taken at the save, and neither changes the model. A model
    # folder without result.json says nothing: a restart trains from the checkpoint again.
    eval_metrics = _final_evaluations(r)
    if not r.dist.is_main:  # data-parallel: rank 0 evaluates, writes the model and the result
        _last_save(r, hooks, since=t_trained)
        return run_result(r, completed=True, train_s=train_s)
    metrics = eval_metrics.get(r.spec.decision_split, {})
    save_model(r, metrics)
    _last_save(r, hooks, since=t_trained)
    saves = r.saver.saves
    # The last step always saves (target == planned here), unless it was restored as is.
    assert (saves and saves[-1].step == step) or r.resumed_from == step
    # The floor is a decision, so it reads the selection split: the report split decides nothing.
    selected = eval_metrics.get(r.spec.selection_split, metrics)
    stop = hooks.at_end(selected)
    res = run_result(
        r,
        completed=True,
        metrics=metrics,
        eval_metrics=eval_metrics,
        train_s=train_s,
        stop=stop.to_record() if stop else None,
    )
    r.mlog.sync()
    _write_result(r, res)
    _tell_rows(r, hooks)
    if stop is not None:
        raise stop
    return res


# --- the run ---------------------------------------------------------------------------------
def train_run(
    spec: CampaignSpec,
    *,
    run: ResolvedRun,
    corpus: Any,
    store: Store,
    run_folder: RunFolder,
    stop_after_steps: int | None = None,
    checkpoint_every: int | None = None,
    progress: ProgressFn | None = None,
    show_progress: bool = False,
    on_save: SaveFn | None = None,
    lane: int = 0,
    dist: Ranks | None = None,
    log_every_steps: int = LOG_EVERY_STEPS,
    probe_eval: bool = False,
) -> RunResult:
    """Train (or resume, or return the recorded result of) one run of the campaign.

    Args:
        spec: The campaign spec.
        run: The run (``CampaignSpec.resolve_run``): its config and ID, resolved once.
        corpus: The loaded corpus, the pinned one (see the module docstring).
        store: Checkpoint store; ``<run_id>/LATEST`` there is resumed from when valid.
        run_folder: The run's folder (``OutputFolder.run``: ``OUT/runs/<run_id>/``), made here.
        stop_after_steps: Pilot mode: stop at this step, checkpoint, return uncompleted.
        checkpoint_every: Fixed save interval in steps (overrides the spec and the measure).
        progress: Called every ~2% of the run with the live record (``live_record``: run_id,
            step, planned_steps, loss, the last evaluation, eta_s, ...), epoch, lr, fraction.
        show_progress: Show a rich progress bar when stderr is a terminal.
        on_save: Called with ``{run_id, step, planned_steps, save_s, key}`` after each save.
        lane: The plan's GPU lane running this call (``devices.pick_device``).
        dist: This process's rank of a data-parallel run (``worker.py`` passes it).
            Without it, a run of more than one process is launched here on this machine
            (``launch.launch``), which returns rank 0's result.
        log_every_steps: At most this many steps' ``train`` rows wait for their losses
            (see the module docstring: the host syncs only when a record needs them).
        probe_eval: With ``stop_after_steps`` (the pilot): when its steps held no evaluation,
            time one after its last save, writing no row (``timings.probe_eval_s``); and a
            read of that save, as the resuming call reads it (``timings.probe_restore_s``).

    Returns:
        The ``RunResult`` (``completed`` False after a pilot stop).

    Raises:
        StopRule: ``NonFiniteLoss``, ``BelowThreshold`` (after the model is saved),
            ``Futile`` (a variant that cannot win, after its model is saved: ``futility``),
            ``EssentialInputMissing``, ``NoUsableRestart``, ``IncompleteRun``, and
            ``InterruptedRun`` (``resume: inference`` after a cut: see ``inference_restart``).
        Interrupted: A stop was requested (SIGINT, SIGTERM): the step reached is saved first.
        SpecError: Invalid arguments or an unsupported precision on this device.
    """
    t_call = time.perf_counter()
    job = RunJob(
        spec=spec,
        run=run,
        corpus=corpus,
        store=store,
        run_folder=run_folder,
        stop_after_steps=stop_after_steps,
        checkpoint_every=checkpoint_every,
        lane=lane,
        probe_eval=probe_eval,
    )
    check_arguments(job)
    run_folder.create()
    recorded = recorded_result(run_folder)
    if recorded is not None:
        return recorded
    if dist is None and run.size.processes > 1:
        return launch(job, progress=progress, on_save=on_save)
    r = setup_run(job, t_call=t_call, dist=dist)
    ck = _restore(r)
    r.saver = Checkpointer(
        r,
        restored_meta=ck.meta if ck is not None else None,
        checkpoint_every=checkpoint_every,
        on_save=on_save,
    )
    if ck is not None and r.state.global_step >= r.target and r.target < r.planned:
        # The pilot already ran, maybe on another host into another folder (resumed from S3):
        # nothing trains here, so its costs are the ones the checkpoint measured.
        return run_result(r, completed=False, measured=ck.meta)
    cut = find_interruption(
        run_folder, resume=r.config.resume, checkpoint_step=r.resumed_from, planned_steps=r.planned
    )
    _open_metrics(r, restored=ck is not None, log_every_steps=log_every_steps)
    hooks = open_hooks(r, ck, progress=progress, show_progress=show_progress)
    with heap_frozen():  # a full collection in the steps walks only what the call makes
        return _train(r, hooks, cut=cut)


def _train(r: LiveRun, hooks: Hooks, *, cut: Interruption | None) -> RunResult:
    """Run the loop up to the target step; finish the run when that is its last step."""
    s = r.state
    mark = None
    r.t_loop = t_loop = time.perf_counter()
    try:
        if cut is not None:  # resume: inference after a cut: nothing trains
            _end(r, hooks, restart_inference(r, cut))
        mark = TrainingMark.open(r.run_folder, from_step=s.global_step, target=r.target)
        _ask(r, hooks, hooks.on_start())
        r.loop_start_s = time.perf_counter() - t_loop
        while s.global_step < r.target:
            _run_epoch(r, hooks)
        if r.marks_at:  # a pilot's last mark, at its end (plan.reforecast._loop_split)
            r.take_mark()
        t_trained = time.perf_counter()
        # Measured apart: the training is the steps; the wait for the last save is a cost of
        # the end of the call, not of each step. The last save is durable before it returns.
        return _reach_target(r, hooks, train_s=t_trained - t_loop, t_trained=t_trained)
    finally:
        try:
            _close_rows(r, hooks)
        finally:
            if mark is not None:
                mark.close()  # kept only when a stop request interrupts the call
            r.saver.close()
            close_loader(r.loader)


def _close_rows(r: LiveRun, hooks: Hooks) -> None:
    """The end of every call: the rows of the steps applied written (a non-finite loss among
    them ends the run: it is the first fault), then every hook's ``on_close`` (the tracker ends
    its run, the live view says stopped)."""
    try:
        if not r.mlog.closed:
            _flush(r, hooks)
    finally:
        r.mlog.close()
        sync_files(r.unsynced)
        _tell_rows(r, hooks)
        hooks.on_close()
