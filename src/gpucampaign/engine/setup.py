"""One start of a training run: the arguments checked, the run built, ``params.json`` written.

``setup_run`` builds everything in the same order on every start, resumed or not (seeded
python/numpy/torch, the recipe's datasets and model, the optimizer, scheduler, scaler, a seeded
DataLoader generator, the checkpoint manager) into a ``LiveRun``, the object the loop in
``loop.py`` moves forward; what a checkpoint holds of it is its ``TrainState``.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from gpucampaign.checkpoint.manager import CheckpointManager
from gpucampaign.checkpoint.trainstate import TrainState
from gpucampaign.config import CampaignSpec, ResolvedRun, RunConfig
from gpucampaign.core.errors import ArgumentError
from gpucampaign.core.files import atomic_write_bytes, json_bytes, median
from gpucampaign.core.stoprules import EssentialInputMissing
from gpucampaign.engine.checkpointer import Checkpointer
from gpucampaign.engine.devices import (
    AMP_DTYPES,
    RngSlot,
    build_optimizer,
    build_scheduler,
    check_precision,
    device_settings,
    pick_device,
    seed_everything,
)
from gpucampaign.engine.parts import (
    BatchCopy,
    TensorBatches,
    make_loader,
    place_eval_splits,
    place_train_split,
)
from gpucampaign.engine.process_group import OneProcess, Ranks
from gpucampaign.folder.layout import RunFolder
from gpucampaign.folder.metrics import MetricsLog
from gpucampaign.plan.reforecast import pilot_marks
from gpucampaign.recipe.contract import Recipe, RecipeContext, call, load_recipe
from gpucampaign.recipe.runtime import build_datasets, recipe_context, recipe_record
from gpucampaign.storage import Store


@dataclass
class LiveRun:
    """What one start of a run builds; ``state`` is what its loop moves and a checkpoint holds.

    The run's identity is ``resolved`` (built once by the caller); ``run``, ``run_id``,
    ``config`` and ``config_sha256`` read from it.
    """

    spec: CampaignSpec
    resolved: ResolvedRun
    corpus: Any
    run_folder: RunFolder
    t_call: float
    device: torch.device
    recipe: Recipe  # its state, with the model's and the optimizer's, is in ``state``
    ctx: RecipeContext
    datasets: dict[str, Any]
    described: dict[str, Any]
    state: TrainState
    autocast: AbstractContextManager | None  # None in fp32: the loop enters no context
    loader: DataLoader | TensorBatches
    planned: int
    target: int
    manager: CheckpointManager
    # Moves each batch to the device (``parts.BatchCopy``); None when a batch is where it trains
    # (the CPU, a placed train split): nothing is called at each step.
    copy_batch: Any = None
    # The evaluation splits placed in the device's memory with the train split (by name).
    on_device: dict[str, Any] = field(default_factory=dict)
    # The run's processes: one, or this rank of a data-parallel run (``process_group.py``).
    dist: Ranks = field(default_factory=OneProcess)
    # The global generators' states of this run, while other runs train in this process.
    rng: RngSlot = field(default_factory=RngSlot)
    setup_s: float = 0.0
    # What the restore found.
    restore_s: float = 0.0
    # The wait for the call's last save to be durable, after its last step (not training).
    final_save_s: float = 0.0
    # The loop's start in this call, before its first step (its mark, the hooks' on_start):
    # a cost of each call, which the re-forecast must not spread over the pilot's few steps.
    loop_start_s: float = 0.0
    # The live view's reports in this call's loop: their count and seconds (the re-forecast
    # counts them at each run's own cadence, ``config.parts.report_every``, apart from steps).
    reports: int = 0
    report_s: float = 0.0
    # The hooks' looks after the evaluations during training (futility: the control records
    # its scores, a variant checks them): their count and seconds, apart from the steps (the
    # re-forecast counts a look at each evaluation where a run has one).
    looks: int = 0
    look_s: float = 0.0
    # A pilot that held no evaluation times one after its last save (``time_evaluation``).
    probe_eval: bool = False
    probe_eval_s: float | None = None
    # And a read of the checkpoint it saved, as the call resuming from it reads it
    # (``time_restore``): a cost of that call the pilot, starting from nothing, did not pay.
    probe_restore_s: float | None = None
    # And futility's looks at each evaluation of the training calls (``time_looks``): the
    # whole probe, and of it the control's record and a variant's check, each with its scores.
    probe_looks_s: float | None = None
    probe_record_s: float | None = None
    probe_check_s: float | None = None
    resumed_from: int | None = None
    refused: list[str] = field(default_factory=list)
    # A pilot marks the loop's counters after its warm-up steps and before its last step
    # (``take_mark`` at each of ``marks_at``; ``mark_step``: the next, 0 when none is left),
    # and at the loop's end: the loop's time per step between the first two is what a long
    # call pays at each step, the last step's beyond it at each evaluation, the excess before
    # them once a call (``plan.reforecast._loop_split``).
    marks_at: tuple[int, ...] = ()
    mark_step: int = 0
    marks: list[dict[str, float]] = field(default_factory=list)
    t_loop: float = 0.0  # when the call's loop started (``perf_counter``)
    # Measurements, the metrics log and the saves.
    step_times: list[float] = field(default_factory=list)
    eval_times: list[float] = field(default_factory=list)
    # The last evaluation during training (step, metrics on val): the live progress shows it.
    last_eval: tuple[int, dict[str, float]] | None = None
    # Files written by the hooks, fsynced at the next checkpoint and the call's end.
    unsynced: list[Path] = field(default_factory=list)
    # More fields for every checkpoint's meta (the MLflow run ID when tracking is on).
    checkpoint_meta: dict[str, Any] = field(default_factory=dict)
    # Set by the loop before the first step: the log once metrics.jsonl is open, the saver
    # once the restore is known.
    mlog: MetricsLog = field(init=False, repr=False)
    saver: Checkpointer = field(init=False, repr=False)

    @property
    def run(self) -> str:
        """The run's name."""
        return self.resolved.name

    @property
    def run_id(self) -> str:
        return self.resolved.run_id

    @property
    def config(self) -> RunConfig:
        return self.resolved.config

    @property
    def config_sha256(self) -> str:
        return self.resolved.config_sha256

    @property
    def steps_per_epoch(self) -> int:
        return len(self.loader)

    def split(self, name: str) -> Any:
        """The split ``name`` as evaluations read it: placed on the device, else the recipe's
        (None when the recipe gives none)."""
        placed = self.on_device.get(name)
        return placed if placed is not None else self.datasets.get(name)

    def step_s(self) -> float | None:
        """Median step time, without the first step (warm-up) when there are others."""
        return median(self.step_times[1:] or self.step_times)

    def take_mark(self) -> None:
        """The loop's counters now (one more of ``marks``): seconds since the loop started, and
        of them the steps', the evaluations', the saves' stalls, the live view's and the
        hooks' looks."""
        step = self.state.global_step
        self.mark_step = next((at for at in self.marks_at if at > step), 0)
        self.marks.append(
            {
                "step": step,
                "at_s": time.perf_counter() - self.t_loop,
                "steps_s": self.state.steps_s_sum,
                "eval_s": sum(self.eval_times),
                "stall_s": sum(self.saver.stalls),
                "report_s": self.report_s,
                "look_s": self.look_s,
            }
        )


