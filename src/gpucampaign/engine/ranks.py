"""The processes of one run as the loop sees them: ``OneProcess`` (every run with ``gpus: 1``,
the default) and the interface the data-parallel ranks implement (``distributed.py``).

The loop, the setup and the checkpointer call these few hooks at fixed points; for one
process each is a no-op, so the single-process path is the one it was (no process group, no
launcher).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch

from gpucampaign.core.interrupt import stop_requested
from gpucampaign.folder.layout import RANKS_DIR
from gpucampaign.spec import SpecError


class Ranks(Protocol):
    """What the loop asks of the run's processes (one, or the ranks of a data-parallel run)."""

    rank: int
    world_size: int

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that evaluates and writes the records and checkpoints."""
        ...

    def train_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module the training step calls (``DistributedDataParallel`` around ``model``)."""
        ...

    def step_totals(self, loss: torch.Tensor, n: int) -> tuple[float, int]:
        """The step's loss over all ranks (their weighted mean) and its number of samples.

        Every rank gets the same values: a non-finite loss on one rank stops all of them,
        before the backward pass.
        """
        ...

    def stop_requested(self) -> str | None:
        """The stop request every rank agreed on at this step, or None."""
        ...

    def agree(self, due: bool) -> bool:
        """Rank 0's decision (whether to save this step), the same on every rank."""
        ...

    def gather_rng(self, rng: dict[str, Any]) -> list[dict[str, Any]] | None:
        """Every rank's RNG states, by rank (None for one process: nothing to gather)."""
        ...

    def check_resume(self, meta: dict[str, Any]) -> None:
        """Refuse a checkpoint written by another number of processes."""
        ...

    def barrier(self) -> None:
        """Wait for every rank."""
        ...


class OneProcess:
    """The ranks of a one-process run: every hook a no-op."""

    rank = 0
    world_size = 1

    @property
    def is_main(self) -> bool:
        return True

    def train_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    def step_totals(self, loss: torch.Tensor, n: int) -> tuple[float, int]:
        return loss.item(), n

    def stop_requested(self) -> str | None:
        return stop_requested()

    def agree(self, due: bool) -> bool:
        return due

    def gather_rng(self, rng: dict[str, Any]) -> list[dict[str, Any]] | None:
        return None

    def check_resume(self, meta: dict[str, Any]) -> None:
        check_world_size(meta, world_size=1)

    def barrier(self) -> None:
        return None


def check_world_size(meta: dict[str, Any], *, world_size: int) -> None:
    """Refuse to resume a checkpoint written by another number of processes.

    Its data cursor, sampler shards and per-rank RNG states belong to that number: resumed
    by another, the run would go on from a state it never was in.

    Raises:
        SpecError: The checkpoint's ``world_size`` is not ``world_size``.
    """
    saved = int(meta.get("world_size", 1))
    if saved != world_size:
        raise SpecError(
            f"field 'gpus': the checkpoint of step {meta.get('step')} of run "
            f"{meta.get('run_id')} was written by {saved} process(es), and this start has "
            f"{world_size}; a data-parallel run resumes only with the number of processes it "
            f"started with (its data shards and per-rank RNG states belong to it). Set gpus: "
            f"{saved} to resume it, or start a new run.",
            field="gpus",
        )


def rank_dir(out_dir: Path, rank: int) -> Path:
    """Where a rank writes its own records: the run folder for rank 0, else a private
    folder inside it (``.ranks/<rank>``: its metrics, the same losses as rank 0's)."""
    return out_dir if rank == 0 else out_dir / RANKS_DIR / str(rank)
