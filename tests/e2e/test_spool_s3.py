"""The S3 server stopped in the middle of a training run and started again after it ended:
training goes on, the checkpoints wait in the spool, and once the server is back everything is
in the bucket, pruned to what ``keep`` says.

Real SeaweedFS, real training, checked with plain boto3; no fakes on this path.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpucampaign.checkpoint.manager import CheckpointManager
from gpucampaign.engine.loop import train_run
from gpucampaign.folder.layout import CHECKPOINT_LATEST, RunFolder, checkpoint_step_dir
from gpucampaign.storage import S3Store
from gpucampaign.storage.spool import SpoolingStore
from infra.s3server import STATE_FILE, start_server
from tests.helpers import corpus_of, digits_file, make_spec, run_dir  # noqa: F401

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def test_server_down_mid_run_nothing_lost_and_the_spool_drains(tmp_path, digits_file):  # noqa: F811
    srv = start_server(tmp_path / "s3")
    ports = json.loads((Path(srv.root) / STATE_FILE).read_text())["ports"]
    spec = make_spec(tmp_path, digits_file, checkpoint={"every_steps": 2, "keep": 3})
    url = f"s3://{srv.bucket}/spooltest"
    store = SpoolingStore(
        S3Store(url, env=srv.env(), max_attempts=2),
        spool_dir=tmp_path / "out" / "spool",
        retry_s=0.5,
        max_retry_s=2.0,
    )
    seen: dict[str, object] = {}

    def progress(row: dict) -> None:
        if row["step"] >= 5 and "stopped" not in seen:
            seen["stopped"] = row["step"]
            srv.stop()

    try:
        result = train_run(
            spec,
            run=spec.resolve_run("control"),
            corpus=corpus_of(tmp_path, spec),
            store=store,
            run_folder=RunFolder.of(tmp_path / "out", spec.resolve_run("control").run_id),
            progress=progress,
        )
        assert result.steps_done == 20
        # Down until the run ended (the outage of the issue): everything since step 5 waits.
        seen["pending"] = store.pending()
        srv = start_server(tmp_path / "s3", ports=ports)
        assert any(
            k.endswith(CHECKPOINT_LATEST) for k in seen["pending"]
        )  # saved while it was down
        assert store.drain(timeout_s=120) == []
        assert not any((tmp_path / "out" / "spool").rglob("*.safetensors"))

        rid = spec.resolve_run("control").run_id
        client = srv.client()
        latest = json.loads(
            client.get_object(Bucket=srv.bucket, Key=f"spooltest/{rid}/{CHECKPOINT_LATEST}")[
                "Body"
            ].read()
        )
        assert latest["dir"] == checkpoint_step_dir(20)
        keys = {
            o["Key"]
            for o in client.list_objects_v2(
                Bucket=srv.bucket, Prefix=f"spooltest/{rid}/{checkpoint_step_dir(20)}/"
            )["Contents"]
        }
        assert len(keys) >= 3
        # keep=3 holds after the outage too: the prunes asked for meanwhile ran after draining.
        listed = client.list_objects_v2(Bucket=srv.bucket, Prefix=f"spooltest/{rid}/")
        folders = {o["Key"].split("/")[2] for o in listed["Contents"]} - {CHECKPOINT_LATEST}
        assert folders == {checkpoint_step_dir(s) for s in (16, 18, 20)}, sorted(folders)
        bare = S3Store(url, env=srv.env())
        loaded, refused = CheckpointManager(
            bare, run_id=rid, config_sha256=spec.resolve_run("control").config_sha256
        ).load_latest()
        assert loaded is not None and loaded.step == 20 and refused == []
    finally:
        srv.stop()
