"""One training run, top to bottom: setup, resume, the loop, stop rules, checkpoints, completion.

``train_run`` is the only entry point. It writes into the run folder ``OUT/runs/<run_id>/``:

- ``params.json``: the resolved config, run ID, planned steps (written at every start);
- ``metrics.jsonl``: one JSON row per event, each with a ``kind``: ``train`` (step, epoch,
  loss, lr, step_s, samples_per_s), ``eval`` (split, accuracy, macro_f1, loss, eval_s, final),
  ``checkpoint`` (step, save_s, write_s, upload_s, bytes, every_steps) and ``restore``;
  on resume, rows after the restored step are dropped, so the file always tells one timeline;
- at completion ``model/`` (``save_model_dir``) and ``result.json`` (``RunResult``).

Checkpoints go to the ``Store`` under ``<run_id>/`` (see ``checkpoint.py``).

Determinism (measured, FACTS.md): python/numpy/torch seeded, a seeded DataLoader generator,
a pinned thread count; the checkpoint keeps the generator state from the TOP of the epoch,
and a resume re-draws that epoch's order and skips the consumed batches before restoring the
global RNGs. On CPU a resumed run is bit-identical to an uninterrupted one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from gpucampaign.checkpoint import CheckpointManager, capture_rng, restore_rng
from gpucampaign.corpus import Corpus
from gpucampaign.files import atomic_write_bytes, median, read_jsonl, write_jsonl
from gpucampaign.recipes import build_model, fit_input_stats, save_model_dir
from gpucampaign.spec import CampaignSpec, RunConfig, SpecError, canonical_json
from gpucampaign.stoprules import (
    STOP_RULES,
    BelowThreshold,
    EssentialInputMissing,
    IncompleteRun,
    NonFiniteLoss,
    NoUsableRestart,
)
from gpucampaign.storage import Store

log = logging.getLogger(__name__)

PARAMS_FILE = "params.json"
METRICS_FILE = "metrics.jsonl"
RESULT_FILE = "result.json"
MODEL_DIR = "model"
EVAL_SPLITS: tuple[str, ...] = ("val", "test")


# --- save interval (R12) ---------------------------------------------------------------------
def daly_interval(delta_s: float, mtbi_s: float) -> float:
    """Daly's optimal compute time between checkpoints.

    ``tau = sqrt(2 delta M) (1 + sqrt(delta/(2M))/3 + (delta/(2M))/9) - delta`` when
    ``delta < 2M``, else ``M``.

    Args:
        delta_s: Cost of one save (write + upload), seconds.
        mtbi_s: Expected time between interruptions M, seconds.
    """
    if delta_s < 0 or mtbi_s <= 0:
        raise ValueError(f"need delta_s >= 0 and mtbi_s > 0 (got {delta_s}, {mtbi_s})")
    if delta_s >= 2 * mtbi_s:
        return mtbi_s
    r = delta_s / (2 * mtbi_s)
    return math.sqrt(2 * delta_s * mtbi_s) * (1 + math.sqrt(r) / 3 + r / 9) - delta_s


@dataclass
class SaveInterval:
    """How often to save, and from what.

    ``source``: ``argument`` / ``spec`` (a fixed step count), ``first-save`` (the early save
    at the pilot's step count, before any save was measured) or ``measured`` (Daly from the
    measured save cost, capped by the tolerable lost work, in steps of the measured step time).
    """

    source: str
    every_steps: int | None
    delta_s: float | None = None
    step_s: float | None = None
    mtbi_s: float | None = None
    tolerable_s: float | None = None
    daly_s: float | None = None
    tau_s: float | None = None


def choose_save_interval(
    *, delta_s: float, step_s: float, mtbi_s: float, tolerable_s: float, planned_steps: int
) -> SaveInterval:
    """``tau = min(Daly(delta, M), tolerable lost work)``, converted to whole steps."""
    daly = daly_interval(delta_s, mtbi_s)
    tau = min(daly, tolerable_s)
    every = planned_steps if step_s <= 0 else int(tau // step_s)
    every = max(1, min(every, planned_steps))
    return SaveInterval("measured", every, delta_s, step_s, mtbi_s, tolerable_s, daly, tau)


# --- the result --------------------------------------------------------------------------------
@dataclass
class RunResult:
    """What one ``train_run`` call did (a recorded result when ``reused``)."""

    run_id: str
    run: str
    completed: bool
    steps_done: int
    planned_steps: int
    metrics: dict[str, float]
    timings: dict[str, Any]
    n_checkpoints: int
    checkpoint_every: int | None
    save_interval: dict[str, Any] | None
    resumed_from_step: int | None
    refused_checkpoints: list[str] = field(default_factory=list)
    eval_metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    stop: dict[str, Any] | None = None
    device: str = "cpu"
    threads: int = 1
    precision: str = "fp32"
    reused: bool = False

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``from_dict`` reads it back)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunResult:
        """Rebuild from ``to_dict``'s output."""
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


