"""Copy a whole output folder to a store and back: ``mirror_folder``, ``retrieve_folder``,
and ``mirror_output`` (the close's mirror to the campaign's S3 store, after the spool).

The mirror's index (``mirror-index.json``: every file with its size and sha256) is written
last, so an interrupted mirror leaves the previous complete one readable. A campaign's close
mirrors through its ``Fence``: nothing is sent when the store's ``manifest.json`` is no longer
the one the run found at its start (another host closed the campaign since: this copy is stale).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpucampaign.core.errors import ArgumentError
from gpucampaign.core.files import (
    TMP_PREFIX,
    fsync_dir,
    json_bytes,
    sha256_bytes,
    sha256_file,
    utc_now,
)
from gpucampaign.core.storageurl import LOCAL, is_local
from gpucampaign.folder.layout import LOCK_FILE, MANIFEST, SPOOL_DIR, is_live_progress
from gpucampaign.storage.base import LocalStore, NotFound, StorageError, Store, check_key
from gpucampaign.storage.open import open_store
from gpucampaign.storage.spool import SpoolingStore, spooled_keys

MIRROR_INDEX = "mirror-index.json"
_MIRROR_FORMAT = "gpucampaign-mirror/1"
#: The most files a mirror index may list before a retrieve refuses it unread.
MAX_MIRROR_FILES = 1_000_000
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Fence:
    """The store's ``manifest.json`` as a campaign's run found it at its start, under the
    campaign lock (``preflight/stale.py``): its sha256, None when the store held none. The
    run's close mirrors into the store only while the store's manifest is still that one."""

    manifest_sha256: str | None


def store_manifest_sha256(store: Store) -> str | None:
    """The sha256 of the store's ``manifest.json`` (None: the store holds none)."""
    try:
        return sha256_bytes(store.read_bytes(MANIFEST))
    except NotFound:
        return None


def _check_fence(store: Store, fence: Fence, *, root: Path) -> None:
    """Raise unless the store's manifest is still the one ``fence`` found, or already the
    folder's own (a mirror of this folder sent it before it was cut)."""
    now = store_manifest_sha256(store)
    own = sha256_file(root / MANIFEST) if (root / MANIFEST).is_file() else None
    if now != fence.manifest_sha256 and (now is None or now != own):
        raise StorageError(
            f"{store.url}/{MANIFEST} changed since this run started (sha256 now {now}, at its "
            f"start {fence.manifest_sha256 or 'none'}): another host closed the campaign, this "
            "copy is stale and sent nothing; bring the campaign's folder back with `campaign "
            f"retrieve {store.url} --to NEW_FOLDER`"
        )


def mirror_folder(
    folder: str | Path, *, store: Store, workers: int = 8, fence: Fence | None = None
) -> dict[str, Any]:
    """Copy every file of ``folder`` to the same relative keys in ``store``, then its index.

    Each upload is verified by the store before the index (``mirror-index.json``: every
    file with its size and sha256) is written; a file the previous index lists with the same
    hash and the store holds with the same size is not sent again. The index is what
    ``retrieve_folder`` brings back, so a mirror interrupted half-way leaves the previous
    complete one readable. Temporary files of unfinished writes are skipped. With ``fence``,
    nothing is sent unless the store's ``manifest.json`` is still the one the fence found.

    Returns:
        ``{"url", "files", "uploaded", "bytes", "manifest_sha256"}``: the last is the sha256
        the store keeps with its ``manifest.json`` (an S3 object's metadata), None without one.

    Raises:
        StorageError: An upload failed or was not verified (the index did not move), or the
            fence found another manifest (nothing was sent).
    """
    root = Path(folder)
    if not root.is_dir():
        raise StorageError(f"cannot mirror {root}: not a folder")
    if fence is not None:
        _check_fence(store, fence, root=root)
    rels = [
        r
        for r in LocalStore(root).list()
        if r not in (MIRROR_INDEX, LOCK_FILE)
        and not r.startswith(f"{SPOOL_DIR}/")
        and not is_live_progress(r)  # transient, like the lock: not part of the sealed folder
        and not (root / r).is_symlink()
    ]
    try:
        data = store.read_bytes(MIRROR_INDEX)
    except NotFound:
        data = b'{"files": {}}'
    try:
        previous = mirror_index_files(data, where=store.url)
    except StorageError:  # not an index this mirror wrote: every file is sent again
        previous = {}

    def send(rel: str) -> tuple[str, dict[str, Any], bool]:
        info: dict[str, Any] = {
            "bytes": (root / rel).stat().st_size,
            "sha256": sha256_file(root / rel),
        }
        if previous.get(rel) == info and store.exists(rel) and store.size(rel) == info["bytes"]:
            return rel, info, False
        store.put_file(rel, src=root / rel, sha256=info["sha256"])
        return rel, info, True

    with ThreadPoolExecutor(max_workers=workers) as pool:
        done = list(pool.map(send, rels))
    index = {
        "format": _MIRROR_FORMAT,
        "mirrored_at": utc_now(),
        "files": {rel: info for rel, info, _ in done},
    }
    store.write_bytes(MIRROR_INDEX, data=json_bytes(index))
    manifest = next((info for rel, info, _ in done if rel == MANIFEST), None)
    return {
        "url": store.url,
        "files": len(done),
        "uploaded": sum(sent for *_, sent in done),
        "bytes": sum(info["bytes"] for _, info, _ in done),
        # Kept outside the folder too: the metadata of the store's manifest.json object (S3).
        "manifest_sha256": manifest["sha256"] if manifest else None,
    }


