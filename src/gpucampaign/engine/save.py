"""The save side of a training run: a checkpoint snapshot handed to the background writer,
its row in ``metrics.jsonl`` once written, and the reloadable model folder at the end."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from gpucampaign.checkpoint.manager import snapshot
from gpucampaign.checkpoint.trainstate import MODEL
from gpucampaign.core.files import median
from gpucampaign.folder.layout import MODEL_DIR
from gpucampaign.recipe.runtime import recipe_record
from gpucampaign.spec.recipefile import recipe_file

if TYPE_CHECKING:
    from gpucampaign.engine.setup import LiveRun


def save_checkpoint(r: LiveRun) -> None:
    """Checkpoint the current step in the background; re-plan the next save.

    The loop stalls only to collect the previous save (never two in flight) and to snapshot
    the state to host memory, after the metrics so far are durable; the write, the
    verification and the move of ``LATEST`` happen in the background thread.
    """
    t0 = time.perf_counter()
    collect_save(r)
    r.mlog.sync()
    state = snapshot(r.state.state_dict())
    model_state = state.pop(MODEL)
    if r.device.type == "cuda":
        torch.cuda.synchronize()  # the pinned copies are complete before the thread reads
    stall_s = time.perf_counter() - t0
    r.stalls.append(stall_s)
    step, step_s = r.state.global_step, r.step_s()
    extra = {
        "epoch": r.state.epoch,
        "batch_in_epoch": r.state.batch_in_epoch,
        "planned_steps": r.planned,
        "steps_per_epoch": r.steps_per_epoch,
        "step_s": step_s,
        "stall_s": stall_s,
        "threads": r.config.threads,
        "device": str(r.device),
        "precision": r.config.precision,
    }
    r.saver.submit(
        lambda: r.manager.save(step, model_state=model_state, train_state=state, extra_meta=extra)
    )
    writes = [s.durable_s for s in r.saves]
    r.policy.saved(
        step, save_costs=r.stalls, step_s=step_s, write_s=median(writes) if writes else None
    )


def collect_save(r: LiveRun) -> None:
    """Wait for the save in flight, if any, and log its ``checkpoint`` row."""
    saved = r.saver.wait()
    if saved is None:
        return
    r.saves.append(saved)
    r.mlog.write(
        {
            "kind": "checkpoint",
            "step": saved.step,
            "save_s": saved.save_s,
            "stall_s": r.stalls[len(r.saves) - 1],
            "write_s": saved.write_s,
            "upload_s": saved.upload_s,
            "commit_s": saved.commit_s,
            "bytes": saved.bytes,
            "key": saved.key,
            "every_steps": r.policy.interval.every_steps,
            "interval_source": r.policy.interval.source,
        }
    )
    if r.on_save is not None:
        r.on_save(
            {
                "run_id": r.run_id,
                "step": r.state.global_step,
                "planned_steps": r.planned,
                "save_s": saved.save_s,
                "key": saved.key,
            }
        )


def save_model(r: LiveRun, metrics: dict[str, float]) -> None:
    """The reloadable model folder: weights, and a config naming recipe, args and inputs."""
    from gpucampaign.recipes import save_model_dir

    spec, record = r.spec, recipe_record(r.config)
    # Paths as the spec gives them (relative to its folder): never an absolute path.
    pins = {
        name: {"path": spec.inputs[name].path, "sha256": p.sha256, "kind": p.kind}
        for name, p in r.ctx.inputs.items()
    }
    corpus = r.ctx.corpus
    sources = (
        {f"recipe/{record['recipe_file']}": recipe_file(r.config.recipe)}
        if "recipe_file" in record
        else {}
    )
    save_model_dir(
        r.state.model,
        r.out_dir / MODEL_DIR,
        config=r.config,
        sources=sources,
        extra={
            **r.described,
            **record,
            "corpus_sha256": r.corpus.sha256,
            "corpus": {
                "path": spec.corpus.path if spec.corpus else None,
                "sha256": corpus.sha256,
                "kind": corpus.kind,
            },
            "inputs": pins,
            "run_id": r.run_id,
            "run": r.run,
            "steps": r.state.global_step,
            "metrics": metrics,
        },
    )