def require_complete(run_id: str, *, steps_done: int, planned_steps: int) -> None:
    """Raise ``IncompleteRun`` unless every planned step ran (R10: never a delivery otherwise)."""
    if steps_done < planned_steps:
        raise IncompleteRun(
            run_id, f"the run did {steps_done} of its {planned_steps} planned steps; it cannot be called complete",
            step=steps_done,
        )


# --- helpers ---------------------------------------------------------------------------------
def run_config_sha256(spec: CampaignSpec, run: str) -> str:
    """Full sha256 over the same payload as the run ID (config + pinned corpus)."""
    payload = {
        "config": spec.run_config(run).model_dump(mode="json"),
        "corpus_sha256": spec.corpus.sha256 if spec.corpus else None,
    }
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()


_GLOBAL_RNG_LOCK = threading.Lock()


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def pick_device() -> torch.device:
    """CUDA when present (deterministic cuDNN), else CPU."""
    if torch.cuda.is_available():
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        return torch.device("cuda")
    return torch.device("cpu")


AMP_DTYPES: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def check_precision(precision: str, device: torch.device) -> None:
    """Refuse (SpecError) a precision this device's autocast cannot run."""
    dtype = AMP_DTYPES[precision]
    if dtype is None:
        return
    try:
        with torch.autocast(device.type, dtype=dtype):
            out = torch.nn.functional.linear(torch.ones(2, 2, device=device), torch.ones(2, 2, device=device))
        ok = out.dtype == dtype
    except (RuntimeError, TypeError) as exc:
        raise SpecError(
            f"precision '{precision}' is not supported by autocast on {device.type} ({exc}); "
            "use 'fp32' or 'bf16' there.", field="precision") from None
    if not ok:
        raise SpecError(
            f"precision '{precision}': autocast on {device.type} does not compute in {dtype}; "
            "use 'fp32' or 'bf16' there.", field="precision")


def build_optimizer(config: RunConfig, params: Any) -> torch.optim.Optimizer:
    """adam / adamw / sgd (momentum 0.9)."""
    if config.optimizer == "adam":
        return torch.optim.Adam(params, lr=config.lr, weight_decay=config.weight_decay)
    if config.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    return torch.optim.SGD(params, lr=config.lr, momentum=0.9, weight_decay=config.weight_decay)


