"""Records name the machine that wrote them: a run's ``result.json`` and every timeline row
carry ``lot`` (its number among the spec's lots), ``host`` and ``worker``."""

from __future__ import annotations

import json
import socket

import pytest

from gpucampaign.folder.layout import OutputFolder
from gpucampaign.folder.records import read_timeline
from gpucampaign.folder.segments import phase_segment
from gpucampaign.plan.lots import LOT_ENV, WORKER_ENV
from tests.helpers import digits_file, make_spec, run, run_dir  # noqa: F401 - a fixture

TWO_LOTS = [{"gpu": "rtx4090", "days": 3, "count": 2}]


def test_a_run_on_the_second_lots_worker_says_so_in_its_result_and_timeline(
    tmp_path,
    digits_file,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = make_spec(tmp_path, digits_file, packages=TWO_LOTS, control={"epochs": 1})
    monkeypatch.setenv(LOT_ENV, "2")
    monkeypatch.setenv(WORKER_ENV, "box-b-lot-2")
    with phase_segment(
        OutputFolder(tmp_path / "out"),
        spec,
        phase="train",
        step=None,
        run="control",
        durable=lambda _run_id: None,
    ):
        run(spec, tmp_path)
    result = json.loads((run_dir(spec, tmp_path) / "result.json").read_text())
    here = {"lot": 2, "host": socket.gethostname(), "worker": "box-b-lot-2"}
    assert {k: result[k] for k in here} == here
    (row,) = read_timeline(tmp_path / "out")
    assert (row.lot, row.host, row.worker) == (2, here["host"], "box-b-lot-2")


def test_without_a_worker_one_lot_is_named_and_several_are_not(
    tmp_path,
    digits_file,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(LOT_ENV, raising=False)
    monkeypatch.delenv(WORKER_ENV, raising=False)
    for packages, lot in (([{"gpu": "rtx4090", "days": 3}], 1), (TWO_LOTS, None)):
        base = tmp_path / str(lot)
        spec = make_spec(base, digits_file, packages=packages)
        with phase_segment(
            OutputFolder(base / "out"), spec, phase="audit", step=None, durable=lambda _r: None
        ):
            pass
        (row,) = read_timeline(base / "out")
        assert (row.lot, row.worker) == (lot, None)
        assert ("lot" in row.to_dict()) is (lot is not None)  # unknown: left out of the line
