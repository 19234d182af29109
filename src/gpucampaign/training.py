"""One training run, top to bottom: setup, restore, save policy, the loop, finish.

``train_run`` is the only entry point. It writes into the run folder ``OUT/runs/<run_id>/``:

- ``params.json``: the resolved config, run ID, planned steps (written at every start);
- ``metrics.jsonl``: one JSON row per event (see ``metrics.py``); on resume, rows after the
  restored step are dropped, so the file always tells one timeline;
- at completion ``model/`` (the reloadable model folder) and ``result.json`` (``RunResult``).

Checkpoints go to the ``Store`` under ``<run_id>/`` (see ``checkpoint.py``). The loop reaches
the model, data, loss and evaluation only through the run's ``Recipe`` (``recipe.py``; the
built-in ``mlp`` and ``cnn`` are recipes too, in ``recipes/tabular.py``).

Determinism: python/numpy/torch seeded, a seeded DataLoader generator, a pinned thread
count; the checkpoint keeps the generator state from the TOP of the epoch, and a resume
re-draws that epoch's order and skips the consumed batches before restoring the global RNGs.
On CPU a resumed run is bit-identical to an uninterrupted one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from gpucampaign.checkpoint import (
    BackgroundSaves,
    CheckpointManager,
    LoadedCheckpoint,
    SavedCheckpoint,
    restore_rng,
)
from gpucampaign.files import atomic_write_bytes, json_bytes, median
from gpucampaign.interrupt import Interrupted, stop_requested
from gpucampaign.loopparts import make_loader, n_train_of, progress_bar, read_params  # noqa: F401
from gpucampaign.metrics import MetricsLog, truncate_metrics
from gpucampaign.recipe import Recipe, RecipeContext, call, check_loss, load_recipe
from gpucampaign.recipe_runtime import (
    batch_len,
    build_datasets,
    evaluate_split,
    recipe_context,
    recipe_record,
    to_device,
)
from gpucampaign.runresult import RESULT_FILE, RunResult, recorded_result, require_complete
from gpucampaign.savepolicy import SavePolicy
from gpucampaign.spec import CampaignSpec, RunConfig, SpecError
from gpucampaign.stoprules import (
    BelowThreshold,
    EssentialInputMissing,
    NonFiniteLoss,
    NoUsableRestart,
)
from gpucampaign.storage import Store
from gpucampaign.torchsetup import (
    AMP_DTYPES,
    GLOBAL_RNG_LOCK,
    build_optimizer,
    build_scheduler,
    check_precision,
    device_settings,
    pick_device,
    seed_everything,
)
from gpucampaign.training_files import METRICS_FILE, MODEL_DIR, PARAMS_FILE  # noqa: F401
from gpucampaign.trainsave import collect_save, save_checkpoint, save_model

EVAL_SPLITS: tuple[str, ...] = ("val", "test")

ProgressFn = Callable[[dict[str, Any]], None]
SaveFn = Callable[[dict[str, Any]], None]


def run_config_sha256(spec: CampaignSpec, run: str) -> str:
    """Full sha256 over the same payload as the run ID (config, pinned corpus, recipe file)."""
    return spec.run_sha256(run)


# --- one start of a run -----------------------------------------------------------------------
@dataclass
class _Run:
    """What one start of a run builds, and the cursor and counters its loop moves."""

    spec: CampaignSpec
    run: str
    run_id: str
    config: RunConfig
    config_sha256: str
    corpus: Any
    out_dir: Path
    t_call: float
    device: torch.device
    recipe: Recipe
    ctx: RecipeContext
    datasets: dict[str, Any]
    described: dict[str, Any]
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    scaler: torch.amp.GradScaler
    autocast: AbstractContextManager
    generator: torch.Generator
    loader: DataLoader
    planned: int
    target: int
    manager: CheckpointManager
    setup_s: float = 0.0
    # The data cursor and counters; a checkpoint holds them.
    global_step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    epoch_gen_state: torch.Tensor | None = None
    samples_seen: int = 0
    steps_s_sum: float = 0.0
    # Set by a restore; the loop applies them at the top of the resumed epoch.
    resume_gen_state: torch.Tensor | None = None
    pending_rng: dict[str, Any] | None = None
    # What the restore found.
    restore_s: float = 0.0
    resumed_from: int | None = None
    refused: list[str] = field(default_factory=list)
    # Measurements and the save policy.
    step_times: list[float] = field(default_factory=list)
    eval_times: list[float] = field(default_factory=list)
    saves: list[SavedCheckpoint] = field(default_factory=list)
    stalls: list[float] = field(default_factory=list)  # per save, in the loop's time
    saver: BackgroundSaves = field(default_factory=BackgroundSaves)
    policy: SavePolicy | None = None
    mlog: MetricsLog | None = None
    on_save: SaveFn | None = None

    @property
    def steps_per_epoch(self) -> int:
        return len(self.loader)

    def step_s(self) -> float | None:
        """Median step time, without the first step (warm-up) when there are others."""
        return median(self.step_times[1:] or self.step_times)


def _check_arguments(
    spec: CampaignSpec,
    *,
    run: str,
    corpus: Any,
    stop_after_steps: int | None,
    checkpoint_every: int | None,
) -> str:
    """The run ID, once the arguments and the corpus are checked."""
    spec.run_config(run)
    run_id = spec.run_id(run)
    if stop_after_steps is not None and stop_after_steps < 1:
        raise SpecError(
            f"stop_after_steps must be >= 1 (got {stop_after_steps}).", field="stop_after_steps"
        )
    if checkpoint_every is not None and checkpoint_every < 1:
        raise SpecError(
            f"checkpoint_every must be >= 1 (got {checkpoint_every}).", field="checkpoint_every"
        )
    if spec.corpus is not None and corpus.sha256 != spec.corpus.sha256:
        raise EssentialInputMissing(
            run_id,
            f"the corpus given has sha256 {corpus.sha256}, the spec pins {spec.corpus.sha256}",
        )
    return run_id


def _setup(
    spec: CampaignSpec,
    *,
    run: str,
    corpus: Any,
    store: Store,
    out_dir: Path,
    stop_after_steps: int | None,
    t_call: float,
    lane: int = 0,
) -> _Run:
    """Build everything in the same order on every start, resumed or not."""
    config = spec.run_config(run)
    run_id = spec.run_id(run)
    config_sha = run_config_sha256(spec, run)
    device = pick_device(config.device, lane=lane)
    check_precision(config.precision, device)
    torch.set_num_threads(config.threads)
    recipe = load_recipe(config.recipe)
    ctx = recipe_context(config, corpus=corpus, run_id=run_id, device=device)
    with GLOBAL_RNG_LOCK:
        seed_everything(config.seed)
        datasets = build_datasets(recipe, config, ctx)
        model = call(config.recipe, "model", recipe.model, ctx)
    model.to(device).train()
    optimizer = build_optimizer(config, model.parameters())
    generator = torch.Generator().manual_seed(config.seed)
    train = datasets["train"]
    loader = make_loader(
        train, config=config, generator=generator, device=device, collate_fn=recipe.collate_fn
    )
    planned = config.planned_steps(len(train))
    amp_dtype = AMP_DTYPES[config.precision]
    r = _Run(
        spec=spec,
        run=run,
        run_id=run_id,
        config=config,
        config_sha256=config_sha,
        corpus=corpus,
        out_dir=out_dir,
        t_call=t_call,
        device=device,
        recipe=recipe,
        ctx=ctx,
        datasets=datasets,
        described=call(config.recipe, "describe", recipe.describe, ctx, datasets),
        model=model,
        optimizer=optimizer,
        scheduler=build_scheduler(config, optimizer, planned_steps=planned),
        scaler=torch.amp.GradScaler(device.type, enabled=config.precision == "fp16"),
        autocast=(
            torch.autocast(device.type, dtype=amp_dtype) if amp_dtype is not None else nullcontext()
        ),
        generator=generator,
        loader=loader,
        planned=planned,
        target=planned if stop_after_steps is None else min(stop_after_steps, planned),
        manager=CheckpointManager(
            store,
            run_id=run_id,
            config_sha256=config_sha,
            keep=spec.checkpoint.keep,
            staging_dir=out_dir / ".staging",
        ),
    )
    _write_params(r)
    r.setup_s = time.perf_counter() - t_call
    return r


def _write_params(r: _Run) -> None:
    """``params.json``: what this start of the run is (rewritten at every start)."""
    spec = r.spec
    params = {
        "run_id": r.run_id,
        "run": r.run,
        "tier": spec.tier_of(r.run),
        "config": r.config.model_dump(mode="json"),
        "config_sha256": r.config_sha256,
        "corpus_sha256": r.corpus.sha256,
        "planned_steps": r.planned,
        "steps_per_epoch": r.steps_per_epoch,
        "n_train": len(r.datasets["train"]),
        **recipe_record(r.config),
        **r.described,
        **device_settings(r.device),
        "threads": r.config.threads,
        "torch": torch.__version__,
        "decision_rule": (
            spec.decision_rule.model_dump(mode="json") if spec.decision_rule else None
        ),
        "stop_rules": spec.stop_rules.model_dump(mode="json"),
    }
    atomic_write_bytes(r.out_dir / PARAMS_FILE, json_bytes(params))


def _restore(r: _Run) -> LoadedCheckpoint | None:
    """Resume from LATEST when this run (same config hash) has a good checkpoint.

    The global RNG states are kept in ``pending_rng`` and the epoch's sampler state in
    ``resume_gen_state``: the loop applies them at the top of the resumed epoch.
    """
    t0 = time.perf_counter()
    ck, r.refused = r.manager.load_latest()
    if ck is None and r.refused and r.spec.stop_rules.require_restart:
        raise NoUsableRestart(
            r.run_id, "checkpoints exist but none is usable: " + "; ".join(r.refused)
        )
    if ck is None:
        return None
    state = ck.train_state
    r.model.load_state_dict(ck.model_state, strict=True)
    r.optimizer.load_state_dict(state["optimizer"])
    if r.scheduler is not None:
        r.scheduler.load_state_dict(state["scheduler"])
    if state["scaler"]:
        r.scaler.load_state_dict(state["scaler"])
    if state.get("recipe"):
        r.recipe.load_state_dict(state["recipe"])
    cursor, counters = state["cursor"], state["counters"]
    r.global_step, r.epoch = int(counters["global_step"]), int(cursor["epoch"])
    r.batch_in_epoch = int(cursor["batch_in_epoch"])
    r.resume_gen_state = cursor["epoch_generator_state"]
    r.samples_seen = int(counters.get("samples_seen", 0))
    r.steps_s_sum = float(counters.get("steps_s_sum", 0.0))
    r.pending_rng = state["rng"]
    r.restore_s = time.perf_counter() - t0
    r.resumed_from = ck.step
    return ck


def _save_policy(
    r: _Run, ck: LoadedCheckpoint | None, *, checkpoint_every: int | None
) -> SavePolicy:
    """Fixed (argument, then spec), else Daly's from the restored or an early measured save."""
    cp = r.spec.checkpoint
    return SavePolicy.start(
        r.global_step,
        fixed=checkpoint_every or cp.every_steps,
        fixed_source="argument" if checkpoint_every else "spec",
        restored_meta=ck.meta if ck is not None else None,
        first_save=r.spec.pilot.steps,
        mtbi_s=cp.interruption_hours * 3600,
        tolerable_s=cp.tolerable_loss_minutes * 60,
        planned_steps=r.planned,
    )