def build_scheduler(config: RunConfig, optimizer: torch.optim.Optimizer, *, planned_steps: int) -> Any:
    """Per-step schedule: none, cosine to 0 over the planned steps, or step (x0.1 every third)."""
    if config.scheduler == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=planned_steps)
    if config.scheduler == "step":
        return torch.optim.lr_scheduler.StepLR(optimizer, step_size=max(1, planned_steps // 3), gamma=0.1)
    return None


def classification_metrics(y_true: np.ndarray, y_pred: np.ndarray, *, n_classes: int) -> dict[str, float]:
    """Accuracy and macro F1 (over the classes present in truth or prediction, as scikit-learn)."""
    if len(y_true) == 0:
        return {"accuracy": math.nan, "macro_f1": math.nan}
    cm = np.zeros((n_classes, n_classes), dtype=np.int64)
    np.add.at(cm, (y_true, y_pred), 1)
    tp = np.diag(cm).astype(float)
    support, predicted = cm.sum(axis=1), cm.sum(axis=0)
    present = (support + predicted) > 0
    denom = support + predicted
    f1 = np.divide(2 * tp, denom, out=np.zeros_like(tp), where=denom > 0)
    return {"accuracy": float(tp.sum() / len(y_true)), "macro_f1": float(f1[present].mean())}


@torch.no_grad()
def evaluate(model: torch.nn.Module, X: torch.Tensor, y: torch.Tensor, *, n_classes: int,
             device: torch.device) -> dict[str, float]:
    """Metrics of ``model`` on (X, y), in float32 like ``recipes.predict``; train mode restored."""
    was_training = model.training
    model.eval()
    try:
        losses, preds = [], []
        for start in range(0, len(X), 4096):
            xb, yb = X[start : start + 4096].to(device), y[start : start + 4096].to(device)
            logits = model(xb).float()
            losses.append(F.cross_entropy(logits, yb, reduction="sum").item())
            preds.append(logits.argmax(dim=1).cpu())
        pred = torch.cat(preds).numpy() if preds else np.zeros(0, dtype=np.int64)
        out = classification_metrics(y.numpy(), pred, n_classes=n_classes)
        out["loss"] = sum(losses) / len(X) if len(X) else math.nan
        return out
    finally:
        model.train(was_training)


class MetricsLog:
    """Append-only ``metrics.jsonl``; floats are written with repr (exact round trip)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._f = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()

    def write(self, row: dict[str, Any]) -> None:
        self._f.write(json.dumps(row, allow_nan=True) + "\n")
        self._f.flush()

    def sync(self) -> None:
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All rows of a ``metrics.jsonl`` (empty list when absent)."""
    return read_jsonl(path)


def truncate_metrics(path: Path, *, through_step: int) -> None:
    """Keep only rows of steps <= ``through_step`` (a resume continues from there)."""
    write_jsonl(path, [r for r in read_metrics(path) if r.get("step", 0) <= through_step])


def _recorded_result(out_dir: Path, run_id: str) -> RunResult | None:
    path = out_dir / RESULT_FILE
    if not path.is_file():
        return None
    result = RunResult.from_dict(json.loads(path.read_text(encoding="utf-8")))
    if result.run_id != run_id:
        raise SpecError(f"'{out_dir}' holds run {result.run_id}, not {run_id}: give each run its own folder.",
                        field="out_dir")
    require_complete(run_id, steps_done=result.steps_done, planned_steps=result.planned_steps)
    result.reused = True
    if result.stop:
        cls = STOP_RULES[result.stop["rule"]]
        raise cls(run_id, result.stop["reason"], result.stop.get("step"), result.stop["stop_id"])
    return result


# --- the run ---------------------------------------------------------------------------------
def train_run(
    spec: CampaignSpec,
    *,
    run: str,
    corpus: Corpus,
    store: Store,
    out_dir: Path,
    stop_after_steps: int | None = None,
    checkpoint_every: int | None = None,
    progress: Callable[[dict], None] | None = None,
    show_progress: bool = False,
) -> RunResult:
    """Train (or resume, or return the recorded result of) one run of the campaign.

    Args:
        spec: The campaign spec.
        run: ``control`` or a variant name.
        corpus: The loaded corpus (its sha256 must be the pinned one).
        store: Checkpoint store; ``<run_id>/LATEST`` there is resumed from when valid.
        out_dir: The run folder ``OUT/runs/<run_id>/``.
        stop_after_steps: Pilot mode: stop at this global step, checkpoint, return with
            ``completed=False``; a later call resumes from that checkpoint. Not part of the
            config, so not part of the run ID.
        checkpoint_every: Fixed save interval in steps (overrides the spec and the measured
            interval).
        progress: Called with ``{run_id, step, planned_steps, loss, ...}`` every ~2% of the run.
        show_progress: Show a rich progress bar when stderr is a terminal.

    Returns:
        The ``RunResult`` (``completed`` False after a pilot stop).

    Raises:
        NonFiniteLoss: A NaN or infinite loss (with its step), when the rule is on.
        BelowThreshold: The final metric misses the floor (after the model is saved).
        EssentialInputMissing: The corpus is not the pinned one.
        NoUsableRestart: Checkpoints exist but none is usable, and ``require_restart`` is on.
        IncompleteRun: A recorded or finished run has fewer steps than planned.
        SpecError: Invalid arguments or an unsupported precision on this device.
    """
    t_call = time.perf_counter()
    config = spec.run_config(run)
    run_id = spec.run_id(run)
    config_sha = run_config_sha256(spec, run)
    out_dir = Path(out_dir)
    if stop_after_steps is not None and stop_after_steps < 1:
        raise SpecError(f"stop_after_steps must be >= 1 (got {stop_after_steps}).", field="stop_after_steps")
    if checkpoint_every is not None and checkpoint_every < 1:
        raise SpecError(f"checkpoint_every must be >= 1 (got {checkpoint_every}).", field="checkpoint_every")
    if spec.corpus is not None and corpus.sha256 != spec.corpus.sha256:
        raise EssentialInputMissing(
            run_id, f"the corpus given has sha256 {corpus.sha256}, the spec pins {spec.corpus.sha256}")
    out_dir.mkdir(parents=True, exist_ok=True)
    recorded = _recorded_result(out_dir, run_id)
    if recorded is not None:
        return recorded

    # 1. Setup: everything is built in the same order on every start, resumed or not.
    device = pick_device()
    check_precision(config.precision, device)
    torch.set_num_threads(config.threads)
    train = corpus.split("train")
    X_train, y_train = train.tensors()
    # Runs in threads of one process (GPU lock with 2+ slots) share the global generators:
    # seeding and drawing the initial weights must not interleave with another run's.
    with _GLOBAL_RNG_LOCK:
        seed_everything(config.seed)
        model = build_model(config, n_features=corpus.n_features, n_classes=corpus.n_classes)
        fit_input_stats(model, X_train)
    model.to(device).train()
    optimizer = build_optimizer(config, model.parameters())
    generator = torch.Generator().manual_seed(config.seed)
    loader = DataLoader(TensorDataset(X_train, y_train), batch_size=config.batch_size, shuffle=True,
                        generator=generator, num_workers=0)
    steps_per_epoch = len(loader)
    planned = steps_per_epoch * config.epochs
    if config.max_steps is not None:
        planned = min(planned, config.max_steps)
    target = planned if stop_after_steps is None else min(stop_after_steps, planned)
    scheduler = build_scheduler(config, optimizer, planned_steps=planned)
    scaler = torch.amp.GradScaler(device.type, enabled=config.precision == "fp16")
    amp_dtype = AMP_DTYPES[config.precision]
    manager = CheckpointManager(store, run_id=run_id, config_sha256=config_sha, keep=spec.checkpoint.keep,
                                staging_dir=out_dir / ".staging")
    params = {
        "run_id": run_id, "run": run, "tier": spec.tier_of(run), "config": config.model_dump(mode="json"),
        "config_sha256": config_sha, "corpus_sha256": corpus.sha256, "planned_steps": planned,
        "steps_per_epoch": steps_per_epoch, "n_features": corpus.n_features, "n_classes": corpus.n_classes,
        "classes": list(corpus.classes), "device": device.type, "threads": config.threads,
        "torch": torch.__version__,
        "decision_rule": spec.decision_rule.model_dump(mode="json") if spec.decision_rule else None,
        "stop_rules": spec.stop_rules.model_dump(mode="json"),
    }
    atomic_write_bytes(out_dir / PARAMS_FILE, (json.dumps(params, indent=2) + "\n").encode())
    setup_s = time.perf_counter() - t_call

    # 2. Resume from LATEST when this run (same config hash) has a good checkpoint.
    t_restore = time.perf_counter()
    ck, refused = manager.load_latest()
    if ck is None and refused and spec.stop_rules.require_restart:
        raise NoUsableRestart(run_id, "checkpoints exist but none is usable: " + "; ".join(refused))
    global_step, epoch, batch_in_epoch, resume_gen_state = 0, 0, 0, None
    samples_seen, steps_s_sum, pending_rng = 0, 0.0, None
    if ck is not None:
        model.load_state_dict(ck.model_state, strict=True)
        optimizer.load_state_dict(ck.train_state["optimizer"])
        if scheduler is not None:
            scheduler.load_state_dict(ck.train_state["scheduler"])
        if ck.train_state["scaler"]:
            scaler.load_state_dict(ck.train_state["scaler"])
        cursor, counters = ck.train_state["cursor"], ck.train_state["counters"]
        global_step, epoch = int(counters["global_step"]), int(cursor["epoch"])
        batch_in_epoch, resume_gen_state = int(cursor["batch_in_epoch"]), cursor["epoch_generator_state"]
        samples_seen, steps_s_sum = int(counters.get("samples_seen", 0)), float(counters.get("steps_s_sum", 0.0))
        pending_rng = ck.train_state["rng"]
    restore_s = time.perf_counter() - t_restore if ck is not None else 0.0
    resumed_from = ck.step if ck is not None else None

    def result(completed: bool, **kw: Any) -> RunResult:
        return RunResult(
            run_id=run_id, run=run, completed=completed, steps_done=global_step, planned_steps=planned,
            metrics=kw.get("metrics", {}), eval_metrics=kw.get("eval_metrics", {}),
            timings={
                "load_s": corpus.load_s + setup_s, "setup_s": setup_s, "corpus_load_s": corpus.load_s,
                "step_s": median(step_times[1:] or step_times), "steps_s_sum": steps_s_sum,
                "eval_s": eval_times, "save_s": [s.save_s for s in saves],
                "write_s": [s.write_s for s in saves], "upload_s": [s.upload_s for s in saves],
                "restore_s": restore_s, "train_s": kw.get("train_s", 0.0),
                "total_s": time.perf_counter() - t_call,
            },
            n_checkpoints=len(saves), checkpoint_every=interval.every_steps,
            save_interval=asdict(interval), resumed_from_step=resumed_from, refused_checkpoints=refused,
            stop=kw.get("stop"), device=device.type, threads=config.threads, precision=config.precision,
        )

    step_times: list[float] = []
    eval_times: list[float] = []
    saves: list = []

    # 3. The save interval: fixed, or Daly's from measurements (an early save measures it).
    mtbi_s = spec.checkpoint.interruption_hours * 3600
    tolerable_s = spec.checkpoint.tolerable_loss_minutes * 60
    fixed = checkpoint_every or spec.checkpoint.every_steps
    if fixed:
        interval = SaveInterval("argument" if checkpoint_every else "spec", fixed)
        next_save = (global_step // fixed + 1) * fixed
    elif ck is not None and ck.meta.get("step_s"):
        interval = choose_save_interval(delta_s=ck.meta["write_s"] + ck.meta["upload_s"], step_s=ck.meta["step_s"],
                                        mtbi_s=mtbi_s, tolerable_s=tolerable_s, planned_steps=planned)
        next_save = global_step + (interval.every_steps or planned)
    else:
        first = min(spec.pilot.steps, planned)
        interval = SaveInterval("first-save", None, mtbi_s=mtbi_s, tolerable_s=tolerable_s)
        next_save = first if global_step < first else global_step + 1

    if ck is not None and global_step >= target and target < planned:
        return result(False)  # the pilot already ran: nothing to do
    truncate_metrics(out_dir / METRICS_FILE, through_step=global_step)
    mlog = MetricsLog(out_dir / METRICS_FILE)
    if ck is not None:
        mlog.write({"kind": "restore", "step": global_step, "restore_s": restore_s, "refused": refused})

    def save_checkpoint(cursor: dict[str, Any]) -> None:
        nonlocal interval, next_save
        mlog.sync()
        state = {
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "scaler": scaler.state_dict(),
            "rng": capture_rng(),
            "cursor": cursor,
            "counters": {"global_step": global_step, "samples_seen": samples_seen, "steps_s_sum": steps_s_sum},
        }
        step_s = median(step_times[1:] or step_times)
        saved = manager.save(global_step, model_state=model.state_dict(), train_state=state, extra_meta={
            "epoch": cursor["epoch"], "batch_in_epoch": cursor["batch_in_epoch"], "planned_steps": planned,
            "steps_per_epoch": steps_per_epoch, "step_s": step_s, "threads": config.threads,
            "device": device.type, "precision": config.precision,
        })
        saves.append(saved)
        if not fixed and step_s:
            interval = choose_save_interval(delta_s=median([s.save_s for s in saves]), step_s=step_s,
                                            mtbi_s=mtbi_s, tolerable_s=tolerable_s, planned_steps=planned)
            next_save = global_step + (interval.every_steps or planned)
        elif fixed:
            next_save = (global_step // fixed + 1) * fixed
        mlog.write({"kind": "checkpoint", "step": global_step, "save_s": saved.save_s, "write_s": saved.write_s,
                    "upload_s": saved.upload_s, "commit_s": saved.commit_s, "bytes": saved.bytes,
                    "key": saved.key, "every_steps": interval.every_steps, "interval_source": interval.source})

    def eval_split(split: str, *, final: bool) -> dict[str, float] | None:
        sp = corpus.split(split)
        if len(sp) == 0:
            return None
        t0 = time.perf_counter()
        X, y = sp.tensors()
        m = evaluate(model, X, y, n_classes=corpus.n_classes, device=device)
        eval_times.append(time.perf_counter() - t0)
        mlog.write({"kind": "eval", "step": global_step, "epoch": epoch, "split": split, **m,
                    "eval_s": eval_times[-1], "final": final})
        return m

    bar = _progress_bar(show_progress, run_id, planned, global_step)
    report_every = max(1, planned // 50)
    autocast = (torch.autocast(device.type, dtype=amp_dtype) if amp_dtype is not None else nullcontext())
    t_loop = time.perf_counter()
    try:
        # 4. The loop.
        while global_step < target:
            skip = 0
            if resume_gen_state is not None:  # resuming inside (or at the end of) this epoch
                generator.set_state(resume_gen_state)
                skip, resume_gen_state = batch_in_epoch, None
            epoch_gen_state = generator.get_state()
            if pending_rng is not None and skip == 0:
                restore_rng(pending_rng)
                pending_rng = None
            it = iter(loader)
            for _ in range(skip):
                next(it)
            if pending_rng is not None:  # after the skip: re-fetching must not move the RNGs
                restore_rng(pending_rng)
                pending_rng = None
            done_in_epoch = skip
            for _ in range(skip, steps_per_epoch):
                t0 = time.perf_counter()
                xb, yb = next(it)
                xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
                lr = optimizer.param_groups[0]["lr"]
                with autocast:
                    logits = model(xb)
                loss = F.cross_entropy(logits.float(), yb)
                loss_value = loss.item()
                if not math.isfinite(loss_value) and spec.stop_rules.non_finite_loss:
                    raise NonFiniteLoss(
                        run_id, f"training loss is {loss_value} at step {global_step + 1} (epoch {epoch}, "
                        f"lr {lr:g}); the step was not applied", step=global_step + 1)
                optimizer.zero_grad(set_to_none=True)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
                if scheduler is not None:
                    scheduler.step()
                global_step += 1
                done_in_epoch += 1
                samples_seen += len(yb)
                step_s = time.perf_counter() - t0
                step_times.append(step_s)
                steps_s_sum += step_s
                mlog.write({"kind": "train", "step": global_step, "epoch": epoch, "loss": loss_value, "lr": lr,
                            "step_s": step_s, "samples_per_s": len(yb) / step_s if step_s > 0 else None})
                end_of_epoch = done_in_epoch == steps_per_epoch
                if (config.eval_every and global_step % config.eval_every == 0) or (
                        not config.eval_every and end_of_epoch):
                    eval_split("val", final=False)
                if global_step in (next_save, target):
                    save_checkpoint({"epoch": epoch, "batch_in_epoch": done_in_epoch,
                                     "epoch_generator_state": epoch_gen_state})
                if bar is not None:
                    bar.update(bar.task_ids[0], completed=global_step)
                if progress is not None and (global_step % report_every == 0 or global_step == target):
                    progress({"run_id": run_id, "run": run, "step": global_step, "planned_steps": planned,
                              "target_steps": target, "epoch": epoch, "loss": loss_value, "lr": lr,
                              "fraction": global_step / planned, "elapsed_s": time.perf_counter() - t_call})
                if global_step >= target:
                    break
            if done_in_epoch == steps_per_epoch:
                epoch += 1
        train_s = time.perf_counter() - t_loop
        if global_step < planned:
            return result(False, train_s=train_s)

        # 5. Completion: final evaluation, the model folder, the stop rule on quality.
        require_complete(run_id, steps_done=global_step, planned_steps=planned)
        # The last step always saves (target == planned here), unless it was restored as is.
        assert (saves and saves[-1].step == global_step) or resumed_from == global_step
        eval_metrics = {s: m for s in EVAL_SPLITS if (m := eval_split(s, final=True)) is not None}
        rule = spec.decision_rule
        decision_split = rule.split if rule else "test"
        metrics = eval_metrics.get(decision_split, {})
        save_model_dir(model, out_dir / MODEL_DIR, config=config, n_features=corpus.n_features,
                       n_classes=corpus.n_classes, extra={
                           "run_id": run_id, "run": run, "classes": list(corpus.classes),
                           "feature_names": list(corpus.feature_names), "corpus_sha256": corpus.sha256,
                           "steps": global_step, "metrics": metrics})
        stop = None
        if rule is not None and spec.stop_rules.below_threshold:
            floor = spec.stop_rules.quality_floor if spec.stop_rules.quality_floor is not None else rule.threshold
            value = metrics.get(rule.metric, math.nan)
            meets = value >= floor if rule.direction == "maximize" else value <= floor
            if not meets:
                stop = BelowThreshold(
                    run_id, f"final {rule.metric} on {decision_split} is {value:.6g}, "
                    f"{'below' if rule.direction == 'maximize' else 'above'} the floor {floor:g}",
                    step=global_step)
        res = result(True, metrics=metrics, eval_metrics=eval_metrics, train_s=train_s,
                     stop=stop.to_record() if stop else None)
        mlog.sync()
        atomic_write_bytes(out_dir / RESULT_FILE, (json.dumps(res.to_dict(), indent=2) + "\n").encode())
        if stop is not None:
            raise stop
        return res
    finally:
        mlog.close()
        if bar is not None:
            bar.stop()


def _progress_bar(show: bool, run_id: str, total: int, done: int) -> Any:
    """A started rich progress bar, or None when not asked for or not interactive."""
    if not show:
        return None
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    console = Console(stderr=True)
    if not console.is_terminal:
        return None
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                   console=console, transient=True)
    bar.add_task(run_id, total=total, completed=done)
    bar.start()
    return bar
