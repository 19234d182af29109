"""The private copy an anchored folder is verified from (``verify --expect SHA256``).

The manifest's sha256 is checked once, on bytes read once; those bytes and every file they
vouch for are copied into a folder of this process's own (a fresh temporary folder, mode
0700), and the checks that trust the folder (the spec copy loaded, the models reloaded with
the folder's recipe copies) read only that copy. A file swapped in the folder after the check,
its recipe copy, a ``config.json`` or the manifest itself, is never what runs: the copy's
files are hashed again against the anchored manifest before any of them is trusted.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any

from gpucampaign.folder.layout import LEDGER_FILE, MANIFEST

_CHUNK = 1 << 20
#: How far past its sealed size a file is read: the ledger grows after the seal (expenses);
#: any other file longer than sealed is a mismatch the checks name from its first extra byte.
_LEDGER_GROWTH = 16 << 20


def _read_regular(path: Path, *, limit: int) -> bytes | None:
    """At most ``limit`` bytes of a regular file (no link followed at its last part, a FIFO or
    a device never opened for reading), or None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None
        parts, left = [], limit
        while left > 0 and (chunk := f.read(min(_CHUNK, left))):
            parts.append(chunk)
            left -= len(chunk)
        return b"".join(parts)


def _safe_rel(rel: Any) -> PurePosixPath | None:
    if not isinstance(rel, str) or not rel or "\\" in rel:
        return None
    p = PurePosixPath(rel)
    if p.is_absolute() or ".." in p.parts or p.parts[:1] == (MANIFEST,):
        return None
    return p


def copy_anchored(root: Path, into: Path, *, expect: str) -> bool:
    """Copy ``root``'s manifest and the files it lists into ``into`` when the manifest's bytes,
    read once, have the sha256 ``expect``; False (nothing copied) when they do not.

    Each file is copied as read (a regular file only, at most its sealed size plus one byte,
    the ledger its growth too); the checks run on the copy then name any file that differs."""
    manifest = _read_regular(root / MANIFEST, limit=64 << 20)
    if manifest is None or hashlib.sha256(manifest).hexdigest() != expect:
        return False
    try:
        entries = json.loads(manifest.decode("utf-8")).get("files")
    except (ValueError, UnicodeDecodeError, AttributeError):
        entries = None
    for entry in entries if isinstance(entries, list) else []:
        rel = _safe_rel(entry.get("path") if isinstance(entry, dict) else None)
        size = entry.get("size") if isinstance(entry, dict) else None
        if rel is None or not isinstance(size, int) or size < 0:
            continue  # named by the checks on the copy (an entry they refuse)
        extra = _LEDGER_GROWTH if str(rel) == LEDGER_FILE else 1
        data = _read_regular(root.joinpath(*rel.parts), limit=size + extra)
        if data is None:
            continue  # missing in the copy: the checks name it
        target = into.joinpath(*rel.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    (into / MANIFEST).write_bytes(manifest)
    return True


@contextmanager
def private_copy(root: Path, *, expect: str) -> Iterator[Path | None]:
    """A private copy of an anchored folder (``copy_anchored``), removed afterwards; None when
    the manifest is not the one ``expect`` names."""
    with tempfile.TemporaryDirectory(prefix="gpucampaign-verify-") as tmp:
        copy = Path(tmp) / "out"
        copy.mkdir()
        yield copy if copy_anchored(root, copy, expect=expect) else None
