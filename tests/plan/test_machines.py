"""Machines from the spec: each lot of ``packages`` is a machine with its GPUs, the plan's lanes
belong to machines, and ``campaign plan`` says which (``lot 2 / gpu0``)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gpucampaign.cli import app
from gpucampaign.config import SpecError, load_spec
from gpucampaign.plan import calendar
from gpucampaign.plan.lots import LOT_ENV, dated_lots, ended_lot, machine_lot, pin_lane_lot
from gpucampaign.plan.machines import lane_machine, one_process_line
from tests.plan.test_multi_gpu_plan import spec_file

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
runner = CliRunner()


def test_two_lots_are_two_machines_of_one_gpu_each() -> None:
    plan = calendar.plan(load_spec(EXAMPLES / "two-lots.yaml"))
    assert [m.to_dict() for m in plan.machines] == [
        {
            "lot": 1,
            "package": 1,
            "gpu": "rtx4090",
            "gpus": 1,
            "lanes": ["gpu0"],
            "work_queue": "lot-1",
        },
        {
            "lot": 2,
            "package": 1,
            "gpu": "rtx4090",
            "gpus": 1,
            "lanes": ["gpu1"],
            "work_queue": "lot-2",
        },
    ]
    where = {s.name: plan.machine(s) for s in plan.steps}
    # The second lane is the second machine's only GPU; host and human steps are on none.
    assert where["control"] == "lot 1 / gpu0" and where["dropout"] == "lot 2 / gpu0"
    assert where["prep"] == where["load"] == ""
    assert plan.machines[1].gpu_limit("gpu") == "gpu:2"


def test_a_b200_lot_is_one_machine_with_two_gpus_beside_a_4090_lot(tmp_path: Path) -> None:
    path = spec_file(
        tmp_path, [{"gpu": "rtx4090", "days": 3}, {"gpu": "b200", "days": 3, "price_usd": 900}]
    )
    result = runner.invoke(app, ["plan", str(path), "--json"])
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    assert [(m["lot"], m["package"], m["lanes"]) for m in d["machines"]] == [
        (1, 1, ["gpu0"]),
        (2, 2, ["gpu1", "gpu2"]),
    ]
    steps = {s["name"]: s for s in d["steps"]}
    assert steps["train-control"]["machine"] == "lot 2 / gpu0+gpu1"  # both GPUs of the b200
    assert steps["train-wider"]["machine"] == "lot 1 / gpu0"
    assert steps["prep"]["machine"] == ""


def test_lots_of_one_package_number_on_and_share_its_queue(tmp_path: Path) -> None:
    path = spec_file(
        tmp_path,
        [
            {"gpu": "b200", "days": 3, "price_usd": 900},
            {"gpu": "rtx4090", "days": 3, "count": 2, "work_queue": "cheap"},
        ],
    )
    machines = calendar.plan(load_spec(path)).machines
    assert [(m.number, m.package, m.lanes, m.work_queue) for m in machines] == [
        (1, 1, (0, 1), "lot-1"),
        (2, 2, (2,), "cheap"),
        (3, 2, (3,), "cheap"),
    ]
    assert lane_machine(machines, "gpu3") == "lot 3 / gpu0"
    assert lane_machine(machines, "gpu1") == "lot 1 / gpu1"
    assert lane_machine(machines, "gpu9") == lane_machine(machines, "host0") == ""


def test_campaign_plan_shows_each_lane_on_its_machine_and_where_they_run(tmp_path: Path) -> None:
    result = runner.invoke(app, ["plan", str(EXAMPLES / "two-lots.yaml")])
    assert result.exit_code == 0, result.output
    rows = {line.split("│")[1].strip(): line for line in result.output.splitlines() if "│" in line}
    assert "lot 2 / gpu0" in rows["dropout"] and "lot 1 / gpu0" in rows["control"]
    text = " ".join(result.output.split())
    assert "2 machines planned" in text and "lanes of one process on this machine" in text
    assert "storage.url: s3://" in text
    # One machine: nothing to say.
    one = yaml.safe_load((EXAMPLES / "two-lots.yaml").read_text())
    one["packages"][0]["count"] = 1
    path = tmp_path / "one.yaml"
    path.write_text(yaml.safe_dump(one))
    machines = calendar.plan(load_spec(path)).machines
    assert one_process_line(machines, distributed=False) is None


def test_a_worker_of_the_second_lot_of_an_undated_package_trains_without_a_deadline() -> None:
    # `campaign worker --lot 2` sets GPUCAMPAIGN_LOT=2: the second of `count: 2` lots, undated.
    spec = load_spec(EXAMPLES / "two-lots.yaml")
    now = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
    for pinned in ("1", "2"):
        env = {LOT_ENV: pinned}
        assert machine_lot(spec, now=now, env=env, ended=frozenset()) is None
        assert ended_lot(spec, now=now, env=env, ended=frozenset()) is None
    with pytest.raises(SpecError, match="names no lot of the spec's 'packages' \\(2 lot"):
        machine_lot(spec, now=now, env={LOT_ENV: "3"}, ended=frozenset())


def test_dated_lots_are_numbered_as_the_plans_machines(tmp_path: Path) -> None:
    starts = "2026-03-02T09:00:00Z"
    path = spec_file(
        tmp_path,
        [
            {"gpu": "b200", "days": 3, "price_usd": 900, "count": 2, "starts_at": starts},
            {"gpu": "rtx4090", "days": 7, "starts_at": starts, "order_ref": "late"},
        ],
    )
    spec = load_spec(path)
    assert [lot.number for lot in dated_lots(spec)] == [1, 2, 3]
    assert [m.number for m in calendar.plan(spec).machines] == [1, 2, 3]
    now = datetime(2026, 3, 3, tzinfo=UTC)
    third = machine_lot(spec, now=now, env={LOT_ENV: "3"}, ended=frozenset())
    assert third is not None and third.ends_at == datetime(2026, 3, 9, 9, 0, tzinfo=UTC)
    assert machine_lot(spec, now=now, env={LOT_ENV: "late"}, ended=frozenset()).number == 3
    assert machine_lot(spec, now=now, env={LOT_ENV: "2"}, ended=frozenset()).number == 2


def test_a_lanes_process_is_pinned_to_its_lot_unless_its_worker_pinned_one(tmp_path: Path) -> None:
    """A lane's flow run pins its process to the lane's lot when its worker set nothing (a
    plain `prefect worker start` on lot 2's queue): before, it took the open lot that ends
    first, lot 1, for its timeline rows and its deadline. A worker's own pin stays (by number
    or order_ref): the machine says best where it runs."""
    starts = "2026-03-02T09:00:00Z"
    path = spec_file(
        tmp_path,
        [
            {"gpu": "b200", "days": 3, "price_usd": 900, "starts_at": starts},
            {"gpu": "b200", "days": 7, "price_usd": 900, "starts_at": starts, "order_ref": "b"},
        ],
    )
    spec = load_spec(path)
    now = datetime(2026, 3, 3, tzinfo=UTC)
    env: dict[str, str] = {}
    assert machine_lot(spec, now=now, env=env, ended=frozenset()).number == 1  # ends first
    assert pin_lane_lot(spec, lot=2, env=env) == 2
    assert env == {LOT_ENV: "2"}
    assert machine_lot(spec, now=now, env=env, ended=frozenset()).number == 2
    for pin, number in (("2", 2), ("b", 2), ("1", 1)):
        pinned = {LOT_ENV: pin}
        assert pin_lane_lot(spec, lot=2, env=pinned) == number and pinned == {LOT_ENV: pin}
    with pytest.raises(SpecError, match="names no lot"):
        pin_lane_lot(spec, lot=2, env={LOT_ENV: "7"})


def test_campaign_run_says_its_machines_run_as_lanes_of_its_one_process(tmp_path: Path) -> None:
    from gpucampaign.cli.commands import _before_the_start
    from gpucampaign.preflight import open_campaign

    spec = EXAMPLES / "two-lots.yaml"
    said = _before_the_start(spec, open_campaign(spec, tmp_path / "out"), decision=None)
    (line,) = [s for s in said if "machines" in s]
    assert line.startswith("2 machines planned (lot 1 (queue lot-1), lot 2 (queue lot-2))")
    assert "lanes of one process on this machine" in line
    assert not (tmp_path / "out").exists()  # said before anything is written
