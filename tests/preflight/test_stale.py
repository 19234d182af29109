"""A stale copy never writes over a sealed campaign (issue 45): a host whose output folder is
older than the campaign another host closed for good in the store is refused before anything
is written, here or in the store; any other start gets the store's manifest as its fence, and
a fenced mirror sends nothing once the store's manifest changed under it.

The store is a local folder standing for the bucket (on the real stack:
tests/faults/test_stale_host_s3.py).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from gpucampaign.core.errors import FolderError
from gpucampaign.preflight import stale
from gpucampaign.preflight.stale import fence_sealed_store
from gpucampaign.storage import LocalStore, StorageError
from gpucampaign.storage.mirror import Fence, mirror_folder, mirror_output
from tests.helpers.specs import TRAIN_CONTROL, one_lot_spec

URL = "s3://bucket/campaign"
SEALED = json.dumps({"runs": {"control": {"status": "completed"}}}).encode()
RESUMABLE = json.dumps({"runs": {"control": {"status": "interrupted"}}}).encode()


def _spec():
    cs = one_lot_spec(TRAIN_CONTROL)
    return cs.model_copy(update={"storage": cs.storage.model_copy(update={"url": URL})})


def _snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.fixture
def bucket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LocalStore:
    store = LocalStore(tmp_path / "bucket")
    monkeypatch.setattr(stale, "open_store", lambda *a, **k: store)
    return store


def test_an_old_folder_is_refused_after_another_host_sealed_the_campaign(tmp_path, bucket):
    bucket.write_bytes("manifest.json", data=SEALED)
    bucket.write_bytes("report.md", data=b"host B's report\n")
    old = tmp_path / "host-a" / "out"
    (old / "runs" / "control").mkdir(parents=True)
    (old / "runs" / "control" / "metrics.jsonl").write_text('{"step": 3018}\n')
    before = (_snapshot(tmp_path / "bucket"), _snapshot(old))
    with pytest.raises(FolderError) as refused:
        fence_sealed_store(old, spec=_spec())
    said = str(refused.value)
    sha = hashlib.sha256(SEALED).hexdigest()
    assert "closed for good in s3://bucket/campaign" in said and sha in said
    assert "it has no manifest.json" in said and f"--expect {sha}" in said
    assert f"campaign retrieve {URL} --to NEW_FOLDER" in said and "\n" not in said
    assert (_snapshot(tmp_path / "bucket"), _snapshot(old)) == before
    # A folder sealed with another manifest (an older close) is refused too; a fresh host too.
    (old / "manifest.json").write_bytes(RESUMABLE)
    with pytest.raises(FolderError, match="its manifest.json has sha256"):
        fence_sealed_store(old, spec=_spec())
    with pytest.raises(FolderError, match="no manifest.json"):
        fence_sealed_store(tmp_path / "fresh", spec=_spec())
    assert not (tmp_path / "fresh").exists()


def test_the_sealed_folder_itself_and_an_open_campaign_get_their_fence(tmp_path, bucket):
    out = tmp_path / "out"
    assert fence_sealed_store(out, spec=_spec()) == Fence(manifest_sha256=None)
    bucket.write_bytes("manifest.json", data=RESUMABLE)  # closed resumable: it goes on
    assert fence_sealed_store(out, spec=_spec()) == Fence(
        manifest_sha256=hashlib.sha256(RESUMABLE).hexdigest()
    )
    bucket.write_bytes("manifest.json", data=SEALED)
    out.mkdir()
    (out / "manifest.json").write_bytes(SEALED)  # the sealed folder (a rerun verifies it)
    assert fence_sealed_store(out, spec=_spec()) == Fence(
        manifest_sha256=hashlib.sha256(SEALED).hexdigest()
    )
    local = one_lot_spec(TRAIN_CONTROL)  # the folder's writer lock guards a local store
    assert fence_sealed_store(out, spec=local) is None


def test_a_fenced_mirror_sends_nothing_once_another_host_sealed(tmp_path, monkeypatch):
    bucket = LocalStore(tmp_path / "bucket")
    out = tmp_path / "out"
    (out / "runs" / "control").mkdir(parents=True)
    (out / "manifest.json").write_bytes(RESUMABLE)
    (out / "report.md").write_text("host A's stale report\n")
    fence = Fence(manifest_sha256=None)  # the store held no manifest when the run started
    bucket.write_bytes("manifest.json", data=SEALED)  # host B sealed it meanwhile
    before = _snapshot(tmp_path / "bucket")
    with pytest.raises(StorageError, match="changed since this run started"):
        mirror_folder(out, store=bucket, fence=fence)
    monkeypatch.setattr("gpucampaign.storage.mirror.open_store", lambda *a, **k: bucket)
    result = mirror_output(out, url=URL, fence=fence)
    assert "another host closed the campaign" in result["error"]
    assert _snapshot(tmp_path / "bucket") == before
    # The store's manifest as the run found it, or already the folder's own: it is sent.
    assert mirror_folder(out, store=bucket, fence=Fence(hashlib.sha256(SEALED).hexdigest()))
    assert bucket.read_bytes("report.md") == b"host A's stale report\n"
    assert mirror_folder(out, store=bucket, fence=fence)["uploaded"] == 0