def _open_metrics(r: _Run, *, restored: bool) -> None:
    """Open ``metrics.jsonl`` for appending, dropping the rows after the restored step."""
    truncate_metrics(r.out_dir / METRICS_FILE, through_step=r.global_step)
    r.mlog = MetricsLog(r.out_dir / METRICS_FILE)
    if restored:
        r.mlog.write(
            {
                "kind": "restore",
                "step": r.global_step,
                "restore_s": r.restore_s,
                "refused": r.refused,
            }
        )


# --- the loop ------------------------------------------------------------------------------------
def _start_epoch(r: _Run) -> Iterator[Any]:
    """The current epoch's batches; after a restore, the same order with the consumed ones skipped.

    The sampler's generator goes back to its state at the top of the epoch, so the epoch's
    order is drawn again and the batches already trained on are fetched and dropped. The
    global RNGs are restored after that skip: fetching batches must not move them.
    """
    skip = 0
    if r.resume_gen_state is not None:
        r.generator.set_state(r.resume_gen_state)
        skip, r.resume_gen_state = r.batch_in_epoch, None
    r.epoch_gen_state = r.generator.get_state()
    if r.pending_rng is not None and skip == 0:
        restore_rng(r.pending_rng)
        r.pending_rng = None
    batches = iter(r.loader)
    for _ in range(skip):
        next(batches)
    if r.pending_rng is not None:
        restore_rng(r.pending_rng)
        r.pending_rng = None
    r.batch_in_epoch = skip
    return batches


