"""mirror_folder / retrieve_folder on a local store (the S3 path is tested end to end)."""

from __future__ import annotations

import hashlib
import json

import pytest

from gpucampaign.core.errors import ArgumentError
from gpucampaign.storage import LocalStore, StorageError
from gpucampaign.storage.mirror import MIRROR_INDEX, mirror_folder, retrieve_folder


def _folder(root):
    (root / "runs" / "r1").mkdir(parents=True)
    (root / "manifest.json").write_text('{"files": []}\n')
    (root / "runs" / "r1" / "params.json").write_text('{"lr": 0.1}\n')
    (root / "runs" / "r1" / ".tmp-half.bin").write_bytes(b"unfinished write")
    return root


def test_mirror_then_retrieve(tmp_path):
    out = _folder(tmp_path / "out")
    store = LocalStore(tmp_path / "bucket")
    first = mirror_folder(out, store=store)
    assert first["files"] == first["uploaded"] == 2
    # The manifest's sha256 is kept by the store with its copy (an S3 object's metadata).
    assert first["manifest_sha256"] == hashlib.sha256(b'{"files": []}\n').hexdigest()
    index = json.loads(store.read_bytes(MIRROR_INDEX))
    assert sorted(index["files"]) == ["manifest.json", "runs/r1/params.json"]  # no temp file
    assert mirror_folder(out, store=store)["uploaded"] == 0
    (out / "runs" / "r1" / "params.json").write_text('{"lr": 0.2}\n')
    assert mirror_folder(out, store=store)["uploaded"] == 1

    back = tmp_path / "back"
    done = retrieve_folder(store, dest=back)
    assert done["files"] == 2
    assert (back / "runs" / "r1" / "params.json").read_text() == '{"lr": 0.2}\n'
    assert not (back / MIRROR_INDEX).exists()
    with pytest.raises(ArgumentError, match="not an empty folder"):
        retrieve_folder(store, dest=back)


def test_retrieve_refuses_an_altered_file_and_leaves_nothing(tmp_path):
    out = _folder(tmp_path / "out")
    store = LocalStore(tmp_path / "bucket")
    mirror_folder(out, store=store)
    store.write_bytes("runs/r1/params.json", data=b'{"lr": 9.9}\n')
    with pytest.raises(StorageError, match="mirror index says"):
        retrieve_folder(store, dest=tmp_path / "back")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bucket", "out"]
    with pytest.raises(StorageError, match="no mirrored output folder"):
        retrieve_folder(LocalStore(tmp_path / "empty"), dest=tmp_path / "back")
