"""The lot's end on an S3 store, on the real clock: a lot that ends seconds after the start,
and the campaign handed over to the next lot's machines without a person.

The campaign deployment's flow run trains with its checkpoints in a real S3 server (SeaweedFS,
``infra/s3server.py``) on two dated lots, each with the work queue of its machines' workers:
lot 1 (``GPUCAMPAIGN_LOT=1``, queue ``lot-1``) ends ``LOT_S`` real seconds after the first run
first looks at the clock (the campaign's start-up before it is not counted: it is slow on a
busy machine), lot 2 (queue ``lot-2``) is open for days. Before lot 1's end minus the margin
the training runs stop: the step each reached is saved, uploaded and read back from the bucket
(hashes checked) before the lot's end, their segments end "lot ended", and the flow run closes
and runs its own deployment again on ``lot-2`` with the same parameters. That flow run, run
here as lot 2's worker would run it, into a fresh folder (host A's folder moved away: another
machine), resumes from the bucket and completes. The test checks the bucket itself at the
moment a run stops (its own client, its own hash check).
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from prefect import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
from prefect.flow_engine import run_flow

from gpucampaign.checkpoint.manager import CheckpointManager
from gpucampaign.config import load_spec
from gpucampaign.core.clock import use_clock
from gpucampaign.engine import lotend
from gpucampaign.engine.checkpointer import Checkpointer
from gpucampaign.folder import metrics
from gpucampaign.folder.layout import checkpoint_step_dir
from gpucampaign.plan.lots import LOT_ENV
from gpucampaign.storage import S3Store
from gpucampaign.verify.checks import verify_output
from gpucampaign_prefect.flows.campaign import campaign
from infra.s3server import start_server
from tests.flows.test_campaign import jsonl, timeline_rows, tiny_campaign
from tests.helpers.lots import FromFirstRead, lot_packages

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

#: Lot 1 ends this long after the first run asks the time (``FromFirstRead``: real seconds from
#: the pilot's start): the pilot and the least margin (``plan/lots.py``: twice 5 s) fit in it
#: with training in between.
LOT_S = 30
#: Each training step waits this long (its metrics row), and each run trains ``STEPS`` steps:
#: the training outlasts lot 1 on a fast machine too (on lot 2 the steps run at full speed).
#: The numbers of the runs do not change.
STEP_SLEEP_S = 0.1
STEPS = 200


def _two_runs(data: dict[str, Any]) -> None:
    """The control and one variant, training side by side on the two GPU lanes."""
    data["control"] = {**data["control"], "epochs": 50, "max_steps": STEPS}
    data["variants"] = data["variants"][:1]
    runs = {"control", data["variants"][0]["name"]}
    data["calendar"] = [s for s in data["calendar"] if s.get("run") in (None, *runs)]


@pytest.fixture
def s3(tmp_path, monkeypatch):
    srv = start_server(tmp_path / "s3")
    for name, value in srv.env().items():
        monkeypatch.setenv(name, value)
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def slow_steps(monkeypatch):
    """Slow training steps; ``slow_steps.clear()`` gives the steps their full speed back."""
    defer = metrics.MetricsLog.defer
    slow_s = [STEP_SLEEP_S]

    def slow(self, row, **values):  # type: ignore[no-untyped-def]
        if row.get("kind") == "train" and slow_s:
            time.sleep(slow_s[0])
        return defer(self, row, **values)

    defer_value = metrics.MetricsLog.defer_value

    def slow_value(self, row, key, value):  # type: ignore[no-untyped-def]
        if row.get("kind") == "train" and slow_s:  # the loop's (defer in fewer calls)
            time.sleep(slow_s[0])
        return defer_value(self, row, key, value)

    monkeypatch.setattr(metrics.MetricsLog, "defer", slow)
    monkeypatch.setattr(metrics.MetricsLog, "defer_value", slow_value)
    return slow_s


@pytest.fixture
def clock():
    """The product's clock: real seconds from the first run's first look at it."""
    lotend.forget_ended_lots()
    with use_clock(FromFirstRead(datetime.now(UTC))) as first_read:
        yield first_read


def _deployment(queue: str) -> Any:
    """The campaign flow's deployment on a new process work pool, its default queue ``queue``."""
    pool = f"lots-{uuid.uuid4().hex[:8]}"
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
        flow_id = client.create_flow(campaign)
        deployment_id = client.create_deployment(
            flow_id=flow_id,
            name=pool,
            work_pool_name=pool,
            work_queue_name=queue,
            entrypoint="gpucampaign_prefect.flows.campaign:campaign",
            job_variables={"env": {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "60"}},
        )
        return client.read_deployment(deployment_id)


def _flow_runs(deployment_id: Any) -> list[Any]:
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id]))
        )
    return sorted(runs, key=lambda r: r.created)


def _rows(out: Path, kind: str) -> list[dict[str, Any]]:
    return [
        r
        for path in sorted((out / "runs").glob("*/metrics.jsonl"))
        for r in jsonl(path)
        if r["kind"] == kind
    ]


