"""A lost machine is relaunched: the automation that runs a crashed campaign again with the same
parameters (relaunch + 1), the bound the flow keeps, and a stack restart that leaves the
dead-run detector's trigger as it was."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from prefect.utilities.schema_tools.hydration import HydrationContext, hydrate

from infra import automations


class _CrashedRun:
    """What the server's template sees of the crashed flow run."""

    def __init__(self, parameters: dict[str, Any]) -> None:
        self.parameters = parameters


def _rendered(parameters: dict[str, Any]) -> Any:
    action = automations.relaunch_automation().actions[0]
    context = HydrationContext(
        raise_on_error=True, render_jinja=True, jinja_context={"flow_run": _CrashedRun(parameters)}
    )
    return hydrate(action.parameters, context)


def test_a_crashed_campaign_is_run_again_from_its_deployment_with_the_same_parameters():
    made = automations.relaunch_automation()
    trigger = made.trigger
    assert trigger.expect == {"prefect.flow-run.Crashed"}
    assert trigger.match_related.root == {
        "prefect.resource.role": "flow",
        "prefect.resource.name": "campaign",
    }
    (action,) = made.actions
    assert action.type == "run-deployment" and action.source == "inferred"
    first = {"spec": "examples/digits/campaign.yaml", "out": "out/c", "decision_mode": None}
    assert _rendered(first) == {**first, "relaunch": 1}  # None stays None, not "None"
    assert _rendered({**first, "relaunch": 2})["relaunch"] == 3


class _Client:
    def __init__(self, existing: list[Any]) -> None:
        self.existing = existing
        self.updated: list[Any] = []
        self.deleted: list[Any] = []

    def read_automations_by_name(self, name: str) -> list[Any]:
        return [a for a in self.existing if a.name == name]

    def update_automation(self, automation_id: Any, automation: Any) -> None:
        self.updated.append(automation_id)

    def delete_automation(self, automation_id: Any) -> None:
        self.deleted.append(automation_id)

    def create_automation(self, automation: Any) -> None:
        self.existing.append(automation)


def _on_server(core: Any) -> Any:
    from prefect.events.schemas.automations import Automation

    return Automation(**core.model_dump(), id=uuid4())


def test_a_stack_restart_leaves_the_dead_run_detector_as_it_is():
    # Updating an automation resets its trigger: a run that stopped its heartbeats before the
    # restart would stay Running. The same settings are left alone; a new window is updated.
    server = _Client([_on_server(automations.crashed_automation(300))])
    assert automations.put(server, automations.crashed_automation(300)) == "unchanged"
    assert server.updated == []
    assert automations.put(server, automations.crashed_automation(600)) == "updated"
    assert len(server.updated) == 1
    relaunch = _Client([_on_server(automations.relaunch_automation())])
    assert automations.put(relaunch, automations.relaunch_automation()) == "unchanged"


@pytest.mark.process
def test_the_server_s_copy_compares_equal_whatever_the_hash_seed():
    """A trigger's event names are sets: read back from the server (rebuilt in another order)
    they once dumped as lists in another order under some hash seeds (20 with CPython 3.11), so
    a stack restart updated the automation and reset its trigger. Each seed in its process."""
    import subprocess
    import sys

    check = (
        "import uuid\n"
        "from infra import automations\n"
        "from prefect.events.schemas.automations import Automation\n"
        "core = automations.crashed_automation(300)\n"
        "server = Automation(**core.model_dump(), id=uuid.uuid4())\n"
        "print(automations._settings(server) == automations._settings(core))\n"
    )
    root = Path(__file__).resolve().parents[2]
    for seed in (20, 0, 1):
        env = {**os.environ, "PYTHONHASHSEED": str(seed)}
        out = subprocess.run(
            [sys.executable, "-c", check], cwd=root, env=env, capture_output=True, text=True
        )
        assert out.stdout.strip() == "True", (seed, out.stdout, out.stderr[-2000:])


@pytest.mark.slow
def test_a_relaunch_beyond_the_bound_refuses_to_start(prefect_harness, tmp_path):
    from tests.flows.test_campaign import run_flow, tiny_campaign

    spec = tiny_campaign(tmp_path, checkpoint={"max_relaunches": 1})
    out = tmp_path / "out"
    state = run_flow(spec, out, relaunch=2)
    assert state.is_failed()
    assert "relaunch 2" in state.message and "max_relaunches is 1" in state.message
    assert not (out / "runs").exists() and not (out / "timeline.jsonl").exists()


