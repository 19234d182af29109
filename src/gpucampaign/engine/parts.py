"""Pieces of the training loop that need none of its state: the run folder's params, the
training batches and the progress bar."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, Sampler, TensorDataset

from gpucampaign.config import ResolvedRun, RunConfig, SpecError
from gpucampaign.folder.layout import RunFolder
from gpucampaign.recipe.runtime import PlacedSplit, to_device, train_rows

#: ``place_data: auto`` places a train split on a CUDA device when it takes at most this
#: share of the device's free memory (the model, its optimizer and activations need the rest).
PLACE_SHARE = 0.25


def read_params(run_folder: RunFolder) -> dict[str, Any]:
    """A run folder's ``params.json`` (empty when the run never started)."""
    path = run_folder.params
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def n_train_of(run_folder: RunFolder, *, run: ResolvedRun, corpus: Any) -> int:
    """Examples in the run's train split: as ``params.json`` recorded, else counted."""
    recorded = read_params(run_folder).get("n_train")
    return int(recorded) if recorded is not None else train_rows(run, corpus=corpus)


class RankShard:
    """One rank's part of each global batch: indices ``rank, rank + world, ...`` of it.

    Every rank draws the same global order from the same seeded generator, so the data cursor
    (the generator's state at the top of the epoch, and ``batch_in_epoch``) is the same on
    every rank. A last batch shorter than the number of ranks gives a rank with nothing its
    row ``rank mod len`` again (a step is never empty).
    """

    def __init__(self, batches: Iterable[Any], *, rank: int, world_size: int) -> None:
        self.batches, self.rank, self.world_size = batches, rank, world_size

    def __iter__(self) -> Iterator[Any]:
        for batch in self.batches:  # lists of ints, or index tensors (PermutedBatches)
            part = batch[self.rank :: self.world_size]
            yield part if len(part) else batch[self.rank % len(batch) :][:1]

    def __len__(self) -> int:
        return len(self.batches)  # type: ignore[arg-type]


