"""The runs' GPU lanes come from the plan's placement, not from dealing them round-robin."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpucampaign.cli.scaffold import init_campaign
from gpucampaign.config import CampaignSpec, load_spec
from gpucampaign.core.stoprules import BelowThreshold, NonFiniteLoss, NoUsableRestart
from gpucampaign.plan import calendar
from gpucampaign.plan.lanes import RESTART_CHECK, lane_chains, lane_order, planned_lanes
from gpucampaign.plan.stopping import campaign_stop, essential_pilot_stops, stop_effect


def two_gpu_spec(tmp_path: Path, **edit: object) -> CampaignSpec:
    """`campaign init`'s campaign on one lot of two GPUs: two GPU lanes."""
    path = init_campaign(tmp_path / "spec")
    data = yaml.safe_load(path.read_text())
    data["packages"] = [{"gpu": "rtx4090", "days": 3, "count": 2}]
    data.update(edit)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_spec(path)


def round_robin(cs: CampaignSpec, lanes: int) -> list[list[str | None]]:
    """What the flow did before: essential runs, the restart check, the others, dealt in turn."""
    essential = cs.essential_runs()
    order = [*essential, None, *(r for r in cs.runs_by_tier() if r not in essential)]
    return [order[lane::lanes] for lane in range(lanes)]


def test_two_lanes_follow_the_plan_where_round_robin_differs(tmp_path: Path) -> None:
    cs = two_gpu_spec(tmp_path)
    plan = calendar.plan(cs)
    assert plan.gpu_lanes == 2
    # The plan: control, then the restart check and bf16 on gpu0; lr-high and short on gpu1.
    steps = {s.name: s.lane for s in plan.steps}
    assert steps["train-control"] == steps["restart-check"] == steps["train-bf16"] == "gpu0"
    assert steps["train-lr-high"] == steps["train-short"] == "gpu1"
    chains = lane_chains(plan, spec=cs)
    assert chains == [["control", RESTART_CHECK, "bf16"], ["lr-high", "short"]]
    assert chains != round_robin(cs, 2)  # [control, lr-high, short], [restart, bf16]
    # Each chain is its lane's steps in the plan's start order.
    starts = planned_lanes(plan)
    for lane, chain in enumerate(chains):
        assert [starts[item][0] for item in chain] == [lane] * len(chain)
        assert [starts[item][1] for item in chain] == sorted(starts[item][1] for item in chain)


def test_the_submission_order_keeps_each_chain_and_the_essentials_first(tmp_path: Path) -> None:
    cs = two_gpu_spec(tmp_path)
    order = lane_order(calendar.plan(cs), spec=cs)
    assert order[0] == (0, "control")  # before the restart check that resumes its save
    assert order.index((0, RESTART_CHECK)) < order.index((0, "bf16"))
    assert order.index((1, "lr-high")) < order.index((1, "short"))


def test_a_dropped_run_leaves_its_lane_and_the_others_keep_theirs(tmp_path: Path) -> None:
    cs = two_gpu_spec(tmp_path)
    chains = lane_chains(calendar.plan(cs), spec=cs, dropped=["lr-high"])
    assert chains == [["control", RESTART_CHECK, "bf16"], ["short"]]


def test_work_the_calendar_does_not_place_is_dealt_round_robin(tmp_path: Path) -> None:
    data = yaml.safe_load(init_campaign(tmp_path / "spec").read_text())
    steps = [
        {k: v for k, v in s.items() if k != "run" and (k, v) != ("phase", "restart")}
        for s in data["calendar"]
    ]
    cs = two_gpu_spec(tmp_path / "unplaced", calendar=steps)
    assert planned_lanes(calendar.plan(cs)) == {}
    assert lane_chains(calendar.plan(cs), spec=cs) == round_robin(cs, 2)


def test_one_lane_keeps_essentials_then_the_restart_check_then_the_rest(tmp_path: Path) -> None:
    cs = two_gpu_spec(tmp_path, packages=[{"gpu": "rtx4090", "days": 3}])
    assert lane_chains(calendar.plan(cs), spec=cs) == [
        ["control", RESTART_CHECK, "lr-high", "bf16", "short"]
    ]


@pytest.mark.parametrize(
    ("run", "stop", "effect"),
    [
        ("control", NonFiniteLoss("c", "nan"), "ends"),
        ("control", BelowThreshold("c", "low"), "evidence"),
        ("lr-high", NonFiniteLoss("v", "nan"), "recorded"),
    ],
)
def test_what_a_stop_does_to_the_campaign(tmp_path, run, stop, effect) -> None:
    assert stop_effect(two_gpu_spec(tmp_path), run=run, stop=stop) == effect


def test_the_stop_that_ends_the_campaign(tmp_path: Path) -> None:
    cs = two_gpu_spec(tmp_path)
    nan, low = NonFiniteLoss("c", "nan"), BelowThreshold("c", "low")
    restart = NoUsableRestart("c", "differs")
    assert campaign_stop(cs, run_stops={"lr-high": nan}, restart_stop=None) is None
    assert campaign_stop(cs, run_stops={"control": low}, restart_stop=None) is None
    assert campaign_stop(cs, run_stops={"lr-high": low, "control": nan}, restart_stop=None) is nan
    assert campaign_stop(cs, run_stops={"control": nan}, restart_stop=restart) is nan
    assert campaign_stop(cs, run_stops={}, restart_stop=restart) is restart
    lenient = cs.model_copy(
        update={"stop_rules": cs.stop_rules.model_copy(update={"require_restart": False})}
    )
    assert campaign_stop(lenient, run_stops={}, restart_stop=restart) is None
    assert essential_pilot_stops(cs, pilot_stops={"control": nan, "lr-high": low}) == [
        ("control", nan)
    ]
