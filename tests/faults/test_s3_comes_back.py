"""The store that comes back, on the real SeaweedFS: a restart keeps its ports, a frozen server
spools like a refused one (with a warning), and an object altered in the bucket is named with
both hashes (the download's digest, not "cannot schedule new futures after shutdown")."""

from __future__ import annotations

import json
import logging
import os
import signal
import time

import pytest

from gpucampaign.checkpoint.manager import CheckpointManager
from gpucampaign.checkpoint.verify import CHECKSUM_MISMATCH, CheckpointInvalid
from gpucampaign.core.files import FAST_CHECKSUM, checksum_bytes
from gpucampaign.folder.layout import WEIGHTS_FILE, checkpoint_step_dir
from gpucampaign.storage import S3Store
from gpucampaign.storage.spool import SpoolingStore
from infra.s3server import PORTS_FILE, _main, load_server, start_server
from tests.checkpoint.test_checkpoint import CFG, RUN, _state

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def test_a_restart_keeps_the_ports(tmp_path, capsys, faults):
    root = tmp_path / "s3"
    srv = start_server(root)
    try:
        ports = json.loads((root / PORTS_FILE).read_text())
        assert srv.endpoint == f"http://127.0.0.1:{ports[3]}"
        capsys.readouterr()
        assert _main(["restart", str(root)]) == 0  # what `infra/stack.sh restart s3` runs
        assert f"AWS_ENDPOINT_URL={srv.endpoint}" in capsys.readouterr().out
        again = load_server(root)
        assert again is not None and again.pid != srv.pid and again.endpoint == srv.endpoint
        srv = again
        assert srv.client().head_bucket(Bucket=srv.bucket)  # serves the same bucket
        faults.add("s3_restarts_survived")
    finally:
        (load_server(root) or srv).stop()


def test_a_frozen_server_spools_within_its_timeout_and_drains(tmp_path, caplog):
    srv = start_server(tmp_path / "s3")
    env = {**srv.env(), "GPUCAMPAIGN_S3_READ_TIMEOUT_S": "4"}  # 30 s by default
    store = SpoolingStore(
        S3Store(f"s3://{srv.bucket}/frozen", env=env, max_attempts=2),
        spool_dir=tmp_path / "spool",
        retry_s=0.5,
        max_retry_s=2.0,
    )
    src = tmp_path / "f.bin"
    src.write_bytes(os.urandom(1 << 20))
    try:
        store.put_file("r/a.bin", src=src)  # up while it answers
        assert store.pending() == []
        os.killpg(srv.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="gpucampaign.storage.spool"):
            store.put_file("r/b.bin", src=src)
        took = time.monotonic() - t0
        assert store.pending() == ["r/b.bin"]
        assert took < 2 * 4 + 10, took  # two attempts of the read timeout, not a stall
        assert any("waits in the spool" in r.getMessage() for r in caplog.records)
        os.killpg(srv.pid, signal.SIGCONT)
        assert store.drain(timeout_s=60) == []
        assert srv.client().head_object(Bucket=srv.bucket, Key="frozen/r/b.bin")
    finally:
        os.killpg(srv.pid, signal.SIGCONT)
        srv.stop()


def test_an_object_altered_in_the_bucket_is_named_with_both_checksums(tmp_path):
    srv = start_server(tmp_path / "s3")
    try:
        store = S3Store(f"s3://{srv.bucket}/altered", env=srv.env())
        manager = CheckpointManager(store, run_id=RUN, config_sha256=CFG, keep=3)
        for step in (2, 4):
            model, state = _state(step)
            manager.save(step, model_state=model, train_state=state)
        key = f"altered/{RUN}/{checkpoint_step_dir(4)}/{WEIGHTS_FILE}"
        client = srv.client()
        data = bytearray(client.get_object(Bucket=srv.bucket, Key=key)["Body"].read())
        want = checksum_bytes(bytes(data), kind=FAST_CHECKSUM)  # what meta.json records
        data[-64:] = bytes(b ^ 0xFF for b in data[-64:])
        got = checksum_bytes(bytes(data), kind=FAST_CHECKSUM)
        client.put_object(Bucket=srv.bucket, Key=key, Body=bytes(data))  # as `aws s3 cp` would
        with pytest.raises(CheckpointInvalid) as exc:
            manager.load(4)
        assert exc.value.kind == CHECKSUM_MISMATCH and exc.value.algorithm == FAST_CHECKSUM
        assert (exc.value.expected, exc.value.actual) == (want, got)
        assert want in str(exc.value) and got in str(exc.value)
        ck, refused = manager.load_latest()  # a resume falls back, saying why
        assert ck is not None and ck.step == 2 and got in refused[0]
    finally:
        srv.stop()