def _train_step(r: _Run, batches: Iterator[Any]) -> dict[str, Any]:
    """One optimizer step on the next batch; returns its ``train`` row."""
    t0 = time.perf_counter()
    batch = to_device(next(batches), r.device)
    lr = r.optimizer.param_groups[0]["lr"]
    name = r.config.recipe
    with r.autocast:
        loss = check_loss(name, call(name, "loss", r.recipe.loss, r.model, batch))
    loss_value = loss.item()
    if not math.isfinite(loss_value) and r.spec.stop_rules.non_finite_loss:
        raise NonFiniteLoss(
            r.run_id,
            f"training loss is {loss_value} at step {r.global_step + 1} "
            f"(epoch {r.epoch}, lr {lr:g}); the step was not applied",
            step=r.global_step + 1,
        )
    r.optimizer.zero_grad(set_to_none=True)
    r.scaler.scale(loss).backward()
    r.scaler.step(r.optimizer)
    r.scaler.update()
    if r.scheduler is not None:
        r.scheduler.step()
    n = batch_len(batch)
    r.global_step += 1
    r.batch_in_epoch += 1
    r.samples_seen += n
    step_s = time.perf_counter() - t0
    r.step_times.append(step_s)
    r.steps_s_sum += step_s
    return {
        "kind": "train",
        "step": r.global_step,
        "epoch": r.epoch,
        "loss": loss_value,
        "lr": lr,
        "step_s": step_s,
        "samples_per_s": n / step_s if step_s > 0 else None,
    }


