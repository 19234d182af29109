"""The train state: everything a checkpoint holds, with its ``state_dict`` and
``load_state_dict`` side by side.

``state_dict()`` has the model's weights under ``model`` (the checkpoint's
``model.safetensors``) and the ``SERIALIZED_ATTRIBUTES`` after it (its ``state.pt``, in that
order). A checkpoint is resumable when ``state.pt`` holds every key of ``REQUIRED_STATE``: the
manager refuses one that does not.

A load applies the model, optimizer, scheduler, scaler, recipe state and counters at once; the
sampler's generator state and the global RNG states wait for ``start_epoch``, which re-draws
the epoch's order, skips the batches already trained on and only then restores the RNGs
(fetching batches must not move them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from gpucampaign.checkpoint.state import capture_rng, restore_rng

MODEL = "model"
#: The components of ``state.pt``, in the order they are written.
SERIALIZED_ATTRIBUTES: tuple[str, ...] = (
    "optimizer",
    "scheduler",
    "scaler",
    "recipe",
    "rng",
    "cursor",
    "counters",
    "hooks",
)
#: What ``state.pt`` must hold to be resumed: each component and the keys it must have.
#: ``recipe``, ``hooks`` and the counters besides ``global_step`` may be absent (checkpoints
#: written before they were kept): they resume with their defaults.
REQUIRED_STATE: dict[str, tuple[str, ...]] = {
    "optimizer": (),
    "scheduler": (),
    "scaler": (),
    "rng": ("python", "numpy", "torch", "cuda"),
    "cursor": ("epoch", "batch_in_epoch", "epoch_generator_state"),
    "counters": ("global_step",),
}


class Stateful(Protocol):
    """Anything with a state of its own to checkpoint (the recipe)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class TrainState:
    """The model, its optimizer, scheduler and scaler, the recipe, the sampler's generator, and
    the data cursor and counters the loop moves.

    ``epoch_gen_state`` is the generator's state at the TOP of the current epoch (before its
    order was drawn): the cursor a checkpoint keeps, with ``batch_in_epoch``.
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    scaler: torch.amp.GradScaler
    recipe: Stateful
    generator: torch.Generator
    global_step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    epoch_gen_state: torch.Tensor | None = None
    samples_seen: int = 0
    steps_s_sum: float = 0.0
    # A data-parallel run (``engine/launch.py``): ``gather_rng`` collects every rank's
    # RNG states (by rank) into the checkpoint, under ``rng["ranks"]``; a load applies this
    # ``rank``'s. Rank 0's states stay at the top of ``rng`` as for one process.
    gather_rng: Callable[[dict[str, Any]], list[dict[str, Any]] | None] | None = None
    rank: int = 0
    # The loop's hooks with a state of their own (their ``state_dict`` by key), set once they
    # are built; a load keeps theirs in ``restored_hooks`` until then.
    hooks: Stateful | None = None
    restored_hooks: dict[str, Any] = field(default_factory=dict)
    # Set by a load; ``start_epoch`` applies them at the top of the resumed epoch.
    _resume_gen_state: torch.Tensor | None = field(default=None, init=False, repr=False)
    _pending_rng: dict[str, Any] | None = field(default=None, init=False, repr=False)

    def state_dict(self) -> dict[str, Any]:
        """The model's weights under ``model``, then ``SERIALIZED_ATTRIBUTES`` in order."""
        return {
            MODEL: self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "scaler": self.scaler.state_dict(),
            "recipe": self.recipe.state_dict(),
            "rng": self._rng(),
            "cursor": {
                "epoch": self.epoch,
                "batch_in_epoch": self.batch_in_epoch,
                "epoch_generator_state": self.epoch_gen_state,
            },
            "counters": {
                "global_step": self.global_step,
                "samples_seen": self.samples_seen,
                "steps_s_sum": self.steps_s_sum,
            },
            "hooks": self.hooks.state_dict() if self.hooks is not None else {},
        }

    def _rng(self) -> dict[str, Any]:
        """This process's RNG states; every rank's under ``ranks`` when data-parallel."""
        rng = capture_rng()
        ranks = self.gather_rng(rng) if self.gather_rng is not None else None
        return rng if ranks is None else {**rng, "ranks": ranks}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned; the generator and the global RNGs wait for
        ``start_epoch``."""
        self.model.load_state_dict(state[MODEL], strict=True)
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        if state["scaler"]:
            self.scaler.load_state_dict(state["scaler"])
        if state.get("recipe"):
            self.recipe.load_state_dict(state["recipe"])
        cursor, counters = state["cursor"], state["counters"]
        self.global_step, self.epoch = int(counters["global_step"]), int(cursor["epoch"])
        self.batch_in_epoch = int(cursor["batch_in_epoch"])
        self._resume_gen_state = cursor["epoch_generator_state"]
        self.samples_seen = int(counters.get("samples_seen", 0))
        self.steps_s_sum = float(counters.get("steps_s_sum", 0.0))
        self.restored_hooks = dict(state.get("hooks") or {})
        rng = state["rng"]
        ranks = rng.get("ranks")
        if ranks is not None:
            if not 0 <= self.rank < len(ranks):
                raise ValueError(
                    f"the checkpoint holds the RNG states of {len(ranks)} rank(s), "
                    f"not of rank {self.rank}"
                )
            rng = ranks[self.rank]
        self._pending_rng = rng

    def start_epoch(self, loader: Iterable[Any]) -> Iterator[Any]:
        """The current epoch's batches; after a load, the same order with the consumed ones
        skipped.

        The sampler's generator goes back to its state at the top of the epoch, so the epoch's
        order is drawn again and the batches already trained on are fetched and dropped. The
        global RNGs are restored after that skip: fetching batches must not move them.
        """
        skip = 0
        if self._resume_gen_state is not None:
            self.generator.set_state(self._resume_gen_state)
            skip, self._resume_gen_state = self.batch_in_epoch, None
        self.epoch_gen_state = self.generator.get_state()
        if self._pending_rng is not None and skip == 0:
            restore_rng(self._pending_rng)
            self._pending_rng = None
        batches = iter(loader)
        for _ in range(skip):
            next(batches)
        if self._pending_rng is not None:
            restore_rng(self._pending_rng)
            self._pending_rng = None
        self.batch_in_epoch = skip
        return batches
