"""A store that keeps working while its S3 server is unreachable.

``SpoolingStore`` wraps a remote store (``S3Store``). A write the remote refuses goes to a
local spool folder instead (``OUT/spool``, written with fsync, so the checkpoint counts and
training goes on), and a background thread retries with backoff until the remote holds it.
A spooled file is deleted only after the remote verified its upload, and only if the spool
still holds the bytes that were uploaded.

Order: while anything is spooled, every write goes to the spool, and a ``LATEST`` pointer
goes up only when no file of the checkpoint it names is still waiting; so the bucket never
holds a ``LATEST`` naming a file it lacks. The spool drains checkpoint by checkpoint, oldest
first, each one's payload before its ``meta.json``, pointers last. Reads see the spool first
(it is newer).

Deletes (a checkpoint's prune, ``keep``) asked for while anything is spooled, or refused by
the remote, wait too, and are applied once the spool is empty: after an outage the bucket
holds what ``keep`` says, not every checkpoint saved meanwhile. While the spool is not empty
the remote is not asked for its listing (it may be frozen): the listing is what it last
answered plus what went up since.

An upload the store does not answer opens its outage, said once for the process
(``outage.Outages``, shared with the reads); the next upload it takes says that it is back.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

from gpucampaign.core import clock
from gpucampaign.core.files import sha256_bytes, sha256_file
from gpucampaign.folder.layout import CHECKPOINT_LATEST, CHECKPOINT_META, SPOOL_DIR
from gpucampaign.storage.base import LocalStore, NoAnswer, NotFound, StorageError, Store
from gpucampaign.storage.outage import OUTAGES, Outages

log = logging.getLogger(__name__)


def _is_pointer(key: str) -> bool:
    return key.rsplit("/", 1)[-1] == CHECKPOINT_LATEST


def _drain_order(keys: list[str]) -> list[str]:
    """Checkpoint folders oldest first (their names sort by step), each one's payload before
    its ``meta.json``; pointers last."""
    files = sorted(
        (k for k in keys if not _is_pointer(k)),
        key=lambda k: (k.rsplit("/", 1)[0] if "/" in k else "", k.endswith(CHECKPOINT_META), k),
    )
    return files + sorted(k for k in keys if _is_pointer(k))


def _under(key: str, prefix: str) -> bool:
    return not prefix or key.startswith(prefix.rstrip("/") + "/")


class SpoolingStore:
    """A remote store with a local spool for the writes it cannot take now.

    Args:
        remote: The store to upload to.
        spool_dir: The local spool folder (created on the first spooled write).
        retry_s: First wait between retries; doubles up to ``max_retry_s``.
        max_retry_s: Longest wait between retries.
        outages: Where an outage met by an upload is said, once for every store of the
            process.
    """

    def __init__(
        self,
        remote: Store,
        *,
        spool_dir: str | Path,
        retry_s: float = 2.0,
        max_retry_s: float = 60.0,
        outages: Outages = OUTAGES,
    ) -> None:
        self.remote = remote
        self.outages = outages
        self.url = remote.url
        self.spool = LocalStore(spool_dir)
        self.retry_s = retry_s
        self.max_retry_s = max_retry_s
        self.last_error: str | None = None
        self._lock = threading.RLock()
        self._draining = threading.Lock()  # one upload round at a time (thread or drain())
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._deletes: dict[str, None] = {}  # remote deletes waiting for the spool to empty
        self._remote_keys: set[str] = set()  # what the remote last listed, plus uploads since
        if self.pending():
            self._start()

    def __repr__(self) -> str:
        return f"SpoolingStore({self.remote!r}, spool={str(self.spool.root)!r})"

    def __reduce__(self) -> Any:
        raise TypeError("a SpoolingStore is not picklable: open it where it is used (open_store)")

    # --- the spool ---------------------------------------------------------------------
    def pending(self) -> list[str]:
        """Keys waiting in the spool: on this machine only, not yet in the remote store."""
        return self.spool.list()

    def _start(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._drain_loop, daemon=True, name="gpucampaign-spool"
                )
                self._thread.start()
        self._wake.set()

    def waiting_deletes(self) -> list[str]:
        """Keys to delete from the remote once the spool is empty (``keep`` after an outage)."""
        with self._lock:
            return list(self._deletes)

    def _drain_loop(self) -> None:
        wait = self.retry_s
        while self.pending() or self._deletes:
            if self.drain_once():
                wait = self.retry_s
                continue
            self._wake.wait(wait)
            self._wake.clear()
            wait = min(wait * 2, self.max_retry_s)

    def drain_once(self) -> bool:
        """Upload what the spool holds (files first, then pointers whose files are up).

        Returns:
            True when this round uploaded something or the spool is empty.
        """
        moved = False
        with self._draining:
            keys = self.pending()
            try:
                for key in _drain_order(keys):
                    moved |= self._upload(key)
                if keys and not self.pending():
                    log.warning(
                        "checkpoint store %s: the spool is drained (%d file(s) uploaded)",
                        self.url,
                        len(keys),
                    )
                if not self.pending():
                    moved |= self._apply_deletes()
            except OSError as exc:  # StorageError, or a spooled file replaced meanwhile
                self.last_error = str(exc)
                return moved
        self.last_error = None
        return moved or not (self.pending() or self._deletes)

    def _apply_deletes(self) -> bool:
        """Delete from the remote what was deleted while the spool held anything."""
        with self._lock:
            keys = list(self._deletes)
        for key in keys:
            self.remote.delete(key)
            with self._lock:
                self._remote_keys.discard(key)
                self._deletes.pop(key, None)
        return bool(keys)

    def _upload(self, key: str) -> bool:
        path = self.spool.local_path(key)
        assert path is not None
        try:
            data = path.read_bytes() if _is_pointer(key) else None
            digest = sha256_bytes(data) if data is not None else sha256_file(path)
        except FileNotFoundError:
            return False  # deleted (pruned) meanwhile
        if data is not None:
            if self._waits_for_files(key, data):
                return False
            self.remote.write_bytes(key, data=data)
        else:
            self.remote.put_file(key, src=path, sha256=digest)
        self.outages.back(self.url)
        with self._lock:  # delete only the bytes that went up, not a newer version
            self._remote_keys.add(key)
            try:
                same = sha256_file(path) == digest
            except FileNotFoundError:
                return True
            if same:
                self.spool.delete(key)
        return True

    def _waits_for_files(self, key: str, data: bytes) -> bool:
        try:
            target = str(json.loads(data)["dir"])
        except (ValueError, KeyError, TypeError):
            return False
        folder = f"{key.rsplit('/', 1)[0]}/{target}/" if "/" in key else f"{target}/"
        return any(k.startswith(folder) for k in self.pending())

    def drain(self, *, timeout_s: float = 0.0) -> list[str]:
        """Try to empty the spool now, for up to ``timeout_s`` seconds; the keys still waiting."""
        deadline = clock.monotonic() + timeout_s
        while self.pending() or self._deletes:
            progressed = self.drain_once()
            if clock.monotonic() >= deadline:
                break
            if not progressed:
                clock.sleep(min(self.retry_s, max(0.0, deadline - clock.monotonic())))
        return self.pending()

    def _spool_or_remote(self, key: str, write_remote: Any, write_spool: Any) -> None:
        with self._lock:
            self._deletes.pop(key, None)  # written again after a delete: the write wins
            if not self.pending():
                try:
                    write_remote()
                    self._remote_keys.add(key)
                    self.outages.back(self.url)
                    return
                except NotFound:
                    raise
                except StorageError as exc:
                    self.last_error = str(exc)
                    self._say_refused(key, exc)
            write_spool()
        self._start()

    def _say_refused(self, key: str, exc: StorageError) -> None:
        """An upload refused: an outage (the store did not answer) is said once for the
        process; any other refusal, or this upload during an outage already said, here."""
        then = (
            f"waits in the spool {self.spool.root} and goes up when the store answers again; "
            "training goes on"
        )
        if isinstance(exc, NoAnswer) and (
            self.outages.down(self.url, what=f"uploading {key}", error=exc, then=then)
            or self.outages.is_down(self.url)
        ):
            log.info("checkpoint store %s did not take %s (%s): it %s", self.url, key, exc, then)
            return
        log.warning("checkpoint store %s did not take %s (%s): it %s", self.url, key, exc, then)

    # --- the Store interface -----------------------------------------------------------
    def put_file(self, key: str, *, src: Path, sha256: str | None = None) -> None:
        """Upload ``src``; when the remote refuses, keep it in the spool (verified locally)."""
        if not Path(src).is_file():
            raise NotFound(f"local file {src} does not exist")
        self._spool_or_remote(
            key,
            lambda: self.remote.put_file(key, src=src, sha256=sha256),
            lambda: self.spool.put_file(key, src=src),
        )

    def write_bytes(self, key: str, *, data: bytes) -> None:
        """Write ``data``; when the remote refuses, keep it in the spool."""
        self._spool_or_remote(
            key,
            lambda: self.remote.write_bytes(key, data=data),
            lambda: self.spool.write_bytes(key, data=data),
        )

    def get_file(self, key: str, *, dst: Path) -> None:
        """Download ``key`` (from the spool when it waits there)."""
        if self.spool.exists(key):
            self.spool.get_file(key, dst=dst)
        else:
            self.remote.get_file(key, dst=dst)

    def exists(self, key: str) -> bool:
        """True when the spool or the remote holds ``key``."""
        return self.spool.exists(key) or self.remote.exists(key)

    def size(self, key: str) -> int:
        """Size of ``key`` (the spooled version when there is one)."""
        return self.spool.size(key) if self.spool.exists(key) else self.remote.size(key)

    def list(self, prefix: str = "") -> list[str]:
        """Keys in the spool or the remote under ``prefix``; the remote's listing may fail
        while it is unreachable, then only the spool's keys are known."""
        spooled = set(self.spool.list(prefix))
        remote: set[str]
        if spooled or self.pending():  # the remote is down, or was: do not wait for it
            with self._lock:
                remote = {k for k in self._remote_keys if _under(k, prefix)}
        else:
            try:
                remote = set(self.remote.list(prefix))
                with self._lock:
                    self._remote_keys = {
                        k for k in self._remote_keys if not _under(k, prefix)
                    } | remote
            except StorageError as exc:
                self.last_error = str(exc)
                with self._lock:
                    remote = {k for k in self._remote_keys if _under(k, prefix)}
        with self._lock:
            return sorted((remote - set(self._deletes)) | spooled)

    def delete(self, key: str) -> None:
        """Delete ``key`` from the remote. A spooled copy stays until its upload is verified;
        while anything is spooled (or when the remote refuses) the delete waits and is applied
        once the spool is empty."""
        with self._lock:
            waiting = bool(self.pending())
            if waiting:
                self._deletes[key] = None
        if waiting:
            self._start()
            return
        try:
            self.remote.delete(key)
            with self._lock:
                self._remote_keys.discard(key)
        except StorageError as exc:
            self.last_error = str(exc)
            with self._lock:
                self._deletes[key] = None
            self._start()

    def read_bytes(self, key: str) -> bytes:
        """The object (the spooled version when there is one)."""
        if self.spool.exists(key):
            return self.spool.read_bytes(key)
        return self.remote.read_bytes(key)

    def read_hashed(self, key: str) -> tuple[bytes | bytearray, str]:
        """The object and its sha256 (the spooled version when there is one)."""
        if self.spool.exists(key):
            return self.spool.read_hashed(key)
        return self.remote.read_hashed(key)

    def local_path(self, key: str) -> Path | None:
        """Always ``None``: the checkpoint code stages files and uploads them."""
        return None


def spooled_keys(out: str | Path) -> list[str]:
    """Checkpoint files of an output folder waiting in its spool: not yet in the S3 store."""
    return LocalStore(Path(out) / SPOOL_DIR).list()