@dataclass(frozen=True, kw_only=True)
class RunJob:
    """What one training call is asked: ``train_run``'s arguments, passed down as one value
    (to ``setup_run``, and to every rank of a data-parallel run through ``launch``).

    Attributes:
        spec: The campaign spec.
        run: The run (``CampaignSpec.resolve_run``): its config and ID, resolved once.
        corpus: The loaded corpus, the pinned one.
        store: Checkpoint store; ``<run_id>/LATEST`` there is resumed from when valid.
        run_folder: The run's folder ``OUT/runs/<run_id>/`` (a rank k > 0: its own, inside it).
        stop_after_steps: Pilot mode: stop at this step, checkpoint, return uncompleted.
        checkpoint_every: Fixed save interval in steps (overrides the spec and the measure).
        lane: The plan's GPU lane running this call (``devices.pick_device``).
        probe_eval: Pilot mode: when its steps held no evaluation, time one after its last
            save (``outcome.time_evaluation``: the re-forecast prices the run's with it), a
            read of that save (``outcome.time_restore``) and the scores futility asks for
            (``outcome.time_looks``).
    """

    spec: CampaignSpec
    run: ResolvedRun
    corpus: Any
    store: Store
    run_folder: RunFolder
    stop_after_steps: int | None = None
    checkpoint_every: int | None = None
    lane: int = 0
    probe_eval: bool = False


def check_arguments(job: RunJob) -> None:
    """Check the arguments of a training call and the corpus against the spec's pin."""
    stop_after_steps, checkpoint_every = job.stop_after_steps, job.checkpoint_every
    if stop_after_steps is not None and stop_after_steps < 1:
        raise ArgumentError(
            f"stop_after_steps must be >= 1 (got {stop_after_steps}).", field="stop_after_steps"
        )
    if checkpoint_every is not None and checkpoint_every < 1:
        raise ArgumentError(
            f"checkpoint_every must be >= 1 (got {checkpoint_every}).", field="checkpoint_every"
        )
    pinned = job.spec.corpus
    if pinned is not None and job.corpus.sha256 != pinned.sha256:
        raise EssentialInputMissing(
            job.run.run_id,
            f"the corpus given has sha256 {job.corpus.sha256}, the spec pins {pinned.sha256}",
        )