def retrieve_folder(store: Store, *, dest: str | Path, workers: int = 8) -> dict[str, Any]:
    """Bring a mirrored output folder back from ``store`` into the new folder ``dest``.

    Every file of the mirror's index is downloaded and checked against the size and sha256
    the index holds; the files land in a temporary folder beside ``dest`` that is renamed to
    ``dest`` only when all of them are there, so a failed retrieve leaves no half folder.

    Returns:
        ``{"url", "dest", "files", "bytes"}``.

    Raises:
        SpecError: ``dest`` exists and is not an empty folder.
        StorageError: No mirror under the store's URL, or a file is missing or altered.
    """
    dest = Path(dest)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ArgumentError(
            f"'{dest}' exists and is not an empty folder: retrieve into a new one.", field="--to"
        )
    try:
        files = mirror_index_files(store.read_bytes(MIRROR_INDEX), where=store.url)
    except NotFound:
        msg = f"{store.url} holds no mirrored output folder (no {MIRROR_INDEX})"
        raise StorageError(msg) from None
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = dest.parent / f"{TMP_PREFIX}{dest.name}-{uuid.uuid4().hex[:8]}"

    def fetch(rel: str) -> int:
        target = work / check_key(rel)
        store.get_file(rel, dst=target)
        with open(target, "rb") as f:  # get_file does not fsync; the folder is kept for good
            os.fsync(f.fileno())
        want = files[rel]
        size, digest = target.stat().st_size, sha256_file(target)
        if size != want["bytes"] or digest != want["sha256"]:
            raise StorageError(
                f"{store.url}/{rel}: {size} bytes / sha256 {digest[:12]}, "
                f"the mirror index says {want['bytes']} / {want['sha256'][:12]}"
            )
        return size

    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            total = sum(pool.map(fetch, sorted(files)))
        if dest.exists():
            dest.rmdir()
        os.rename(work, dest)
        fsync_dir(dest.parent)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"url": store.url, "dest": str(dest), "files": len(files), "bytes": total}


def mirror_index_files(data: bytes, *, where: str) -> dict[str, dict[str, Any]]:
    """The ``files`` of a mirror index's bytes, each a safe key with an integer size and a
    sha256, checked before anything is downloaded.

    Raises:
        StorageError: The bytes are not such an index (the message names what is wrong).
    """

    def bad(why: str) -> StorageError:
        return StorageError(
            f"{where}/{MIRROR_INDEX} is not a mirror index ({why}): the bucket was not written "
            "by `campaign run`'s mirror, or was altered; nothing was retrieved"
        )

    try:
        files = json.loads(data.decode("utf-8"))["files"]
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise bad(str(exc)[:200]) from None
    if not isinstance(files, dict) or len(files) > MAX_MIRROR_FILES:
        raise bad(f"'files' is not a mapping of at most {MAX_MIRROR_FILES} files")
    for rel, info in files.items():
        check_key(rel)
        if not (
            isinstance(info, dict)
            and type(info.get("bytes")) is int
            and info["bytes"] >= 0
            and isinstance(info.get("sha256"), str)
            and _SHA256.fullmatch(info["sha256"])
        ):
            raise bad(f"the entry of '{rel[:200]}' is not {{bytes, sha256}}")
    return files


def mirror_output(
    root: str | Path,
    *,
    url: str,
    env: Mapping[str, str] | None = None,
    drain_s: float = 60.0,
    fence: Fence | None = None,
) -> dict[str, Any]:
    """Mirror a closed output folder to the campaign's S3 store (nothing to do for 'local').

    Checkpoint files still waiting in the folder's spool are uploaded first (for up to
    ``drain_s`` seconds); those that remain are named in the result. With ``fence`` the
    folder is sent only while the store's ``manifest.json`` is the one the run found at its
    start (``mirror_folder``).

    Returns:
        ``{"url", "files", "uploaded", "bytes"}`` after a mirror, ``{"url": "local"}`` when the
        files stay on this machine, or ``{"url", "error", "spooled"}`` when the store refused
        the folder or some checkpoint files: they are complete here but not yet off the
        machine, and a later ``mirror`` can finish it.
    """
    if is_local(url):
        return {"url": LOCAL}
    try:
        # The close waits for the store only through the drain (its writes cannot wait; a
        # later mirror finishes what is left), not through each read as a run's start does.
        store = open_store(url, out=root, env=env, spool=False, read_wait_s=0)
        if fence is not None:  # before the spool's checkpoints too: a stale copy sends nothing
            _check_fence(store, fence, root=Path(root))
        pending = spooled_keys(root)
        if pending:
            spooling = SpoolingStore(store, spool_dir=Path(root) / SPOOL_DIR)
            pending = spooling.drain(timeout_s=drain_s)
        done = mirror_folder(root, store=store, fence=fence)
    except StorageError as exc:
        return {"url": url, "error": str(exc), "spooled": spooled_keys(root)}
    if pending:
        done.update(
            spooled=pending,
            error=(
                f"{len(pending)} checkpoint file(s) are still only on this machine in "
                f"{Path(root) / SPOOL_DIR}: the S3 server did not take them yet"
            ),
        )
    return done
