"""The campaign flow submits each GPU lane's chain as the plan placed it (no Prefect server:
the tasks' ``submit`` is replaced by a recorder)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import gpucampaign_prefect.flows.campaign as campaign_flow
from gpucampaign.plan import calendar
from gpucampaign.plan.lanes import RESTART_CHECK, lane_chains
from tests.plan.test_lanes import round_robin, two_gpu_spec


class _Submitted:
    """A task's future, as the flow's chains see it."""

    def __init__(self, name: str, *, lane: int | None, wait_for: list[Any] | None) -> None:
        self.name, self.lane = name, lane
        self.after = [w.unwrap().name for w in wait_for or []]  # allow_failure(future)


def test_the_flow_submits_each_lane_in_the_plans_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cs = two_gpu_spec(tmp_path)
    plan = calendar.plan(cs)
    submitted: list[_Submitted] = []

    class Train:
        @staticmethod
        def submit(spec: Any, *, run: str, lane: int, wait_for: Any = None, **kw: Any) -> Any:
            submitted.append(_Submitted(run, lane=lane, wait_for=wait_for))
            return submitted[-1]

    class Restart:
        @staticmethod
        def submit(spec: Any, *, run: str, wait_for: Any = None, **kw: Any) -> Any:
            submitted.append(_Submitted("restart", lane=None, wait_for=wait_for))
            return submitted[-1]

    monkeypatch.setattr(campaign_flow, "train", Train)
    monkeypatch.setattr(campaign_flow, "restart_verification", Restart)
    futures, restart = campaign_flow._submit_in_lanes(
        cs, plan=plan, dropped=[], common={"base_dir": ".", "out": str(tmp_path / "out")}
    )
    assert set(futures) == set(cs.run_names()) and restart.name == "restart"
    # Each submission waits for the one before it on its lane (the restart check for the
    # control's save too): the chains are the plan's, not round-robin's.
    after = {s.name: s.after for s in submitted}
    assert after == {
        "control": [],
        "restart": ["control"],
        "bf16": ["restart"],
        "lr-high": [],
        "short": ["lr-high"],
    }
    chains = lane_chains(plan, spec=cs)
    assert chains == [["control", RESTART_CHECK, "bf16"], ["lr-high", "short"]]
    assert chains != round_robin(cs, 2)
    assert {s.name: s.lane for s in submitted if s.lane is not None} == {
        run: lane for lane, chain in enumerate(chains) for run in chain if run is not None
    }
