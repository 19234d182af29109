"""The data path: a train split placed in the device's memory (``place_data: device``) gives
the same batches, in the same order, and the same losses as batches cut on the host; its
evaluation splits, placed with it, give the same evaluations and per-example scores. On the
CPU the placement runs through the same code, so these tests check it without a GPU."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from gpucampaign.config import RunConfig, SpecError
from gpucampaign.engine.loop import train_run
from gpucampaign.engine.parts import (
    BatchCopy,
    PermutedBatches,
    RankShard,
    TensorBatches,
    make_loader,
    place_eval_splits,
    place_train_split,
)
from gpucampaign.engine.setup import RunJob, setup_run
from gpucampaign.folder.layout import RunFolder
from gpucampaign.folder.metrics import read_metrics
from gpucampaign.recipe.contract import load_recipe
from gpucampaign.recipe.runtime import PlacedSplit, example_ids, ordered_loader, score_split
from gpucampaign.storage import LocalStore
from tests.helpers import corpus_of, digits_file, make_spec, run, run_dir, train_losses  # noqa: F401

CPU = torch.device("cpu")


def _epochs(loader: DataLoader, n: int) -> list[list[torch.Tensor]]:
    return [
        [torch.cat([t.reshape(len(t), -1).float() for t in b], 1) for b in loader] for _ in range(n)
    ]


@pytest.mark.parametrize("world_size", [1, 2])
def test_placed_batches_are_the_host_batches(world_size):
    """Three epochs of 103 rows at batch 16 (a short last batch): every batch equal, and the
    generator left in the same state after each epoch (the next epoch and a resume draw alike)."""
    g = torch.Generator().manual_seed(0)
    train = TensorDataset(
        torch.randn(103, 5, generator=g), torch.randint(0, 3, (103,), generator=g)
    )
    config = RunConfig(batch_size=16, place_data="device")
    placed = place_train_split(train, config=config, device=CPU)
    assert placed is not None and placed is not train
    loaders, gens = [], []
    for where in (None, placed):
        gen = torch.Generator().manual_seed(7)
        gens.append(gen)
        loaders.append(
            make_loader(
                train,
                config=config,
                generator=gen,
                device=CPU,
                rank=world_size - 1,
                world_size=world_size,
                placed=where,
            )
        )
    host, device = loaders
    sampler = device.sampler
    inner = sampler.batches if isinstance(sampler, RankShard) else sampler
    assert isinstance(inner, PermutedBatches) and inner.device == CPU  # the placed path ran
    assert device.dataset is placed
    a, b = _epochs(host, 3), _epochs(device, 3)
    assert len(a[0]) == len(b[0]) == len(host) == 7
    for ea, eb in zip(a, b, strict=True):
        for x, y in zip(ea, eb, strict=True):
            assert torch.equal(x, y)
    assert torch.equal(gens[0].get_state(), gens[1].get_state())


def test_placed_eval_batches_are_the_host_batches():
    """103 rows at batch 16 in order: the same batches (a list of tensors, the short last one
    too) and IDs as the host's loader collates, and the same draw from torch's global generator
    (the next dropout of the run is the same)."""
    g = torch.Generator().manual_seed(1)
    val = TensorDataset(torch.randn(103, 5, generator=g), torch.randint(0, 3, (103,), generator=g))
    val.ids = [f"r{i}" for i in range(103)]  # type: ignore[attr-defined]
    train = TensorDataset(torch.zeros(8, 5), torch.zeros(8, dtype=torch.long))
    config = RunConfig(batch_size=16, place_data="device")
    placed = place_eval_splits(
        {"train": train, "val": val, "test": TensorDataset(torch.zeros(0, 5)), "extra": val},
        placed_train=place_train_split(train, config=config, device=CPU),
        device=CPU,
    )
    assert set(placed) == {"val"}  # an empty split and other names stay with the recipe
    recipe = load_recipe("mlp")
    batches = []
    for split in (val, placed["val"]):
        torch.manual_seed(3)
        batches.append(list(ordered_loader(recipe, split, config=config)))
        batches.append(torch.rand(4))  # the global generator after the loader's draw
    host, host_rng, device, device_rng = batches
    assert isinstance(placed["val"], PlacedSplit)
    assert [len(b[0]) for b in device] == [16] * 6 + [7]
    for a, b in zip(host, device, strict=True):
        assert type(a) is type(b) is list
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert torch.equal(host_rng, device_rng)
    assert example_ids(placed["val"]) == example_ids(val) == val.ids


def test_eval_splits_follow_the_train_split():
    """Nothing is placed when the train split is not, or for a recipe with its own collate_fn;
    a split that is not a TensorDataset stays on the host."""
    val = TensorDataset(torch.zeros(4, 2))
    train = TensorDataset(torch.zeros(4, 2))
    assert place_eval_splits({"val": val}, placed_train=None, device=CPU) == {}
    assert place_eval_splits({"val": val}, placed_train=train, device=CPU, collate_fn=list) == {}
    kept = place_eval_splits({"val": [1, 2], "test": val}, placed_train=train, device=CPU)
    assert set(kept) == {"test"}


def test_host_and_auto_on_cpu_place_nothing():
    train = TensorDataset(torch.zeros(4, 2))
    assert place_train_split(train, config=RunConfig(place_data="host"), device=CPU) is None
    assert place_train_split(train, config=RunConfig(), device=CPU) is None  # auto: CUDA only


def test_device_placement_of_a_non_tensor_split_is_refused():
    with pytest.raises(SpecError, match="place_data") as err:
        place_train_split(list(range(4)), config=RunConfig(place_data="device"), device=CPU)
    assert err.value.field == "place_data"


def test_batch_copy_on_cpu_is_to_device():
    batch = (torch.arange(3), {"x": torch.ones(2)})
    moved = BatchCopy(CPU)(batch)
    assert BatchCopy(CPU).stream is None
    assert moved[0] is batch[0] and moved[1]["x"] is batch[1]["x"]


def test_a_run_with_its_data_placed_trains_identically(tmp_path, digits_file):  # noqa: F811
    """Same run ID, the same losses bit for bit, with dropout (the global RNG between batches),
    over two epochs; and a placed run interrupted mid-epoch resumes to the same losses."""
    control = {"epochs": 2, "dropout": 0.2}
    host = make_spec(tmp_path, digits_file, control={**control, "place_data": "host"})
    placed = make_spec(tmp_path, digits_file, control={**control, "place_data": "device"})
    assert placed.resolve_run("control").run_id == host.resolve_run("control").run_id
    job = RunJob(
        spec=placed,
        run=placed.resolve_run("control"),
        corpus=corpus_of(tmp_path, placed),
        store=LocalStore(tmp_path / "ck"),
        run_folder=RunFolder.scratch(tmp_path / "setup", "r"),
    )
    r = setup_run(job, t_call=0.0)
    assert r.loader.dataset is not r.datasets["train"]  # the placement path, on the CPU
    assert r.loader.sampler.device == CPU
    assert {k: type(v) for k, v in r.on_device.items()} == {"val": PlacedSplit, "test": PlacedSplit}
    assert r.split("val") is r.on_device["val"] and r.split("train") is r.datasets["train"]
    run(host, tmp_path, out="host")
    run(placed, tmp_path, out="placed")
    a = train_losses(run_dir(host, tmp_path, out="host") / "metrics.jsonl")
    b = train_losses(run_dir(placed, tmp_path, out="placed") / "metrics.jsonl")
    assert len(a) == 20 and a == b
    evals = [
        _evaluations(run_dir(s, tmp_path, out=o)) for s, o in ((host, "host"), (placed, "placed"))
    ]
    assert len(evals[0]) == 4 and evals[0] == evals[1]  # val at each epoch's end, val and test
    run(placed, tmp_path, out="cut", stop_after_steps=13)  # mid-epoch, then a resume
    train_run(
        placed,
        run=placed.resolve_run("control"),
        corpus=corpus_of(tmp_path, placed),
        store=LocalStore(tmp_path / "cut" / "checkpoints"),
        run_folder=RunFolder.of(tmp_path / "cut", placed.resolve_run("control").run_id),
    )
    assert train_losses(run_dir(placed, tmp_path, out="cut") / "metrics.jsonl") == a


def _evaluations(run_folder):
    """The run's ``eval`` rows without their timing."""
    rows = read_metrics(run_folder / "metrics.jsonl")
    return [{k: v for k, v in r.items() if k != "eval_s"} for r in rows if r["kind"] == "eval"]


