"""The data path: a train split placed in the device's memory (``place_data: device``) gives
the same batches, in the same order, and the same losses as batches cut on the host; on the
CPU the placement runs through the same code, so these tests check it without a GPU."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from gpucampaign.engine.loop import train_run
from gpucampaign.engine.parts import (
    BatchCopy,
    PermutedBatches,
    RankShard,
    make_loader,
    place_train_split,
)
from gpucampaign.engine.setup import RunJob, setup_run
from gpucampaign.spec import RunConfig, SpecError
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
        out_dir=tmp_path / "setup",
    )
    r = setup_run(job, t_call=0.0)
    assert r.loader.dataset is not r.datasets["train"]  # the placement path, on the CPU
    assert r.loader.sampler.device == CPU
    run(host, tmp_path, out="host")
    run(placed, tmp_path, out="placed")
    a = train_losses(run_dir(host, tmp_path, out="host") / "metrics.jsonl")
    b = train_losses(run_dir(placed, tmp_path, out="placed") / "metrics.jsonl")
    assert len(a) == 20 and a == b
    run(placed, tmp_path, out="cut", stop_after_steps=13)  # mid-epoch, then a resume
    train_run(
        placed,
        run=placed.resolve_run("control"),
        corpus=corpus_of(tmp_path, placed),
        store=LocalStore(tmp_path / "cut" / "checkpoints"),
        out_dir=run_dir(placed, tmp_path, out="cut"),
    )
    assert train_losses(run_dir(placed, tmp_path, out="cut") / "metrics.jsonl") == a


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
        out_dir=tmp_path / "setup",
    )
    r = setup_run(job, t_call=0.0)
    assert r.loader.dataset.tensors[0].is_cuda  # auto placed it
    run(host, tmp_path, out="host")
    run(auto, tmp_path, out="auto")
    a = train_losses(run_dir(host, tmp_path, out="host") / "metrics.jsonl")
    b = train_losses(run_dir(auto, tmp_path, out="auto") / "metrics.jsonl")
    assert len(a) == 20 and a == b