def _run_epoch(r: _Run, *, progress: ProgressFn | None, bar: Any) -> None:
    """Train the rest of the current epoch, or up to the target step."""
    batches = _start_epoch(r)
    while r.batch_in_epoch < r.steps_per_epoch:
        row = _train_step(r, batches)
        r.mlog.write(row)
        end_of_epoch = r.batch_in_epoch == r.steps_per_epoch
        every = r.config.eval_every
        if (every and r.global_step % every == 0) or (not every and end_of_epoch):
            _evaluate(r, "val", final=False)
        if r.policy.due(r.global_step, target=r.target):
            save_checkpoint(r)
        _report(r, row, progress=progress, bar=bar)
        if stop_requested() is not None:
            _stop_now(r)
        if r.global_step >= r.target:
            break
    if r.batch_in_epoch == r.steps_per_epoch:
        r.epoch += 1


def _stop_now(r: _Run) -> None:
    """A stop was requested: checkpoint this step (unless just saved), then raise."""
    reason = stop_requested() or "stop"
    collect_save(r)  # the save in flight, if any, is committed and recorded first
    if not (r.saves and r.saves[-1].step == r.global_step):
        save_checkpoint(r)
        collect_save(r)  # written and recorded (the timeline's heartbeat) before stopping
    r.mlog.write({"kind": "interrupt", "step": r.global_step, "reason": reason})
    r.mlog.sync()
    raise Interrupted(reason, step=r.global_step)


def _evaluate(r: _Run, split: str, *, final: bool) -> dict[str, float] | None:
    """Evaluate on ``split`` and log an ``eval`` row; None when the split is empty."""
    dataset = r.datasets.get(split)
    if dataset is None or len(dataset) == 0:
        return None
    t0 = time.perf_counter()
    rule = r.spec.decision_rule
    metrics = evaluate_split(
        r.recipe,
        r.model,
        dataset,
        config=r.config,
        device=r.device,
        need=rule.metric if rule else None,
    )
    r.eval_times.append(time.perf_counter() - t0)
    r.mlog.write(
        {
            "kind": "eval",
            "step": r.global_step,
            "epoch": r.epoch,
            "split": split,
            **metrics,
            "eval_s": r.eval_times[-1],
            "final": final,
        }
    )
    return metrics