class PermutedBatches(Sampler[torch.Tensor]):
    """The batches of ``BatchSampler(RandomSampler(n, generator=g), batch_size)`` as index
    tensors: the same permutation from the same generator draws, cut the same way.

    ``RandomSampler`` draws a second permutation (and drops it) when it runs out: drawn here at
    the same point (before the last, partial batch; after the last full one), so the
    generator's state, and with it every later epoch's order, stays what it was.
    """

    def __init__(
        self,
        n: int,
        *,
        batch_size: int,
        generator: torch.Generator,
        device: torch.device | None = None,
    ) -> None:
        self.n, self.batch_size, self.generator = n, batch_size, generator
        self.device = device  # where each epoch's order goes, once (a placed train split)

    def __len__(self) -> int:
        return -(-self.n // self.batch_size)

    def __iter__(self) -> Iterator[torch.Tensor]:
        order = self._order()
        full = self.n // self.batch_size
        for i in range(full):
            yield order[i * self.batch_size : (i + 1) * self.batch_size]
        torch.randperm(self.n, generator=self.generator)  # RandomSampler's draw on running out
        if self.n % self.batch_size:
            yield order[full * self.batch_size :]

    def batches(self) -> tuple[torch.Tensor, ...]:
        """The epoch's batches at once (views of one permutation): the same draws as
        ``__iter__``'s, the second one made now rather than before the last batch. The
        generator's state is the same at the epoch's end; nothing reads it in between (a
        checkpoint keeps its state at the top of the epoch)."""
        order = self._order()
        torch.randperm(self.n, generator=self.generator)  # RandomSampler's draw on running out
        return order.split(self.batch_size)

    def _order(self) -> torch.Tensor:
        order = torch.randperm(self.n, generator=self.generator)
        if self.device is not None:
            # One copy per epoch, never one per step: the batches are cut on the device.
            pinned = order.pin_memory() if self.device.type == "cuda" else order
            order = pinned.to(self.device, non_blocking=True)
        return order


class TensorBatches:
    """What ``DataLoader(dataset, sampler=batches, batch_size=None, generator=g)`` yields
    without workers (a list of the dataset's tensors cut by each index tensor), without the
    loader's machinery at every batch: the training loop's cost per step (issue 47).

    The same draws in the same order: each epoch's iterator draws the workers' base seed from
    ``generator`` first (as torch's does, workers or not), then the sampler draws its order,
    so the generator's state, and with it every later epoch and a resume, is the loader's.
    """

    def __init__(self, dataset: TensorDataset, sampler: Any, *, generator: torch.Generator):
        self.dataset, self.sampler, self.generator = dataset, sampler, generator

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[list[torch.Tensor]]:
        sampler, dataset = self.sampler, self.dataset
        if (
            type(sampler) is PermutedBatches
            and type(dataset).__getitem__ is TensorDataset.__getitem__
            and len(dataset.tensors) == 2
        ):
            # (features, labels) cut by built-ins (no Python call at a step: no generator to
            # resume). The draws are made here rather than at the first batch: nothing else
            # draws from the generator in between (a checkpoint keeps its state at the top of
            # the epoch, taken before).
            torch.empty((), dtype=torch.int64).random_(generator=self.generator)  # base seed
            order = sampler.batches()
            x, y = dataset.tensors
            return map(list, zip(map(x.__getitem__, order), map(y.__getitem__, order), strict=True))
        return self._batches()

    def _batches(self) -> Iterator[list[torch.Tensor]]:
        """The batches one at a time, as torch's loader draws and cuts them."""
        sampler = self.sampler
        # PermutedBatches' batches drawn at once: one call at each step rather than two.
        whole = type(sampler) is PermutedBatches
        order = iter(()) if whole else iter(sampler)  # as torch's: iterated before the seed
        torch.empty((), dtype=torch.int64).random_(generator=self.generator)  # the base seed
        if whole:
            order = iter(sampler.batches())
        dataset = self.dataset
        if type(dataset).__getitem__ is not TensorDataset.__getitem__:
            for idx in order:
                yield list(dataset[idx])
            return
        tensors = dataset.tensors  # its tensors, cut here
        if len(tensors) == 2:  # (features, labels): the built-in recipes', no list built
            x, y = tensors
            for idx in order:
                yield [x[idx], y[idx]]
        else:
            for idx in order:
                yield [t[idx] for t in tensors]


def close_loader(loader: Any) -> None:
    """Stop the worker processes a loader keeps between epochs (``persistent_workers``).

    Left to the garbage collector, they are shut down in whatever code runs then: the
    collection closes their queues first, and torch then waits 5 s for each worker before it
    terminates it.
    """
    it = getattr(loader, "_iterator", None)  # torch keeps the persistent workers' iterator there
    if it is not None and hasattr(it, "_shutdown_workers"):
        it._shutdown_workers()
        loader._iterator = None


def place_train_split(
    train: Any, *, config: RunConfig, device: torch.device, collate_fn: Any = None
) -> TensorDataset | None:
    """The train split's tensors in the device's memory, when ``place_data`` asks for it (or
    ``auto`` finds room on a CUDA device); None when its batches are cut on the host.

    On the CPU, ``place_data: device`` goes through the same code (the tensors stay where they
    are): the batches and the losses are the same as the host's, which the tests check.

    Raises:
        SpecError: ``place_data: device`` for a split that is not a ``TensorDataset`` (or a
            recipe with its own ``collate_fn``).
    """
    mode = config.place_data
    tensors = isinstance(train, TensorDataset) and collate_fn is None
    if mode == "host" or (mode == "auto" and not (tensors and fits_on_device(train, device))):
        return None
    if not tensors:
        raise SpecError(
            f"field 'place_data': 'device' needs a train split that is a torch TensorDataset "
            f"and a recipe without collate_fn (recipe '{config.recipe}' gives "
            f"{type(train).__name__}); return a TensorDataset from datasets(), or set "
            "place_data: auto.",
            field="place_data",
        )
    return TensorDataset(*(t.to(device) for t in train.tensors))


def place_eval_splits(
    datasets: dict[str, Any],
    *,
    placed_train: TensorDataset | None,
    device: torch.device,
    collate_fn: Any = None,
    splits: tuple[str, ...] = ("val", "test"),
) -> dict[str, PlacedSplit]:
    """The evaluation splits in the device's memory, once, when the train split is placed
    there: every evaluation during the run, the final one and the futility scores read them
    without copying a batch in. A split that is not a ``TensorDataset`` (or a recipe with its
    own ``collate_fn``) stays on the host, as does every split when they would not fit
    beside the train split on a CUDA device (their bytes and the train split's over
    ``PLACE_SHARE`` of the memory that was free before the train split was placed).
    """
    if placed_train is None or collate_fn is not None:
        return {}
    chosen = {
        name: ds
        for name in splits
        if isinstance(ds := datasets.get(name), TensorDataset) and len(ds) > 0
    }
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        train_bytes = _bytes(placed_train)
        if train_bytes + sum(map(_bytes, chosen.values())) > PLACE_SHARE * (free + train_bytes):
            return {}
    return {
        name: PlacedSplit(tuple(t.to(device) for t in ds.tensors), ids=getattr(ds, "ids", None))
        for name, ds in chosen.items()
    }


def _bytes(split: TensorDataset) -> int:
    return sum(t.numel() * t.element_size() for t in split.tensors)


def fits_on_device(train: TensorDataset, device: torch.device) -> bool:
    """Whether a train split's tensors take at most ``PLACE_SHARE`` of a CUDA device's free
    memory (never on another device: there the host is the device)."""
    if device.type != "cuda":
        return False
    free, _total = torch.cuda.mem_get_info(device)
    return _bytes(train) <= PLACE_SHARE * free


class BatchCopy:
    """Moves each batch to the device. On CUDA the copy (from the loader's pinned memory) runs
    on a side stream, so it overlaps the steps the device is still running, and the training
    stream waits for it before it reads the batch; elsewhere it is ``to_device``.

    The batches are fetched where they always were (a fetch may draw from the global RNG, a
    recipe's augmentation): only the copy moves off the training stream.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def __call__(self, batch: Any) -> Any:
        """``batch`` on the device, ready for the training stream."""
        if self.stream is None:
            return to_device(batch, self.device)
        with torch.cuda.stream(self.stream):
            moved = to_device(batch, self.device)
        current = torch.cuda.current_stream(self.device)
        current.wait_stream(self.stream)
        for t in _tensors(moved):
            if t.is_cuda:
                t.record_stream(current)  # its memory is not reused before the step is done
        return moved


def _tensors(batch: Any) -> Iterator[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, dict):
        for v in batch.values():
            yield from _tensors(v)
    elif isinstance(batch, list | tuple):
        for v in batch:
            yield from _tensors(v)


def make_loader(
    train: Any,
    *,
    config: RunConfig,
    generator: torch.Generator,
    device: torch.device,
    collate_fn: Any = None,
    rank: int = 0,
    world_size: int = 1,
    placed: TensorDataset | None = None,
) -> DataLoader | TensorBatches:
    """The training batches, shuffled by ``generator``; with ``world_size`` > 1, this
    ``rank``'s share of each global batch of ``batch_size`` rows (``RankShard``).

    A ``TensorDataset`` is indexed one batch at a time by a tensor of indices
    (``PermutedBatches``: one gather per tensor, instead of a fetch per row and a stack, or a
    list of ints turned into a tensor at every step): the same draws as torch's
    ``RandomSampler``, so the batches are the same values. The sampler stays in this process;
    workers only fetch batches. ``placed`` (``place_train_split``): the same split in the
    device's memory, cut there by the same draws (each epoch's order copied in once), in this
    process. Without worker processes nor pinned memory, those are ``TensorBatches``: the
    same batches without the loader's work at every step.
    """
    if placed is not None:
        on_device: Any = PermutedBatches(
            len(placed), batch_size=config.batch_size, generator=generator, device=device
        )
        if world_size > 1:
            on_device = RankShard(on_device, rank=rank, world_size=world_size)
        return TensorBatches(placed, on_device, generator=generator)
    kw: dict[str, Any] = {
        "num_workers": config.num_workers,
        "pin_memory": device.type == "cuda",
        "persistent_workers": config.persistent_workers and config.num_workers > 0,
    }
    if isinstance(train, TensorDataset) and collate_fn is None:
        batches: Any = PermutedBatches(
            len(train), batch_size=config.batch_size, generator=generator
        )
        if world_size > 1:
            batches = RankShard(batches, rank=rank, world_size=world_size)
        # The generator also draws each epoch's base seed, as with shuffle=True: the global
        # torch RNG (dropout) is left alone.
        if config.num_workers == 0 and not kw["pin_memory"]:
            return TensorBatches(train, batches, generator=generator)
        return DataLoader(train, sampler=batches, batch_size=None, generator=generator, **kw)
    if world_size > 1:
        # What shuffle=True builds, with this rank's share of each batch.
        shard = RankShard(
            BatchSampler(
                RandomSampler(train, generator=generator),
                batch_size=config.batch_size,
                drop_last=False,
            ),
            rank=rank,
            world_size=world_size,
        )
        return DataLoader(
            train, batch_sampler=shard, generator=generator, collate_fn=collate_fn, **kw
        )
    return DataLoader(
        train,
        batch_size=config.batch_size,
        shuffle=True,
        generator=generator,
        collate_fn=collate_fn,
        **kw,
    )


def progress_bar(show: bool, run_id: str, total: int, done: int) -> Any:
    """A started rich progress bar, or None when not asked for or not interactive."""
    if not show:
        return None
    # rich's progress bar only when one is shown
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
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    )
    bar.add_task(run_id, total=total, completed=done)
    bar.start()
    return bar
