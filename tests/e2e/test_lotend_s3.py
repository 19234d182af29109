"""The lot's end on an S3 store, on the real clock: a lot that ends seconds after the start.

The campaign flow runs with its checkpoints in a real S3 server (SeaweedFS, ``infra/s3server.py``)
and two dated lots: lot 1 ends ``LOT_S`` seconds after the start, lot 2 is open for days. Before
lot 1's end minus the margin the training run stops: the step it reached is saved, uploaded and
read back from the bucket (hashes checked) before the lot's end, its segment ends "lot ended",
and the campaign goes on on lot 2 and completes there, resuming from the bucket. The test checks
the bucket itself at the moment the run stops (its own client, its own hash check).
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpucampaign.checkpoint.layout import step_dirname
from gpucampaign.checkpoint.manager import CheckpointManager
from gpucampaign.engine import lotend
from gpucampaign.folder import metrics
from gpucampaign.plan.lots import LOT_ENV
from gpucampaign.spec import load_spec
from gpucampaign.storage import S3Store
from gpucampaign.verify.checks import verify_output
from infra.s3server import start_server
from tests.flows.test_campaign import jsonl, run_flow, timeline_rows, tiny_campaign
from tests.helpers.lots import lot_packages

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

#: Lot 1 ends this long after the flow starts: the audit, the pilot's start and the least
#: margin (``plan/lots.py``: twice 5 s) fit in it with training in between.
LOT_S = 30
#: Each training step waits this long (its metrics row): the training outlasts lot 1 on any
#: machine, and the numbers of the runs do not change.
STEP_SLEEP_S = 0.05


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
    defer = metrics.MetricsLog.defer

    def slow(self, row, **values):  # type: ignore[no-untyped-def]
        if row.get("kind") == "train":
            time.sleep(STEP_SLEEP_S)
        return defer(self, row, **values)

    monkeypatch.setattr(metrics.MetricsLog, "defer", slow)


def test_the_lot_ends_with_a_verified_checkpoint_in_the_bucket_and_goes_on_on_the_next_lot(
    prefect_harness, tmp_path, monkeypatch, s3, slow_steps
):
    monkeypatch.delenv(LOT_ENV, raising=False)
    lotend.forget_ended_lots()
    prefix = f"lotend-{uuid.uuid4().hex[:8]}"
    start = datetime.now(UTC)
    spec = tiny_campaign(
        tmp_path,
        stop_rules={"futility": False},
        storage={"url": f"s3://{s3.bucket}/{prefix}"},
        control={"epochs": 6},
        packages=lot_packages(now=start, first_ends_in_s=LOT_S, second=True),
    )
    cs = load_spec(spec)
    ends_at = cs.packages[0].ends_at
    assert ends_at is not None

    # At the moment a run stops, after its own read-back: the test reads the bucket itself.
    seen: list[dict[str, Any]] = []
    verify = lotend.LotDeadline._verify

    def checked(self, step):  # type: ignore[no-untyped-def]
        got = verify(self, step)
        m = self.r.manager
        mine = CheckpointManager(
            S3Store(cs.storage.url), run_id=m.run_id, config_sha256=m.config_sha256
        )
        ck = mine.load(step)  # every file's hash checked against meta.json
        key = f"{prefix}/{m.run_id}/{step_dirname(step)}/"
        listed = s3.client().list_objects_v2(Bucket=s3.bucket, Prefix=key).get("Contents", [])
        seen.append(
            {
                "run_id": m.run_id,
                "step": step,
                "loaded": ck.step,
                "objects": [(o["Key"], o["LastModified"]) for o in listed],
                "at": datetime.now(UTC),
                "margin_s": self.margin_s,
                "off_machine": got[0],
            }
        )
        return got

    monkeypatch.setattr(lotend.LotDeadline, "_verify", checked)

    out = tmp_path / "out"
    state = run_flow(spec, out)
    wall_s = (datetime.now(UTC) - start).total_seconds()
    print(f"campaign wall time {wall_s:.0f} s (lot 1 ended {LOT_S} s after the start)")

    assert state.is_completed(), state.message
    assert verify_output(out, reload=False).verified
    assert set(state.result()["runs"].values()) == {"completed"}
    ends = [
        r
        for path in sorted((out / "runs").glob("*/metrics.jsonl"))
        for r in jsonl(path)
        if r["kind"] == "lot_end"
    ]
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
    # The segments say "lot ended"; each stopped run resumed from its step and completed.
    rows = timeline_rows(out)
    stopped = [r for r in rows if (r.get("outcome") or "").startswith("lot ended")]
    assert len(stopped) == len(ends) and all("lot 1" in r["outcome"] for r in stopped)
    for cut in stopped:
        later = [
            r
            for r in rows
            if r["run"] == cut["run"] and r["phase"] == cut["phase"] and r["start"] > cut["start"]
        ]
        assert later and later[-1]["outcome"] == "ok", cut
    restored = {
        r["step"]
        for path in (out / "runs").glob("*/metrics.jsonl")
        for r in jsonl(path)
        if r["kind"] == "restore"
    }
    assert {e["step"] for e in ends} <= restored
    assert datetime.now(UTC) - start < timedelta(seconds=LOT_S) * 10