def test_a_second_copy_of_an_s3_campaign_waits_then_refuses_naming_the_holder(prefect_harness):
    """One running copy per campaign across hosts: the lock on the shared server (S3 store)."""
    from types import SimpleNamespace

    from gpucampaign_prefect.orchestration.campaign_lock import CampaignHeld, campaign_lock

    cs: Any = SimpleNamespace(
        name=f"held-{uuid4().hex[:8]}", storage=SimpleNamespace(url="s3://bucket/relaunch")
    )
    with campaign_lock(cs, tag="campaign:x", lease_s=60) as name:
        assert name.startswith(f"campaign:{cs.name}:")
        with pytest.raises(CampaignHeld) as refused:
            with campaign_lock(cs, tag="campaign:x", lease_s=60, wait_s=2):
                pytest.fail("a second copy got the campaign lock")
        said = str(refused.value)
        assert f"campaign '{cs.name}'" in said and "refuses" in said and name in said
    # Given back at the end: the next copy takes it at once.
    with campaign_lock(cs, tag="campaign:x", lease_s=60, wait_s=2) as again:
        assert again == name
    # A local store has no campaign lock (the folder's writer lock guards it).
    local: Any = SimpleNamespace(name=cs.name, storage=SimpleNamespace(url="local"))
    with campaign_lock(local, tag="campaign:x", lease_s=60) as none:
        assert none == ""


def test_a_second_copy_waits_two_leases_on_the_products_clock(prefect_harness):
    """The wait for the campaign lock is on ``core/clock.py``'s time: driven, two leases of
    it take no wall time, and the refusal says the whole wait."""
    import time
    from datetime import UTC, datetime
    from types import SimpleNamespace

    from gpucampaign.core.clock import DrivenClock, use_clock
    from gpucampaign_prefect.orchestration.campaign_lock import CampaignHeld, campaign_lock

    cs: Any = SimpleNamespace(
        name=f"held-{uuid4().hex[:8]}", storage=SimpleNamespace(url="s3://bucket/relaunch")
    )
    with campaign_lock(cs, tag="campaign:x", lease_s=60) as name:
        started = time.monotonic()
        with use_clock(DrivenClock(datetime.now(UTC))) as driven:
            with pytest.raises(CampaignHeld) as refused:
                with campaign_lock(cs, tag="campaign:x", lease_s=60):
                    pytest.fail("a second copy got the campaign lock")
        assert time.monotonic() - started < 30
        assert driven.monotonic() >= 120 and driven.slept, driven.slept
        assert "waited 120 s" in str(refused.value) and name in str(refused.value)


def test_a_crashed_copys_task_runs_and_gpu_tag_are_closed_by_the_next_copy(prefect_harness):
    """The dead-run automation sets only the flow run Crashed; the copy that holds the campaign
    next closes its task runs (Running -> Crashed, Pending -> Cancelled), drops its GPU tag
    and the row naming it in the GPU lock's holders table of its host (whose own process died
    with the machine, its lease expiring without a word)."""
    import json

    from prefect import flow, get_client, task
    from prefect.artifacts import create_table_artifact
    from prefect.client.schemas.filters import ArtifactCollectionFilter, ArtifactCollectionFilterKey
    from prefect.states import Crashed, Pending, Running

    from gpucampaign_prefect.orchestration.campaign_lock import close_dead_copies

    @flow(name="campaign")
    def dead() -> None: ...

    @task(name="train")
    def step() -> None: ...

    tag = f"campaign:dead-{uuid4().hex[:8]}"
    with get_client(sync_client=True) as client:
        run = client.create_flow_run(dead, tags=[tag, "gpu-slot:gpu@host-a", "other"])
        client.set_flow_run_state(run.id, Running(), force=True)
        train = client.create_task_run(step, run.id, "0", state=Running())
        waiting = client.create_task_run(step, run.id, "1", state=Pending())
        alive = client.create_flow_run(dead, tags=[tag, "gpu-slot:gpu@host-b"])
        client.set_flow_run_state(alive.id, Running(), force=True)
        client.set_flow_run_state(run.id, Crashed(message="no heartbeat"), force=True)
        table = f"gpu-lock-gpu-host-a-{uuid4().hex[:8]}"
        row = {"limit": "gpu", "host": "host-a", "holder": "train of control", "pid": 4242}
        create_table_artifact(
            table=[{**row, "flow_run": str(run.id)}, {**row, "flow_run": str(alive.id)}], key=table
        )

        assert close_dead_copies(tag) == [run.name]
        (latest,) = client.read_latest_artifacts(
            artifact_filter=ArtifactCollectionFilter(key=ArtifactCollectionFilterKey(any_=[table]))
        )
        assert json.loads(latest.data) == [{**row, "flow_run": str(alive.id)}]
        assert client.read_task_run(train.id).state.type.value == "CRASHED"
        assert client.read_task_run(waiting.id).state.type.value == "CANCELLED"
        assert client.read_flow_run(run.id).tags == [tag, "other"]
        # A running copy is left as it is; a second pass finds nothing open.
        assert "gpu-slot:gpu@host-b" in client.read_flow_run(alive.id).tags
        assert close_dead_copies(tag) == []


