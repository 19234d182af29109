"""A campaign resumed on another host, into a fresh output folder from the bucket, is one
campaign in MLflow: the folder takes the campaign ID the bucket keeps beside the timeline, so
its runs find the first host's parent run and their own MLflow runs; at the close no run of the
campaign stays RUNNING (against an in-memory client; on a real server:
``tests/faults/test_worker_killed_s3.py``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpucampaign.folder.layout import CAMPAIGN_FILE, TIMELINE
from gpucampaign.folder.records import fix_campaign_id, read_campaign_id
from gpucampaign.storage import LocalStore
from gpucampaign.storage.sharedtimeline import adopt_timeline, share_timeline
from gpucampaign.tracking.campaign import track_close
from gpucampaign.tracking.mlflow import RunTracker
from tests.helpers import digits_file, make_spec  # noqa: F401
from tests.helpers.fake_mlflow import FakeClient

pytest.importorskip("mlflow")  # the entities the client is given (Metric, Param, RunTag)

URI = "http://127.0.0.1:9"


class Bucket(LocalStore):
    """A store that is not a local folder, as an ``s3://`` bucket is not."""

    def local_path(self, key: str) -> Path | None:
        return None


def _tracker(root: Path, run: str, client: FakeClient, **kw: Any) -> RunTracker:
    """The MLflow run of ``run`` in output folder ``root``, as ``RunTracker.for_run`` makes it."""
    folder = root / "runs" / run
    folder.mkdir(parents=True, exist_ok=True)
    return RunTracker(
        client=client,
        uri=URI,
        experiment="t",  # make_spec's name: its experiment
        campaign_id=str(read_campaign_id(root)),
        run_folder=folder,
        run_id=run,
        tags={"gpucampaign.run_id": run, "gpucampaign.run": run},
        params={},
        flush_every_s=3600,  # sent at a flush by hand or at the close
        **kw,
    )


def _steps(t: RunTracker, steps: range) -> None:
    for s in steps:
        t.write({"kind": "train", "step": s, "loss": 1.0, "lr": 0.1})


def test_a_fresh_folder_on_another_host_continues_the_campaigns_mlflow_runs(
    tmp_path,
    digits_file,  # noqa: F811
):
    spec = make_spec(tmp_path, digits_file, tracking={"mlflow": {"uri": URI}})
    client, bucket = FakeClient(), Bucket(tmp_path / "bucket")
    host_a, host_b = tmp_path / "a" / "out", tmp_path / "b" / "out"
    host_a.mkdir(parents=True)
    cid = fix_campaign_id(host_a, name="digits", spec_sha256="ab" * 32)
    (host_a / TIMELINE).write_text('{"phase": "train"}\n')
    # Host A: the variant's pilot ended (its checkpoint may predate its MLflow run's ID), the
    # control trained to step 7 and checkpointed at 5; then the machine was lost.
    variant = _tracker(host_a, "wide", client)
    _steps(variant, range(1, 4))
    variant.start()
    variant.close("FINISHED")
    control = _tracker(host_a, "control", client)
    _steps(control, range(1, 8))
    assert control.flush()
    share_timeline(host_a, store=bucket)
    assert json.loads(bucket.read_bytes(CAMPAIGN_FILE))["campaign_id"] == cid

    # Host B: a fresh folder takes the campaign's ID with the timeline, for this spec only.
    assert adopt_timeline(host_b, store=bucket, spec_sha256="ab" * 32)
    assert read_campaign_id(host_b) == cid
    assert fix_campaign_id(host_b, name="digits", spec_sha256="ab" * 32) == cid
    other = tmp_path / "c" / "out"
    assert not adopt_timeline(other, store=bucket, spec_sha256="cd" * 32)
    assert read_campaign_id(other) is None  # another spec: another campaign
    assert not (other / TIMELINE).exists()  # and none of the first campaign's timeline

    resumed = _tracker(
        host_b, "control", client, known_run_id=control.mlflow_run_id, restored_step=5
    )
    _steps(resumed, range(6, 11))
    resumed.start()
    resumed.close("FINISHED")
    again = _tracker(host_b, "wide", client)  # no ID from a checkpoint: found by its tags
    _steps(again, range(4, 11))
    again.start()
    again.close("FINISHED")
    line = track_close(
        spec, root=host_b, campaign_id=cid, verdict={}, budget={}, files=[], client=client
    )
    assert line is not None and "parent run" in line, line

    parents = [r for r in client.runs.values() if r["tags"].get("gpucampaign.kind") == "campaign"]
    assert [p["name"] for p in parents] == [cid]
    children = client.child_runs()
    assert sorted(r["name"] for r in children.values()) == ["control", "wide"]
    assert {r["status"] for r in client.runs.values()} == {"FINISHED"}
    for rid in children:
        assert client.steps(rid, "train/loss") == list(range(1, 11))  # each step once


def test_the_close_ends_the_runs_a_dead_process_left_running(tmp_path, digits_file):  # noqa: F811
    spec = make_spec(tmp_path, digits_file, tracking={"mlflow": {"uri": URI}})
    client = FakeClient()
    root, lost_host = tmp_path / "out", tmp_path / "lost" / "out"
    for folder in (root, lost_host):
        folder.mkdir(parents=True)
        (folder / CAMPAIGN_FILE).write_text(json.dumps({"campaign_id": "c-1"}))
    lost = _tracker(lost_host, "narrow", client)  # its machine lost; the run never resumed
    _steps(lost, range(1, 3))
    assert lost.flush()
    done = _tracker(root, "control", client)
    _steps(done, range(1, 3))
    done.start()
    done.close("FINISHED")
    line = track_close(
        spec, root=root, campaign_id="c-1", verdict={}, budget={}, files=[], client=client
    )
    assert line is not None and line.endswith(
        "; ended KILLED, left RUNNING by a process that died: narrow"
    )
    status = {r["name"]: r["status"] for r in client.runs.values()}
    assert status == {"c-1": "FINISHED", "narrow": "KILLED", "control": "FINISHED"}