def _report(r: _Run, row: dict[str, Any], *, progress: ProgressFn | None, bar: Any) -> None:
    """Move the progress bar; call ``progress`` every ~2% of the run and at the target."""
    if bar is not None:
        bar.update(bar.task_ids[0], completed=r.global_step)
    every = max(1, r.planned // 50)
    if progress is not None and (r.global_step % every == 0 or r.global_step == r.target):
        progress(
            {
                "run_id": r.run_id,
                "run": r.run,
                "step": r.global_step,
                "planned_steps": r.planned,
                "target_steps": r.target,
                "epoch": r.epoch,
                "loss": row["loss"],
                "lr": row["lr"],
                "fraction": r.global_step / r.planned,
                "elapsed_s": time.perf_counter() - r.t_call,
            }
        )


# --- the end --------------------------------------------------------------------------------------
def _finish(r: _Run, *, train_s: float) -> RunResult:
    """Final evaluation, the model folder, the quality floor, then ``result.json``.

    Raises:
        BelowThreshold: The final metric misses the floor (after everything is written).
    """
    require_complete(r.run_id, steps_done=r.global_step, planned_steps=r.planned)
    # The last step always saves (target == planned here), unless it was restored as is.
    assert (r.saves and r.saves[-1].step == r.global_step) or r.resumed_from == r.global_step
    eval_metrics = {s: m for s in EVAL_SPLITS if (m := _evaluate(r, s, final=True)) is not None}
    metrics = eval_metrics.get(r.spec.decision_split, {})
    save_model(r, metrics)
    # The floor is a decision, so it reads the selection split: the report split decides nothing.
    selected = eval_metrics.get(r.spec.selection_split, metrics)
    stop = _quality_stop(r.spec, r.run_id, selected, step=r.global_step)
    res = _result(
        r,
        completed=True,
        metrics=metrics,
        eval_metrics=eval_metrics,
        train_s=train_s,
        stop=stop.to_record() if stop else None,
    )
    r.mlog.sync()
    atomic_write_bytes(r.out_dir / RESULT_FILE, json_bytes(res.to_dict()))
    if stop is not None:
        raise stop
    return res


def _quality_stop(
    spec: CampaignSpec, run_id: str, metrics: dict[str, float], *, step: int
) -> BelowThreshold | None:
    """The stop when the decision metric misses the quality floor, when that rule is on."""
    rule = spec.decision_rule
    if rule is None or not spec.stop_rules.below_threshold:
        return None
    floor = (
        spec.stop_rules.quality_floor
        if spec.stop_rules.quality_floor is not None
        else rule.threshold
    )
    value = metrics.get(rule.metric, math.nan)
    meets = value >= floor if rule.direction == "maximize" else value <= floor
    if meets:
        return None
    side = "below" if rule.direction == "maximize" else "above"
    return BelowThreshold(
        run_id,
        f"final {rule.metric} on {rule.select_split} is {value:.6g}, {side} the floor {floor:g}",
        step=step,
    )


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


def _result(
    r: _Run,
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
    saves = r.saves
    timings = {
        "load_s": r.corpus.load_s + r.setup_s,
        "setup_s": r.setup_s,
        "corpus_load_s": r.corpus.load_s,
        "step_s": r.step_s(),
        "steps_s_sum": r.steps_s_sum,
        "eval_s": r.eval_times,
        "save_s": [s.save_s for s in saves],
        "stall_s": r.stalls,
        "write_s": [s.write_s for s in saves],
        "upload_s": [s.upload_s for s in saves],
        "restore_s": r.restore_s,
        "train_s": train_s,
        "total_s": time.perf_counter() - r.t_call,
    }
    if measured is not None and not r.step_times and not saves:
        timings.update(_costs_of_checkpoint(measured))
    return RunResult(
        run_id=r.run_id,
        run=r.run,
        completed=completed,
        steps_done=r.global_step,
        planned_steps=r.planned,
        metrics=metrics or {},
        eval_metrics=eval_metrics or {},
        timings=timings,
        n_checkpoints=len(saves),
        checkpoint_every=r.policy.interval.every_steps,
        save_interval=asdict(r.policy.interval),
        resumed_from_step=r.resumed_from,
        refused_checkpoints=r.refused,
        stop=stop,
        device=r.device.type,
        threads=r.config.threads,
        precision=r.config.precision,
    )


# --- the run ---------------------------------------------------------------------------------
def train_run(
    spec: CampaignSpec,
    *,
    run: str,
    corpus: Any,
    store: Store,
    out_dir: Path,
    stop_after_steps: int | None = None,
    checkpoint_every: int | None = None,
    progress: ProgressFn | None = None,
    show_progress: bool = False,
    on_save: SaveFn | None = None,
    lane: int = 0,
) -> RunResult:
    """Train (or resume, or return the recorded result of) one run of the campaign.

    Args:
        spec: The campaign spec.
        run: ``control`` or a variant name.
        corpus: The loaded corpus (its sha256 must be the pinned one): a table ``Corpus`` for
            the built-in recipes, a ``Pinned`` file or folder for the others.
        store: Checkpoint store; ``<run_id>/LATEST`` there is resumed from when valid.
        out_dir: The run folder ``OUT/runs/<run_id>/``.
        stop_after_steps: Pilot mode: stop at this global step, checkpoint, return with
            ``completed=False``; a later call resumes from that checkpoint. Not part of the
            config, so not part of the run ID.
        checkpoint_every: Fixed save interval in steps (overrides the spec and the measured
            interval).
        progress: Called with ``{run_id, step, planned_steps, loss, ...}`` every ~2% of the run.
        show_progress: Show a rich progress bar when stderr is a terminal.
        on_save: Called with ``{run_id, step, planned_steps, save_s, key}`` after each
            checkpoint is committed (the timeline's heartbeat).
        lane: The plan's GPU lane running this call; picks its CUDA device (see
            ``torchsetup.pick_device``). Not part of the run ID.

    Returns:
        The ``RunResult`` (``completed`` False after a pilot stop).

    Raises:
        NonFiniteLoss: A NaN or infinite loss (with its step), when the rule is on.
        BelowThreshold: The final metric misses the floor (after the model is saved).
        EssentialInputMissing: The corpus is not the pinned one.
        NoUsableRestart: Checkpoints exist but none is usable, and ``require_restart`` is on.
        IncompleteRun: A recorded or finished run has fewer steps than planned.
        Interrupted: A stop was requested (SIGINT, SIGTERM): the step reached is saved first.
        SpecError: Invalid arguments or an unsupported precision on this device.
    """
    t_call = time.perf_counter()
    run_id = _check_arguments(
        spec,
        run=run,
        corpus=corpus,
        stop_after_steps=stop_after_steps,
        checkpoint_every=checkpoint_every,
    )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    recorded = recorded_result(out_dir, run_id)
    if recorded is not None:
        return recorded

    r = _setup(
        spec,
        run=run,
        corpus=corpus,
        store=store,
        out_dir=out_dir,
        stop_after_steps=stop_after_steps,
        t_call=t_call,
        lane=lane,
    )
    ck = _restore(r)
    r.policy = _save_policy(r, ck, checkpoint_every=checkpoint_every)
    r.on_save = on_save
    if ck is not None and r.global_step >= r.target and r.target < r.planned:
        # The pilot already ran, maybe on another host into another folder (resumed from S3):
        # nothing trains here, so its costs are the ones the checkpoint measured.
        return _result(r, completed=False, measured=ck.meta)
    _open_metrics(r, restored=ck is not None)
    bar = progress_bar(show_progress, run_id, r.planned, r.global_step)
    t_loop = time.perf_counter()
    try:
        while r.global_step < r.target:
            _run_epoch(r, progress=progress, bar=bar)
        collect_save(r)  # the last save of this call is durable before it returns
        train_s = time.perf_counter() - t_loop
        if r.global_step < r.planned:
            return _result(r, completed=False, train_s=train_s)
        return _finish(r, train_s=train_s)
    finally:
        r.saver.close()
        r.mlog.close()
        if bar is not None:
            bar.stop()
