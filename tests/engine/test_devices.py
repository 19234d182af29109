"""Devices per run: ``device: auto|cpu|cuda|cuda:N``, one GPU per lane, recorded in params.
The GPU tests skip cleanly without CUDA."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gpucampaign.config import RunConfig, SpecError
from gpucampaign.engine.devices import device_settings, pick_device
from tests.recipe.test_recipe import make_spec, train, write_recipe

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
needs_two = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")


def test_the_device_field_takes_auto_cpu_cuda_and_an_index() -> None:
    for ok in ("auto", "cpu", "cuda", "cuda:1"):
        assert RunConfig(device=ok).device == ok
    with pytest.raises(ValueError):
        RunConfig(device="gpu0")


def test_cpu_is_always_there_and_a_missing_gpu_is_a_clear_error() -> None:
    assert pick_device("cpu") == torch.device("cpu")
    assert device_settings(torch.device("cpu")) == {"device": "cpu", "device_type": "cpu"}
    if not torch.cuda.is_available():
        assert pick_device("auto", lane=1) == torch.device("cpu")
        with pytest.raises(SpecError, match="not available"):
            pick_device("cuda:0")


def test_a_cpu_run_records_its_device(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, write_recipe(tmp_path), control={"device": "cpu"}, variants=[])
    res = train(spec, tmp_path)
    params = json.loads((tmp_path / "out" / "runs" / res.run_id / "params.json").read_text())
    assert params["device"] == "cpu" and res.device == "cpu"


@pytest.mark.gpu
@needs_cuda
def test_a_recipe_trains_on_cuda_in_bf16_and_records_it(tmp_path: Path) -> None:
    spec = make_spec(
        tmp_path,
        write_recipe(tmp_path),
        control={"device": "cuda", "precision": "bf16"},
        variants=[],
    )
    res = train(spec, tmp_path)
    params = json.loads((tmp_path / "out" / "runs" / res.run_id / "params.json").read_text())
    assert res.completed and params["device"] == "cuda:0" and params["cudnn_deterministic"]
    assert res.metrics["mse"] < 10


@pytest.mark.gpu
@needs_cuda
def test_the_lane_picks_the_gpu() -> None:
    count = torch.cuda.device_count()
    assert pick_device("auto", lane=0) == torch.device("cuda", 0)
    assert pick_device("auto", lane=1) == torch.device("cuda", 1 % count)
    assert pick_device("cuda:0", lane=1) == torch.device("cuda", 0)


@pytest.mark.gpu
@needs_two
def test_two_lanes_train_on_two_gpus(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, write_recipe(tmp_path), variants=[])
    res = train(spec, tmp_path, lane=1)
    params = json.loads((tmp_path / "out" / "runs" / res.run_id / "params.json").read_text())
    assert params["device"] == "cuda:1"


@pytest.mark.gpu
@needs_cuda
def test_the_restart_check_on_cuda_is_within_tolerance(tmp_path: Path) -> None:
    from gpucampaign.restartcheck.check import verify_restart

    spec = make_spec(tmp_path, write_recipe(tmp_path), control={"device": "cuda"}, variants=[])
    report = verify_restart(
        spec, run=spec.resolve_run("control"), base_dir=tmp_path, workdir=tmp_path / "rc"
    )
    assert report.identical and report.device == "cuda"


def test_a_run_keeps_its_own_global_generators_while_another_run_takes_them():
    """Two runs of one process (GPU lanes as threads) take turns with the global generators:
    each one's draws, and the states its checkpoint captures, are those it would have alone."""
    import random

    import numpy as np

    from gpucampaign.checkpoint.state import capture_rng
    from gpucampaign.engine.devices import RngSlot, seed_everything

    def draws() -> tuple:
        return (random.random(), float(np.random.rand()), float(torch.rand(1)))

    def alone(seed: int) -> tuple:
        seed_everything(seed)
        first = draws()
        second = draws()
        return first, second, capture_rng()["torch"]

    want_a, want_b = alone(1), alone(2)
    a, b = RngSlot(), RngSlot()
    with a.held():
        seed_everything(1)
        a_first = draws()
    with b.held():  # another run starts in between: it reseeds the globals
        seed_everything(2)
        b_first = draws()
    with a.held():
        a_second = draws()
        a_state = capture_rng()["torch"]
    with b.held():
        b_second = draws()
        b_state = capture_rng()["torch"]
    assert (a_first, a_second) == want_a[:2] and torch.equal(a_state, want_a[2])
    assert (b_first, b_second) == want_b[:2] and torch.equal(b_state, want_b[2])
