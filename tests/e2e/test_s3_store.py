"""S3Store against a real local S3 server (SeaweedFS, started once for the module).

No fakes on this path: every request goes over HTTP to the server, checked with plain boto3.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from gpucampaign.checkpoint.manager import CheckpointManager
from gpucampaign.cli.scaffold import write_spec_copy
from gpucampaign.config import SpecError
from gpucampaign.folder.layout import CHECKPOINT_LATEST, CHECKPOINT_STATE, checkpoint_step_dir
from gpucampaign.storage import NotFound, S3Store, StorageError, check_storage
from gpucampaign.storage.mirror import MIRROR_INDEX, mirror_folder
from infra.s3server import S3Server, start_server
from tests.checkpoint.test_checkpoint import CFG, RUN, _state

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "digits" / "campaign.yaml"
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> S3Server:
    """One SeaweedFS server for the module; always stopped again."""
    srv = start_server(tmp_path_factory.mktemp("s3server"))
    try:
        yield srv
    finally:
        srv.stop()
    assert not srv.running()


def _store(server: S3Server, prefix: str, **kwargs) -> S3Store:
    return S3Store(f"s3://{server.bucket}/{prefix}", env=server.env(), **kwargs)


def _bad_env(server: S3Server) -> dict[str, str]:
    return {**server.env(), "AWS_SECRET_ACCESS_KEY": "not-the-secret-" + "x" * 20}


def test_round_trip(server, tmp_path):
    store = _store(server, "roundtrip/camp")
    src = tmp_path / "a.bin"
    src.write_bytes(os.urandom(300_000))
    store.put_file("run/step-1/a.bin", src=src)
    store.write_bytes("run/LATEST", data=b'{"step": 1}')
    store.write_bytes("run2/x", data=b"other run")
    assert store.list() == ["run/LATEST", "run/step-1/a.bin", "run2/x"]
    assert store.list("run") == ["run/LATEST", "run/step-1/a.bin"]  # not run2/
    assert store.size("run/step-1/a.bin") == 300_000 and store.exists("run/LATEST")
    assert not store.exists("run/none")
    store.get_file("run/step-1/a.bin", dst=tmp_path / "back" / "a.bin")
    assert (tmp_path / "back" / "a.bin").read_bytes() == src.read_bytes()
    assert store.read_bytes("run/LATEST") == b'{"step": 1}'
    # What a plain client sees: the object under the prefix, with its sha256 in the metadata.
    head = server.client().head_object(Bucket=server.bucket, Key="roundtrip/camp/run/step-1/a.bin")
    assert head["ContentLength"] == 300_000 and len(head["Metadata"]["sha256"]) == 64
    store.delete("run/step-1/a.bin")
    store.delete("run/step-1/a.bin")  # a missing key is not an error
    assert store.list("run") == ["run/LATEST"]
    with pytest.raises(NotFound):
        store.read_bytes("run/step-1/a.bin")
    with pytest.raises(NotFound):
        store.size("run/step-1/a.bin")
    with pytest.raises(NotFound):
        store.get_file("run/step-1/a.bin", dst=tmp_path / "none")
    with pytest.raises(StorageError):
        store.write_bytes("../escape", data=b"")


def test_multipart_upload(server, tmp_path):
    store = _store(server, "multipart", multipart_threshold=5 * MIB, part_size=5 * MIB)
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(12 * MIB + 123))
    store.put_file("big.bin", src=src)
    head = server.client().head_object(Bucket=server.bucket, Key="multipart/big.bin")
    assert head["ETag"].strip('"').endswith("-3")  # three parts went up
    store.get_file("big.bin", dst=tmp_path / "big.back")
    assert (tmp_path / "big.back").read_bytes() == src.read_bytes()


def test_altered_or_truncated_objects_are_detected(server, tmp_path):
    store = _store(server, "corrupt")
    src = tmp_path / "f.bin"
    src.write_bytes(os.urandom(100_000))
    store.put_file("f.bin", src=src)
    client = server.client()
    meta = client.head_object(Bucket=server.bucket, Key="corrupt/f.bin")["Metadata"]
    altered = bytearray(src.read_bytes())
    altered[500] ^= 0xFF
    client.put_object(Bucket=server.bucket, Key="corrupt/f.bin", Body=bytes(altered), Metadata=meta)
    with pytest.raises(StorageError, match="sha256"):
        store.read_bytes("f.bin")
    with pytest.raises(StorageError, match="sha256"):
        store.get_file("f.bin", dst=tmp_path / "out.bin")
    assert not (tmp_path / "out.bin").exists()  # nothing half-checked is left behind
    client.put_object(
        Bucket=server.bucket, Key="corrupt/f.bin", Body=src.read_bytes()[:99_000], Metadata=meta
    )
    with pytest.raises(StorageError, match="99000 bytes"):
        store.read_bytes("f.bin")


class _CorruptingStore(S3Store):
    """Sends other bytes than the file holds, as a broken network path or disk would."""

    def _upload(self, src: Path, key: str, *, extra: dict) -> None:
        bad = src.with_suffix(".bad")
        data = bytearray(src.read_bytes())
        data[len(data) // 2] ^= 0xFF
        bad.write_bytes(bytes(data))
        super()._upload(bad, key, extra=extra)


class _NoChecksumStore(S3Store):
    """A server that keeps no flexible checksums: only the ETag tells what it received."""

    def _on_object(self, op: str, key: str, /, **kwargs):
        head = super()._on_object(op, key, **kwargs)
        if op == "head_object":
            head = {k: v for k, v in head.items() if not k.startswith("Checksum")}
        return head


class _CorruptingNoChecksumStore(_CorruptingStore, _NoChecksumStore):
    pass


def test_an_upload_that_does_not_arrive_intact_fails(server, tmp_path):
    src = tmp_path / "f.bin"
    src.write_bytes(os.urandom(6 * MIB))
    sha256 = hashlib.sha256(src.read_bytes()).hexdigest()
    for threshold in (64 * MIB, 5 * MIB):  # one PUT, then parts
        for cls in (_CorruptingStore, _CorruptingNoChecksumStore):
            store = cls(
                f"s3://{server.bucket}/intransit",
                env=server.env(),
                multipart_threshold=threshold,
                part_size=5 * MIB,
            )
            # Also when the caller passes the hash it took: the file is read again to check.
            for known in (None, sha256):
                with pytest.raises(StorageError, match="does not hold what was uploaded"):
                    store.put_file("f.bin", src=src, sha256=known)


def test_an_upload_is_checked_by_crc32c_or_else_by_the_etag(server, tmp_path):
    src = tmp_path / "f.bin"
    src.write_bytes(os.urandom(6 * MIB + 7))
    sha256 = hashlib.sha256(src.read_bytes()).hexdigest()
    client = server.client()
    for cls in (S3Store, _NoChecksumStore):
        store = cls(
            f"s3://{server.bucket}/crc32c",
            env=server.env(),
            multipart_threshold=5 * MIB,
            part_size=5 * MIB,
        )
        store.put_file("f.bin", src=src, sha256=sha256)
        head = client.head_object(Bucket=server.bucket, Key="crc32c/f.bin", ChecksumMode="ENABLED")
        assert head["Metadata"]["sha256"] == sha256
        assert head["ChecksumCRC32C"].endswith("-2")  # the server checked each part's CRC32C
        data, digest = store.read_hashed("f.bin")
        assert digest == sha256 and bytes(data) == src.read_bytes()


def test_wrong_keys_missing_bucket_and_a_server_that_is_down(server, tmp_path):
    secret = _bad_env(server)["AWS_SECRET_ACCESS_KEY"]
    src = tmp_path / "f.bin"
    src.write_bytes(b"x" * 1000)
    for env in (_bad_env(server), {**server.env(), "AWS_ACCESS_KEY_ID": "NOSUCHKEY"}):
        store = S3Store(f"s3://{server.bucket}/keys", env=env, max_attempts=2)
        with pytest.raises(StorageError, match="access denied") as info:
            store.put_file("f.bin", src=src)
        assert secret not in str(info.value) and server.secret_key not in str(info.value)
        with pytest.raises(StorageError, match="access denied"):
            store.list()
    with pytest.raises(StorageError, match="bucket 'no-such-bucket' does not exist"):
        S3Store("s3://no-such-bucket/p", env=server.env()).put_file("f.bin", src=src)
    with pytest.raises(StorageError, match="does not exist"):
        S3Store("s3://no-such-bucket/p", env=server.env()).check()
    down = start_server(tmp_path / "down")
    down.stop()
    store = S3Store(f"s3://{down.bucket}/p", env=down.env(), max_attempts=2)
    with pytest.raises(StorageError, match="cannot reach the S3 endpoint"):
        store.put_file("f.bin", src=src)
    with pytest.raises(StorageError, match="cannot reach"):
        store.read_bytes("f.bin")
    with pytest.raises(SpecError, match=f"s3://{down.bucket}/p is not usable"):
        check_storage(f"s3://{down.bucket}/p", env=down.env())
    check_storage(f"s3://{server.bucket}/checked", env=server.env())
    assert server.client().list_objects_v2(Bucket=server.bucket, Prefix="checked/")["KeyCount"] == 0


def test_checkpoints_through_the_manager(server, tmp_path):
    store = _store(server, "ckpt/camp", multipart_threshold=5 * MIB, part_size=5 * MIB)
    manager = CheckpointManager(
        store, run_id=RUN, config_sha256=CFG, keep=2, staging_dir=tmp_path / "stage"
    )
    for step in (2, 4, 6):
        model, state = _state(step)
        saved = manager.save(step, model_state=model, train_state=state)
        assert saved.upload_s > 0
    assert manager.step_dirs() == [4, 6] and not any((tmp_path / "stage").iterdir())
    ck, refused = manager.load_latest()
    assert ck.step == 6 and not refused
    assert all(torch.equal(ck.model_state[k], _state(6)[0][k]) for k in ck.model_state)
    pointer = server.client().get_object(
        Bucket=server.bucket, Key=f"ckpt/camp/{RUN}/{CHECKPOINT_LATEST}"
    )
    assert json.loads(pointer["Body"].read())["step"] == 6
    # A new manager on another machine (a fresh staging folder) resumes from the bucket alone.
    other = CheckpointManager(_store(server, "ckpt/camp"), run_id=RUN, config_sha256=CFG)
    assert other.load_latest()[0].step == 6


class _FailingStateStore(S3Store):
    """The state file arrives truncated: its verification fails after the model went up."""

    def _upload(self, src: Path, key: str, *, extra: dict) -> None:
        if key.endswith(CHECKPOINT_STATE):
            cut = src.with_suffix(".cut")
            cut.write_bytes(src.read_bytes()[:-10])
            src = cut
        super()._upload(src, key, extra=extra)


def test_a_failed_upload_never_moves_latest(server, tmp_path):
    url = f"s3://{server.bucket}/ckptfail"
    good = CheckpointManager(S3Store(url, env=server.env()), run_id=RUN, config_sha256=CFG)
    model, state = _state(3)
    good.save(3, model_state=model, train_state=state)
    failing = CheckpointManager(
        _FailingStateStore(url, env=server.env()), run_id=RUN, config_sha256=CFG
    )
    wrong_keys = CheckpointManager(
        S3Store(url, env=_bad_env(server), max_attempts=2), run_id=RUN, config_sha256=CFG
    )
    for manager, reason in ((failing, "does not hold"), (wrong_keys, "access denied")):
        model, state = _state(5)
        with pytest.raises(StorageError, match=reason):
            manager.save(5, model_state=model, train_state=state)
        assert json.loads(good.store.read_bytes(f"{RUN}/{CHECKPOINT_LATEST}"))["step"] == 3
        assert not good.store.exists(f"{RUN}/{checkpoint_step_dir(5)}/meta.json")
    ck, _ = good.load_latest()
    assert ck.step == 3


def test_plan_refuses_wrong_keys_without_printing_the_secret(server, tmp_path):
    data = yaml.safe_load(EXAMPLE.read_text())
    data["storage"] = {"url": f"s3://{server.bucket}/plans/digits"}
    spec = write_spec_copy(data, source_dir=EXAMPLE.parent, dest=tmp_path / "spec")
    env = {**os.environ, **_bad_env(server), "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [sys.executable, "-m", "gpucampaign.cli", "plan", str(spec)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert f"s3://{server.bucket}/plans/digits" in " ".join(out.split()) and "access denied" in out
    assert _bad_env(server)["AWS_SECRET_ACCESS_KEY"] not in out and "Traceback" not in out
    proc = subprocess.run(
        [sys.executable, "-m", "gpucampaign.cli", "run", str(spec), "--out", str(tmp_path / "out")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "access denied" in out, out
    assert _bad_env(server)["AWS_SECRET_ACCESS_KEY"] not in out
    assert not (tmp_path / "out").exists()  # refused before anything was written or trained
    env = {**os.environ, **server.env(), "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [sys.executable, "-m", "gpucampaign.cli", "plan", str(spec), "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["fits"] is True


def _cli(*args: str, env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpucampaign.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow
def test_a_campaign_on_s3_then_mirror_retrieve_verify(server, tmp_path):
    """The digits example with its checkpoints in the bucket; its output folder mirrored to the
    same prefix, retrieved into a new folder elsewhere, and verified there."""
    data = yaml.safe_load(EXAMPLE.read_text())
    data["storage"] = {"url": f"s3://{server.bucket}/campaigns/digits"}
    spec = write_spec_copy(data, source_dir=EXAMPLE.parent, dest=tmp_path / "spec")
    env = {
        **os.environ,
        **server.env(),
        "PYTHONPATH": os.pathsep.join(sys.path),
        "PREFECT_HOME": str(tmp_path / "prefect-home"),
    }
    out = tmp_path / "out"
    proc = _cli("run", str(spec), "--out", str(out), env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert not (out / "checkpoints").exists()
    client = server.client()
    for run_dir in (out / "runs").iterdir():  # every run's LATEST is in the bucket
        pointer = client.get_object(
            Bucket=server.bucket, Key=f"campaigns/digits/{run_dir.name}/{CHECKPOINT_LATEST}"
        )
        step = json.loads(pointer["Body"].read())["dir"]
        client.head_object(
            Bucket=server.bucket, Key=f"campaigns/digits/{run_dir.name}/{step}/model.safetensors"
        )
    # The flow mirrored the sealed folder at its close; a second mirror sends nothing.
    assert f"mirrored to s3://{server.bucket}/campaigns/digits" in proc.stdout
    store = _store(server, "campaigns/digits")
    again = mirror_folder(out, store=store)
    manifest = json.loads((out / "manifest.json").read_bytes())
    assert again["files"] == len(manifest["files"]) + 1 and again["uploaded"] == 0
    # Checked with plain boto3: every file of the folder is in the bucket under the prefix.
    listed = server.client().list_objects_v2(
        Bucket=server.bucket, Prefix="campaigns/digits/", MaxKeys=1000
    )
    keys = {o["Key"].removeprefix("campaigns/digits/") for o in listed["Contents"]}
    assert {"manifest.json", MIRROR_INDEX} | {f["path"] for f in manifest["files"]} <= keys
    # The manifest's sha256, kept outside the folder: its object's metadata in the bucket.
    head = client.head_object(Bucket=server.bucket, Key="campaigns/digits/manifest.json")
    assert (
        head["Metadata"]["sha256"]
        == hashlib.sha256((out / "manifest.json").read_bytes()).hexdigest()
    )

    url = f"s3://{server.bucket}/campaigns/digits"
    back = tmp_path / "elsewhere" / "digits"
    proc = _cli("retrieve", url, "--to", str(back), env=env)
    assert proc.returncode == 0, proc.stderr
    proc = _cli("verify", str(back), env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not any(p.name.startswith(".tmp-") for p in back.parent.iterdir())

    assert _cli("retrieve", url, "--to", str(back), env=env).returncode == 2  # not empty
    assert _cli("retrieve", "gs://bucket/x", "--to", str(tmp_path / "n"), env=env).returncode == 2
    proc = _cli(
        "retrieve", f"s3://{server.bucket}/nothing-here", "--to", str(tmp_path / "n"), env=env
    )
    assert proc.returncode == 2 and "no mirrored output folder" in proc.stderr
    assert not (tmp_path / "n").exists()


def test_the_server_script_keeps_its_keys_private_and_stops_by_pid(tmp_path):
    script = [sys.executable, str(ROOT / "infra" / "s3server.py")]
    folder = tmp_path / "srv"

    def call(action: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*script, action, str(folder)], capture_output=True, text=True, timeout=180
        )

    def exports(proc: subprocess.CompletedProcess) -> dict[str, str]:
        return dict(line.removeprefix("export ").split("=", 1) for line in proc.stdout.splitlines())

    try:
        first = call("start")
        assert first.returncode == 0, first.stderr
        env = exports(first)
        assert env["AWS_ENDPOINT_URL"].startswith("http://127.0.0.1:")
        secret = env["AWS_SECRET_ACCESS_KEY"]
        for name in ("s3keys.json", "identities.json", "security.toml"):
            assert (folder / name).stat().st_mode & 0o077 == 0, name
        for name in ("s3server.json", "weed.log"):
            assert secret not in (folder / name).read_text(errors="replace"), name
        again = call("start")  # already running: the same server, the same keys
        assert again.stdout == first.stdout
        store = S3Store("s3://gpucampaign/script", env=env)
        store.write_bytes("k", data=b"v")
        assert call("status").returncode == 0
    finally:
        assert call("stop").returncode == 0
    assert call("status").returncode == 1
    restarted = call("start")  # a restart keeps the data and the keys (new ports)
    try:
        env2 = exports(restarted)
        assert env2["AWS_SECRET_ACCESS_KEY"] == secret
        assert S3Store("s3://gpucampaign/script", env=env2).read_bytes("k") == b"v"
    finally:
        call("stop")
