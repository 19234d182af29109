"""The loop never waits for the device at a step: train rows wait with their loss on the device
and are written in batches, in order, with the values ``.item()`` gave; the non-finite check
runs on each batch, before any snapshot; the loader's index batches draw what torch's
``RandomSampler`` draws."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset

from gpucampaign.core.stoprules import NonFiniteLoss
from gpucampaign.engine.parts import PermutedBatches
from gpucampaign.folder import metrics as metrics_module
from gpucampaign.folder.metrics import MetricsLog, read_metrics
from gpucampaign.folder.progress import ProgressFile
from tests.helpers import digits_file, make_spec, run, run_dir, train_losses  # noqa: F401


def _rows(n: int) -> list[tuple[dict, torch.Tensor]]:
    losses = torch.tensor([0.1 * (k + 1) for k in range(n)], dtype=torch.float32)
    return [({"kind": "train", "step": k + 1, "epoch": 0, "lr": 0.1}, losses[k]) for k in range(n)]


def test_deferred_rows_are_written_in_order_with_the_exact_values(tmp_path):
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path, every=10)
    rows = _rows(3)
    for row, loss in rows:
        log.defer(row, loss=loss)
    assert log.waiting == 3 and path.read_text() == ""  # nothing written yet
    log.write({"kind": "eval", "step": 3, "accuracy": 0.5})
    log.close()
    got = read_metrics(path)
    assert [r["kind"] for r in got] == ["train", "train", "train", "eval"]
    assert [r["loss"] for r in got[:3]] == [loss.item() for _, loss in rows]


def test_a_batch_is_written_once_every_rows_wait(tmp_path):
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path, every=4)
    for k, (row, loss) in enumerate(_rows(9)):
        log.defer(row, loss=loss)
        written = len(path.read_text().splitlines())
        assert written == 4 * ((k + 1) // 4)
    log.close()
    assert [r["step"] for r in read_metrics(path)] == list(range(1, 10))


def test_the_check_keeps_the_rows_before_the_bad_one_and_drops_the_rest(tmp_path):
    path = tmp_path / "metrics.jsonl"

    def check(row):
        if not math.isfinite(row["loss"]):
            raise ValueError(f"bad at {row['step']}")

    log = MetricsLog(path, check=check, every=100)
    values = [0.5, 0.25, float("nan"), 0.125]
    for k, v in enumerate(values):
        log.defer({"kind": "train", "step": k + 1}, loss=torch.tensor(v))
    with pytest.raises(ValueError, match="bad at 3"):
        log.flush()
    assert log.waiting == 0
    log.close()
    assert [(r["step"], r["loss"]) for r in read_metrics(path)] == [(1, 0.5), (2, 0.25)]


def test_a_training_flushes_its_losses_in_batches_not_at_every_step(
    tmp_path,
    digits_file,  # noqa: F811
    monkeypatch,
):
    """20 steps, one evaluation at the end of each epoch, saves every 10 steps, the live view
    never due: the losses are fetched a handful of times, not 20, and the file is the same as
    one row per step."""
    fetches = []
    fetch = MetricsLog.fetch

    def counted(self):
        rows = fetch(self)
        if trained := sum(1 for r in rows if r.get("kind") == "train"):
            fetches.append(trained)
        return rows

    monkeypatch.setattr(metrics_module.MetricsLog, "fetch", counted)
    monkeypatch.setattr(ProgressFile, "due", lambda self: False)
    spec = make_spec(tmp_path, digits_file, checkpoint={"every_steps": 10, "keep": 2})
    res = run(spec, tmp_path)
    assert res.completed and res.steps_done == 20
    assert sum(fetches) == 20 and len(fetches) <= 4, fetches
    losses = train_losses(run_dir(spec, tmp_path) / "metrics.jsonl")
    assert [s for s, _ in losses] == list(range(1, 21))
    assert all(math.isfinite(v) for _, v in losses)


def test_a_non_finite_loss_is_caught_before_any_checkpoint_holds_it(tmp_path, digits_file):  # noqa: F811
    spec = make_spec(
        tmp_path,
        digits_file,
        control={"optimizer": "sgd", "lr": 1e6, "scheduler": "none", "epochs": 4},
        checkpoint={"every_steps": 1, "keep": 100},
    )
    with pytest.raises(NonFiniteLoss) as exc:
        run(spec, tmp_path)
    e = exc.value
    assert "the last checkpoint precedes it" in e.reason and f"at step {e.step} " in e.reason
    rows = read_metrics(run_dir(spec, tmp_path) / "metrics.jsonl")
    assert [r["step"] for r in rows if r["kind"] == "train"] == list(range(1, e.step))
    saved = [r["step"] for r in rows if r["kind"] == "checkpoint"]
    folder = tmp_path / "out" / "checkpoints" / spec.resolve_run("control").run_id
    latest = json.loads((folder / "LATEST").read_text())["step"] if saved else None
    assert all(s < e.step for s in saved) and (latest is None or latest < e.step)


@pytest.mark.parametrize(("n", "batch"), [(1437, 512), (1024, 512), (10, 3), (5, 8), (1259, 128)])
def test_index_batches_draw_what_random_sampler_draws(n, batch):
    """The same batches, and the generator left in the same state after each epoch (the next
    epoch's order and every checkpoint's generator state depend on it)."""
    ds = TensorDataset(torch.arange(n, dtype=torch.float32) * 0.5, torch.arange(n))
    g_old, g_new = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    old = DataLoader(
        ds,
        sampler=BatchSampler(RandomSampler(ds, generator=g_old), batch_size=batch, drop_last=False),
        batch_size=None,
        generator=g_old,
    )
    new = DataLoader(
        ds,
        sampler=PermutedBatches(n, batch_size=batch, generator=g_new),
        batch_size=None,
        generator=g_new,
    )
    assert len(old) == len(new)
    for _ in range(3):
        a, b = iter(old), iter(new)
        for _ in range(len(old)):  # as the loop: exactly the epoch's batches
            x, y = next(a), next(b)
            assert torch.equal(x[0], y[0]) and torch.equal(x[1], y[1])
        assert torch.equal(g_old.get_state(), g_new.get_state())