def test_scores_of_a_placed_split_are_the_host_scores(tmp_path, digits_file):  # noqa: F811
    """The futility check's per-example scores, from the val split placed with the train
    split, equal the host's (IDs and every value), and leave the model in training mode."""
    spec = make_spec(tmp_path, digits_file, control={"place_data": "device"})
    r = setup_run(
        RunJob(
            spec=spec,
            run=spec.resolve_run("control"),
            corpus=corpus_of(tmp_path, spec),
            store=LocalStore(tmp_path / "ck"),
            run_folder=RunFolder.scratch(tmp_path / "setup", "r"),
        ),
        t_call=0.0,
    )
    got = [
        score_split(r.recipe, r.state.model, split, config=r.config, device=CPU)
        for split in (r.datasets["val"], r.split("val"))
    ]
    assert isinstance(r.split("val"), PlacedSplit)
    assert len(got[0][0]) == len(r.datasets["val"]) > 0
    assert got[0] == got[1] and r.state.model.training


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_placed_batches_train_like_host_batches(tmp_path, digits_file):  # noqa: F811
    """On the GPU: the split placed in device memory (auto places it there) and the batches
    copied from pinned memory on a side stream give the same losses, step for step."""
    control = {"epochs": 2, "device": "cuda"}
    host = make_spec(tmp_path, digits_file, control={**control, "place_data": "host"})
    auto = make_spec(tmp_path, digits_file, control=control)
    job = RunJob(
        spec=auto,
        run=auto.resolve_run("control"),
        corpus=corpus_of(tmp_path, auto),
        store=LocalStore(tmp_path / "ck"),
        run_folder=RunFolder.scratch(tmp_path / "setup", "r"),
    )
    r = setup_run(job, t_call=0.0)
    assert r.loader.dataset.tensors[0].is_cuda  # auto placed it
    assert r.split("val").tensors[0].is_cuda and r.split("test").tensors[0].is_cuda
    run(host, tmp_path, out="host")
    run(auto, tmp_path, out="auto")
    a = train_losses(run_dir(host, tmp_path, out="host") / "metrics.jsonl")
    b = train_losses(run_dir(auto, tmp_path, out="auto") / "metrics.jsonl")
    assert len(a) == 20 and a == b
    evals = [_evaluations(run_dir(s, tmp_path, out=o)) for s, o in ((host, "host"), (auto, "auto"))]
    assert len(evals[0]) == 4 and evals[0] == evals[1]


