"""The lot's end is a deadline the training keeps: a run on a dated lot saves, verifies its
checkpoint and stops before the end minus the margin; on a later open lot it resumes and ends
bit for bit like an uninterrupted run."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import torch
from safetensors.torch import load_file

from gpucampaign.checkpoint.manager import CheckpointManager
from gpucampaign.config import SpecError, spec_sha256
from gpucampaign.engine.lotend import LotEnded
from gpucampaign.folder.metrics import read_metrics
from gpucampaign.plan.lots import (
    FLOOR_S,
    LOT_ENV,
    SAFETY,
    dated_lots,
    lot_margin_s,
    machine_lot,
    unmeasured_save_s,
)
from gpucampaign.storage import LocalStore
from tests.helpers import digits_file, make_spec, run, run_dir  # noqa: F401 - a fixture
from tests.helpers.lots import lot_clock, lot_packages

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


@pytest.fixture
def clock(monkeypatch):
    yield from lot_clock(monkeypatch, T0)


def _lots(*, first_ends_in_s: float, second: bool) -> list[dict]:
    return lot_packages(now=T0, first_ends_in_s=first_ends_in_s, second=second)


def test_the_run_stops_before_the_lots_end_with_a_verified_checkpoint_then_resumes_on_the_next(
    tmp_path,
    digits_file,  # noqa: F811
    clock,
):
    # 100 steps; the first lot ends 60 s (60 clock reads) after the start.
    spec = make_spec(
        tmp_path,
        digits_file,
        packages=_lots(first_ends_in_s=60, second=True),
        control={"epochs": 10},
        checkpoint={"every_steps": 1000},
    )
    plain = make_spec(tmp_path / "plain", digits_file, control={"epochs": 10})
    whole = run(plain, tmp_path / "plain", out="whole")
    assert whole.completed and whole.steps_done == 100

    with pytest.raises(LotEnded) as got:
        run(spec, tmp_path)
    stop = got.value
    ends = T0 + timedelta(seconds=60)
    # Never into the margin: the last step was taken before the end minus the margin.
    assert stop.lot == 1 and 0 < stop.step < 100 and stop.margin_s >= SAFETY * FLOOR_S
    rows = read_metrics(run_dir(spec, tmp_path) / "metrics.jsonl")
    (end_row,) = [r for r in rows if r["kind"] == "lot_end"]
    assert end_row["step"] == stop.step and end_row["left_s"] > 0
    last_train = max(r["step"] for r in rows if r["kind"] == "train")
    assert last_train == stop.step
    # The clock read after the last step is already inside the margin, the one before is not.
    inside = [t for t in clock.reads if (ends - t).total_seconds() <= stop.margin_s]
    assert inside and (ends - inside[0]).total_seconds() > 0
    # The checkpoint of that step is in the store and verifies; a local store is said not off.
    assert not stop.off_machine and "NOT OFF THE MACHINE" in str(stop)
    manager = CheckpointManager(
        LocalStore(tmp_path / "out" / "checkpoints"),
        run_id=spec.resolve_run("control").run_id,
        config_sha256=spec.resolve_run("control").config_sha256,
    )
    ck, _ = manager.load_latest()
    assert ck is not None and ck.step == stop.step

    # On the second lot (open, ends later) the run resumes and completes, bit for bit.
    rest = run(spec, tmp_path)
    assert rest.completed and rest.resumed_from_step == stop.step
    a = load_file(run_dir(plain, tmp_path / "plain", out="whole") / "model" / "model.safetensors")
    b = load_file(run_dir(spec, tmp_path) / "model" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_run_started_inside_the_margin_trains_nothing(tmp_path, digits_file, clock):  # noqa: F811
    spec = make_spec(
        tmp_path,
        digits_file,
        packages=_lots(first_ends_in_s=30, second=False),
        checkpoint={"lot_end_margin_minutes": 1},
    )
    with pytest.raises(LotEnded) as got:
        run(spec, tmp_path)
    assert got.value.step == 0
    rows = read_metrics(run_dir(spec, tmp_path) / "metrics.jsonl")
    assert not [r for r in rows if r["kind"] == "train"]


def test_the_margin_is_measured_and_widened_by_the_spec():
    base = lot_margin_s(step_s=0.5, save_s=10.0, retrieve_s=4.0, mirror_s=6.0, extra_minutes=0)
    assert base == SAFETY * 20.5
    wider = lot_margin_s(step_s=0.5, save_s=10.0, retrieve_s=4.0, mirror_s=6.0, extra_minutes=5)
    assert wider == base + 300
    # Not yet measured: the first save of 3 GB is taken to be slow, its read-back as slow.
    first = unmeasured_save_s(3_000_000_000)
    assert first >= 150
    assert (
        lot_margin_s(step_s=None, save_s=first, retrieve_s=None, mirror_s=None, extra_minutes=0)
        == SAFETY * 2 * first
    )


def test_the_machines_lot_is_the_pinned_one_else_the_open_one_that_ends_first(
    tmp_path,
    digits_file,  # noqa: F811
):
    spec = make_spec(tmp_path, digits_file, packages=_lots(first_ends_in_s=60, second=True))
    now = T0 + timedelta(seconds=1)
    assert machine_lot(spec, now=now, env={}, ended=frozenset()).number == 1
    assert machine_lot(spec, now=now, env={}, ended=frozenset({1})).number == 2
    assert machine_lot(spec, now=now, env={LOT_ENV: "2"}, ended=frozenset()).number == 2
    with pytest.raises(SpecError, match=LOT_ENV):
        machine_lot(spec, now=now, env={LOT_ENV: "7"}, ended=frozenset())
    # Undated lots: no deadline.
    plain = make_spec(tmp_path / "p", digits_file)
    assert machine_lot(plain, now=now, env={}, ended=frozenset()) is None


def test_a_lots_work_queue_is_kept_and_leaves_the_campaigns_identity_alone(
    tmp_path,
    digits_file,  # noqa: F811
):
    lots = _lots(first_ends_in_s=60, second=True)
    plain = make_spec(tmp_path, digits_file, packages=lots)
    lots[1]["work_queue"] = "lot-2"
    queued = make_spec(tmp_path, digits_file, packages=lots)
    assert [lot.work_queue for lot in dated_lots(queued)] == [None, "lot-2"]
    # Handing a campaign over to another queue keeps its ID (the spec's hash).
    assert spec_sha256(queued) == spec_sha256(plain)
    with pytest.raises(SpecError, match=r"packages\[0\]\.work_queue"):
        make_spec(tmp_path, digits_file, packages=[{**lots[1], "work_queue": ""}])
