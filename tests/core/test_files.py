"""The file helpers' per-process hash cache."""

from __future__ import annotations

import hashlib
import os

from gpucampaign.core import files
from gpucampaign.core.files import sha256_file


def test_a_file_is_hashed_once_until_it_changes(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "_HASHED", {})
    path = tmp_path / "corpus.csv"
    path.write_bytes(b"a,b\n1,2\n")
    assert sha256_file(path) == hashlib.sha256(b"a,b\n1,2\n").hexdigest()
    assert files._HASHED == {}  # just written: within the racy window, never cached
    monkeypatch.setattr(files, "_RACY_NS", 0)
    digest = sha256_file(path)
    assert list(files._HASHED.values()) == [digest]
    key = next(iter(files._HASHED))
    files._HASHED[key] = "from-the-cache"
    assert sha256_file(path) == "from-the-cache"  # the second call does not read the file
    tmp = tmp_path / "new"
    tmp.write_bytes(b"a,b\n3,4\n")
    os.replace(tmp, path)  # same size, new inode: a miss
    assert sha256_file(path) == hashlib.sha256(b"a,b\n3,4\n").hexdigest()