@pytest.mark.parametrize("world_size", [1, 2])
def test_tensor_batches_are_the_loaders(world_size):
    """``TensorBatches`` (the loop's batches without workers) yields what torch's
    ``DataLoader`` over the same sampler yields (a list of tensors, the short last batch too),
    and leaves the generator in the same state after each epoch (issue 47)."""
    g = torch.Generator().manual_seed(2)
    train = TensorDataset(
        torch.randn(103, 5, generator=g), torch.randint(0, 3, (103,), generator=g)
    )
    config = RunConfig(batch_size=16)
    ours = make_loader(
        train,
        config=config,
        generator=torch.Generator().manual_seed(7),
        device=CPU,
        rank=world_size - 1,
        world_size=world_size,
    )
    assert isinstance(ours, TensorBatches)
    gen = torch.Generator().manual_seed(7)
    batches = PermutedBatches(103, batch_size=16, generator=gen)
    sampler = (
        RankShard(batches, rank=world_size - 1, world_size=world_size)
        if world_size > 1
        else batches
    )
    torchs = DataLoader(train, sampler=sampler, batch_size=None, generator=gen)
    for _ in range(3):
        a, b = list(ours), list(torchs)
        assert len(a) == len(b) == len(ours) == 7
        for x, y in zip(a, b, strict=True):
            assert type(x) is type(y) is list
            assert all(torch.equal(u, v) for u, v in zip(x, y, strict=True))
        assert torch.equal(ours.generator.get_state(), gen.get_state())
