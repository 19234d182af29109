"""The processes of one run as the loop sees them: the ``Ranks`` hooks, ``OneProcess`` (every
run with ``gpus: 1``, the default: each hook a no-op) and ``DataParallelGroup`` (this process's
rank of a data-parallel run, over ``torch.distributed``).

The loop, the setup and the checkpointer call these few hooks at fixed points; for one
process each is a no-op, so the single-process path is the one it was (no process group, no
launcher). The group knows nothing of who started its processes: ``worker.py`` builds it from
the environment torchrun's agent sets (``launch.py`` is that launcher on this machine).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as tdist
from torch.nn.parallel import DistributedDataParallel

from gpucampaign.config import SpecError
from gpucampaign.core.interrupt import stop_requested


class Ranks(Protocol):
    """What the loop asks of the run's processes (one, or the ranks of a data-parallel run)."""

    rank: int
    world_size: int
    #: The rank on this node: which of the node's GPUs (after the lane's) the process takes.
    local_rank: int

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
    local_rank = 0

    @property
    def is_main(self) -> bool:
        return True

    def train_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    def step_totals(self, loss: torch.Tensor, n: int) -> tuple[float, int]:
        return loss.item(), n

    # The function itself, not a method that calls it: the loop asks at every step.
    stop_requested = staticmethod(stop_requested)

    def agree(self, due: bool) -> bool:
        return due

    def gather_rng(self, rng: dict[str, Any]) -> list[dict[str, Any]] | None:
        return None

    def check_resume(self, meta: dict[str, Any]) -> None:
        check_world_size(meta, world_size=1)

    def barrier(self) -> None:
        return None


class DataParallelGroup:
    """This process's rank of a data-parallel run (``torch.distributed``): the ``Ranks`` hooks.

    Args:
        rank: This process's rank (``RANK``).
        world_size: The number of processes (``WORLD_SIZE``).
        local_rank: Its rank on this node (``LOCAL_RANK``): which of the node's GPUs it takes.
        device: This rank's device (``DistributedDataParallel`` puts the model there).
        control: A ``gloo`` group for the small host-side agreements (the step's totals, the
            save decision, the RNG gather): they never wait on a GPU stream.
    """

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        device: torch.device,
        local_rank: int | None = None,
        control: Any = None,
        stop_file: Path | None = None,
    ) -> None:
        self.rank, self.world_size, self.device = rank, world_size, device
        self.local_rank = rank if local_rank is None else local_rank
        self.control = control
        self.stop_file = stop_file
        self._ddp: torch.nn.Module | None = None
        self._stop: str | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def train_model(self, model: torch.nn.Module) -> torch.nn.Module:
        if self._ddp is None:
            ids = [self.device.index] if self.device.type == "cuda" else None
            self._ddp = DistributedDataParallel(model, device_ids=ids)
        return self._ddp

    def step_totals(self, loss: torch.Tensor, n: int) -> tuple[float, int]:
        local = stop_requested() or self._launcher_stop()
        totals = torch.tensor(
            [loss.item() * n, float(n), 1.0 if local else 0.0], dtype=torch.float64
        )
        tdist.all_reduce(totals, group=self.control)
        if totals[2].item() > 0 and self._stop is None:
            self._stop = local or "stop on another rank"
        return totals[0].item() / totals[1].item(), int(totals[1].item())

    def stop_requested(self) -> str | None:
        return self._stop

    def _launcher_stop(self) -> str | None:
        """The stop the launching process asked for (rank 0 reads it; the flag is agreed)."""
        if self.rank != 0 or self.stop_file is None or not self.stop_file.exists():
            return None
        try:
            return self.stop_file.read_text(encoding="utf-8").strip() or "stop"
        except OSError:
            return "stop"

    def agree(self, due: bool) -> bool:
        flag = torch.tensor([1 if due else 0], dtype=torch.int64)
        tdist.broadcast(flag, src=0, group=self.control)
        return bool(flag.item())

    def gather_rng(self, rng: dict[str, Any]) -> list[dict[str, Any]] | None:
        states: list[Any] = [None] * self.world_size
        tdist.all_gather_object(states, rng, group=self.control)
        return states

    def check_resume(self, meta: dict[str, Any]) -> None:
        check_world_size(meta, world_size=self.world_size)

    def barrier(self) -> None:
        tdist.barrier(group=self.control)


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