# --- the bound, read first: a crash loop in the preflight ends ------------------------------


class _Crash(BaseException):
    """The flow run's process dying (a recipe that kills it during the preflight)."""


def _crashing_flow(monkeypatch) -> tuple[Any, list[int]]:
    """``campaign`` (its function, no server) with an opening that crashes every time, the
    relaunches it reached; Prefect's run logger replaced (no flow run here)."""
    import logging

    from gpucampaign_prefect.flows import _lots
    from gpucampaign_prefect.flows import campaign as flow_module

    opened: list[int] = []

    def crash(*args: Any, **kw: Any) -> Any:
        opened.append(1)
        raise _Crash("the process died during the preflight")

    logger = logging.getLogger("test-relaunch")
    for module in (_lots, flow_module):
        monkeypatch.setattr(module, "get_run_logger", lambda: logger)
    monkeypatch.setattr(flow_module, "open_campaign", crash)
    return flow_module.campaign.fn, opened


def test_a_crash_loop_in_the_preflight_ends_after_the_bound(tmp_path, monkeypatch):
    """``max_relaunches: 1`` and a campaign whose preflight kills its process: the first run
    and one relaunch crash; the second relaunch is refused before anything is opened, and
    ends Failed (not Crashed), so the relaunch automation stops there."""
    from tests.flows.test_campaign import tiny_campaign

    spec = tiny_campaign(tmp_path, checkpoint={"max_relaunches": 1})
    run, opened = _crashing_flow(monkeypatch)
    relaunch, state = 0, None
    while relaunch < 10:  # the automation: a crashed run again, relaunch one higher
        try:
            state = run(spec=str(spec), out=str(tmp_path / "out"), relaunch=relaunch)
            break
        except _Crash:
            relaunch += 1
    assert state is not None and state.is_failed(), f"still crashing at relaunch {relaunch}"
    assert relaunch == 2 and len(opened) == 2
    assert "relaunch 2" in state.message and "max_relaunches is 1" in state.message


@pytest.mark.parametrize("relaunch", [-1, -(10**6), 101, 10**9, True, "2"])
def test_a_negative_or_absurd_relaunch_is_refused_before_anything_opens(
    tmp_path, monkeypatch, relaunch
):
    from tests.flows.test_campaign import tiny_campaign

    spec = tiny_campaign(tmp_path, checkpoint={"max_relaunches": 3})
    run, opened = _crashing_flow(monkeypatch)
    state = run(spec=str(spec), out=str(tmp_path / "out"), relaunch=relaunch)
    assert state.is_failed() and opened == []
    assert "parameter 'relaunch' refused" in state.message and "0 to 100" in state.message


def test_one_store_spelled_with_a_trailing_slash_has_one_campaign_lock():
    from types import SimpleNamespace

    from gpucampaign_prefect.orchestration.campaign_lock import lock_name

    def named(url: str) -> str:
        cs: Any = SimpleNamespace(name="c", storage=SimpleNamespace(url=url))
        return lock_name(cs)

    same = {named(u) for u in ("s3://bucket/runs", "s3://bucket/runs/", "s3://bucket//runs//")}
    assert len(same) == 1
    assert named("s3://bucket/runs") != named("s3://bucket/other")
    assert named("s3://bucket") == named("s3://bucket/") != named("s3://bucket/runs")