def test_the_lot_ends_with_a_verified_checkpoint_in_the_bucket_and_the_next_lot_takes_over(
    prefect_harness, tmp_path, monkeypatch, s3, slow_steps, clock
):
    prefix = f"lotend-{uuid.uuid4().hex[:8]}"
    start = datetime.now(UTC)
    lots = lot_packages(now=clock.start, first_ends_in_s=LOT_S, second=True)
    for n, lot in enumerate(lots, start=1):
        lot["work_queue"] = f"lot-{n}"
    spec = tiny_campaign(
        tmp_path,
        stop_rules={"futility": False},
        storage={"url": f"s3://{s3.bucket}/{prefix}"},
        packages=lots,
        runs=_two_runs,
    )
    cs = load_spec(spec)
    ends_at = cs.packages[0].ends_at
    assert ends_at is not None

    # At the moment a run stops, after its own read-back: the test reads the bucket itself.
    seen: list[dict[str, Any]] = []
    read_back = Checkpointer.read_back

    def checked(self, step, *, timeout_s):  # type: ignore[no-untyped-def]
        got = read_back(self, step, timeout_s=timeout_s)
        m = self._r.manager
        mine = CheckpointManager(
            S3Store(cs.storage.url), run_id=m.run_id, config_sha256=m.config_sha256
        )
        ck = mine.load(step)  # every file's hash checked against meta.json
        key = f"{prefix}/{m.run_id}/{checkpoint_step_dir(step)}/"
        listed = s3.client().list_objects_v2(Bucket=s3.bucket, Prefix=key).get("Contents", [])
        seen.append(
            {
                "step": step,
                "loaded": ck.step,
                "objects": [(o["Key"], clock.at(o["LastModified"])) for o in listed],
                "at": clock.now(),
            }
        )
        return got

    monkeypatch.setattr(Checkpointer, "read_back", checked)

    # Host A: lot 1's worker runs the deployment's flow run.
    deployment = _deployment("lot-1")
    out = tmp_path / "out"
    with get_client(sync_client=True) as client:
        first = client.create_flow_run_from_deployment(
            deployment.id, parameters={"spec": str(spec), "out": str(out)}
        )
    monkeypatch.setenv(LOT_ENV, "1")
    state = run_flow(campaign, flow_run=first, parameters=first.parameters, return_type="state")
    lot1_s = (datetime.now(UTC) - start).total_seconds()

    assert state.is_cancelled(), state.message
    assert "handed over to lot 2" in state.message and "lot-2" in state.message, state.message
    ends = _rows(out, "lot_end")
    assert ends and len(seen) == len(ends), (ends, seen)
    for end, look in zip(
        sorted(ends, key=lambda e: e["step"]), sorted(seen, key=lambda s: s["step"]), strict=True
    ):
        # Stopped with training done, off the machine: read back from the bucket by the run.
        assert end["lot"] == 1 and end["step"] > 0 and end["off_machine"] is True, end
        assert f"read back from s3://{s3.bucket}/{prefix}" in end["where"], end
        assert 0 < end["left_s"] <= end["margin_s"], end
        # ... and by the test, from the bucket, before the lot's end.
        assert look["loaded"] == look["step"] == end["step"] and look["objects"], look
        assert look["at"] < ends_at, (look["at"], ends_at)
        assert all(at <= ends_at for _, at in look["objects"]), look["objects"]
    # Each run stopped there ends its segment "lot ended" and trains no further on lot 1.
    stopped = [r for r in timeline_rows(out) if (r.get("outcome") or "").startswith("lot ended")]
    assert len(stopped) == len(ends) and all("lot 1" in r["outcome"] for r in stopped)
    last = {e["step"] for e in ends}
    trained = {
        max(r["step"] for r in jsonl(p) if r["kind"] == "train")
        for p in (out / "runs").glob("*/metrics.jsonl")
        if any(r["kind"] == "lot_end" for r in jsonl(p))
    }
    assert trained == last, (trained, last)

    # The hand-over: one new flow run of the deployment, same parameters, on lot 2's queue.
    runs = _flow_runs(deployment.id)
    assert [r.id for r in runs][:1] == [first.id] and len(runs) == 2, runs
    successor = runs[1]
    assert successor.state is not None and successor.state.is_scheduled(), successor.state
    assert successor.work_queue_name == "lot-2"
    assert successor.parameters == first.parameters
    env = successor.job_variables["env"]
    assert env == {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "60", LOT_ENV: "2"}, env

    # Host B: lot 2's worker runs it on another machine (host A's folder is not there).
    out.rename(tmp_path / "host-a")
    lotend.forget_ended_lots()  # a new process
    slow_steps.clear()  # lot 2 is open for days: nothing to outlast
    monkeypatch.setenv(LOT_ENV, env[LOT_ENV])
    again = run_flow(
        campaign, flow_run=successor, parameters=successor.parameters, return_type="state"
    )
    wall_s = (datetime.now(UTC) - start).total_seconds()
    first_read = (clock.first - start).total_seconds() if clock.first else float("nan")
    print(
        f"first run's clock read at {first_read:.0f} s, lot 1 ended {LOT_S} s later; host A "
        f"ended at {lot1_s:.0f} s, host B completed at {wall_s:.0f} s"
    )
    assert again.is_completed(), again.message
    assert verify_output(out, reload=False).verified
    assert set(again.result()["runs"].values()) == {"completed"}
    assert last <= {r["step"] for r in _rows(out, "restore")}  # from the bucket