def setup_run(job: RunJob, *, t_call: float, dist: Ranks | None = None) -> LiveRun:
    """Build everything in the same order on every start, resumed or not.

    A rank of a data-parallel run (``dist``) takes the lane's GPU plus its local rank, its
    share of each batch, and RNG streams of its own after the (identical) model is built.
    """
    spec, run, corpus, run_folder = job.spec, job.run, job.corpus, job.run_folder
    config, run_id = run.config, run.run_id
    dist = dist or OneProcess()
    device = pick_device(run.device, lane=job.lane + dist.local_rank)
    check_precision(config.precision, device)
    torch.set_num_threads(config.threads)
    recipe = load_recipe(config.recipe)
    ctx = recipe_context(config, corpus=corpus, run_id=run_id, device=device)
    rng = RngSlot()
    with rng.held():
        seed_everything(config.seed)
        datasets = build_datasets(recipe, config, ctx)
        model = call(config.recipe, "model", recipe.model, ctx)
        if dist.rank > 0:  # dropout and the like: not the same draws on every rank
            seed_everything((config.seed * 1_000_003 + dist.rank) % 2**32)
    model.to(device).train()
    optimizer = build_optimizer(config, model.parameters())
    generator = torch.Generator().manual_seed(config.seed)
    train = datasets["train"]
    placed = place_train_split(train, config=config, device=device, collate_fn=recipe.collate_fn)
    loader = make_loader(
        train,
        config=config,
        generator=generator,
        device=device,
        collate_fn=recipe.collate_fn,
        rank=dist.rank,
        world_size=dist.world_size,
        placed=placed,
    )
    planned = config.planned_steps(len(train))
    amp_dtype = AMP_DTYPES[config.precision]
    r = LiveRun(
        spec=spec,
        resolved=run,
        corpus=corpus,
        run_folder=run_folder,
        t_call=t_call,
        device=device,
        recipe=recipe,
        ctx=ctx,
        datasets=datasets,
        described=call(config.recipe, "describe", recipe.describe, ctx, datasets),
        state=TrainState(
            model=model,
            optimizer=optimizer,
            scheduler=build_scheduler(config, optimizer, planned_steps=planned),
            scaler=torch.amp.GradScaler(device.type, enabled=config.precision == "fp16"),
            recipe=recipe,
            generator=generator,
            gather_rng=dist.gather_rng if dist.world_size > 1 else None,
            rank=dist.rank,
        ),
        autocast=torch.autocast(device.type, dtype=amp_dtype) if amp_dtype is not None else None,
        loader=loader,
        # On the CPU a batch is where it trains: nothing to move at each step.
        copy_batch=BatchCopy(device) if placed is None and device.type != "cpu" else None,
        on_device=place_eval_splits(  # data-parallel: rank 0 alone evaluates
            datasets,
            placed_train=placed if dist.is_main else None,
            device=device,
            collate_fn=recipe.collate_fn,
        ),
        planned=planned,
        target=planned if job.stop_after_steps is None else min(job.stop_after_steps, planned),
        manager=CheckpointManager(
            job.store,
            run_id=run_id,
            config_sha256=run.config_sha256,
            keep=spec.checkpoint.keep,
            staging_dir=run_folder.staging,
            expect_tensors={k: tuple(v.shape) for k, v in model.state_dict().items()},
        ),
        dist=dist,
        rng=rng,
        probe_eval=job.probe_eval,
        # a pilot's (from step 0): after its warm-up, before its last step (see the field)
        marks_at=(marks := pilot_marks(job.stop_after_steps) if job.probe_eval else ()),
        mark_step=marks[0] if marks else 0,
    )
    _write_params(r)
    r.setup_s = time.perf_counter() - t_call
    return r


def _write_params(r: LiveRun) -> None:
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
        **recipe_record(r.resolved),
        **r.described,
        **device_settings(r.device),
        "threads": r.config.threads,
        **({"world_size": r.dist.world_size, "rank": r.dist.rank} if r.dist.world_size > 1 else {}),
        "torch": torch.__version__,
        "decision_rule": (
            spec.decision_rule.model_dump(mode="json") if spec.decision_rule else None
        ),
        "stop_rules": spec.stop_rules.model_dump(mode="json"),
    }
    atomic_write_bytes(r.run_folder.params, json_bytes(params))
