"""Where checkpoints live: a small ``Store`` interface, a local folder and an S3 bucket.

Keys are relative POSIX paths (``<run_id>/step-000000020/model.safetensors``); a key that is
absolute, empty, or climbs with ``..`` is refused before any file is touched. Vendor and OS
errors are turned into our own types (``StorageError``, ``NotFound``) so callers never
depend on a backend's exceptions.

Backends: ``LocalStore`` (a folder, atomic writes with fsync) and ``S3Store`` (boto3, with
its client and hashing helpers in ``s3client``; its ``local_path`` returns ``None``, which
makes the checkpoint code stage files locally and upload them with ``put_file``).
``open_store`` is the one place that maps a spec's ``storage.url`` to a backend;
``check_storage`` tries the URL, the credentials and the bucket before anything trains.
Copying a whole output folder to a store and back lives in ``mirror``; the spool that keeps
checkpoints while S3 is unreachable in ``spool``.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath
from typing import Any, Protocol, runtime_checkable

from gpucampaign.core.files import TMP_PREFIX, atomic_copy, atomic_write_bytes, read_hashed
from gpucampaign.core.text import redact_secrets

_CHUNK = 8 * 1024 * 1024


class StorageError(OSError):
    """A store operation failed (I/O error, refused key, backend error).

    Its message never holds the password of a URL (an endpoint given as
    ``http://user:password@host`` is said as ``http://***@host``: its whole user part).
    """

    def __init__(self, *args: Any) -> None:
        super().__init__(*(redact_secrets(a) if isinstance(a, str) else a for a in args))


class NotFound(StorageError):
    """The key does not exist in the store."""


class NoAnswer(StorageError):
    """The store did not answer a request: refused or dropped connection, time-out, busy."""


class StoreUnreachable(StorageError):
    """The store did not answer a read within the time it is waited for (``read_wait_s``)."""


class ContentMismatch(StorageError):
    """An object's bytes do not hash to the sha256 recorded with it (altered in the store).

    ``expected`` is the recorded sha256, ``actual`` the sha256 of the bytes read.
    """

    def __init__(self, message: str, *, expected: str, actual: str) -> None:
        super().__init__(message)
        self.expected = expected
        self.actual = actual

    def __reduce__(self) -> Any:
        return (_content_mismatch, (str(self), self.expected, self.actual))


def _content_mismatch(message: str, expected: str, actual: str) -> ContentMismatch:
    return ContentMismatch(message, expected=expected, actual=actual)


def check_key(key: str) -> str:
    """Return ``key`` when it is a safe relative POSIX path, else raise ``StorageError``."""
    if not isinstance(key, str) or not key or "\\" in key or "\x00" in key:
        raise StorageError(f"invalid store key {key!r}: use a non-empty relative POSIX path")
    p = PurePosixPath(key)
    if p.is_absolute() or any(part in ("..", ".", "") for part in key.split("/")):
        raise StorageError(
            f"store key {key!r} must be relative and must not contain '.', '..' or '//'"
        )
    return key


@runtime_checkable
class Store(Protocol):
    """A flat key -> bytes store. Writes are atomic: a reader sees the old or the new object."""

    url: str

    def put_file(self, key: str, *, src: Path, sha256: str | None = None) -> None:
        """Upload the local file ``src`` to ``key``; ``sha256`` is its hash when the caller
        already has it (a remote store then records it without reading the file twice)."""
        ...

    def get_file(self, key: str, *, dst: Path) -> None:
        """Download ``key`` into the local file ``dst`` (written atomically)."""
        ...

    def exists(self, key: str) -> bool:
        """True when ``key`` exists."""
        ...

    def size(self, key: str) -> int:
        """Size of ``key`` in bytes; ``NotFound`` when absent."""
        ...

    def list(self, prefix: str = "") -> list[str]:
        """Sorted keys under ``prefix`` (a folder-like prefix, '' for all)."""
        ...

    def delete(self, key: str) -> None:
        """Delete ``key``; deleting a missing key is not an error."""
        ...

    def read_bytes(self, key: str) -> bytes:
        """The whole object; ``NotFound`` when absent."""
        ...

    def read_hashed(self, key: str) -> tuple[bytes | bytearray, str]:
        """The whole object and its sha256 (a remote store's download was checked with it, so
        the caller need not hash it again); ``NotFound`` when absent."""
        ...

    def write_bytes(self, key: str, *, data: bytes) -> None:
        """Write ``data`` to ``key`` atomically."""
        ...

    def local_path(self, key: str) -> Path | None:
        """Filesystem path of ``key`` when the store is a local folder, else ``None``."""
        ...


class LocalStore:
    """A store in a local folder (the default: ``OUT/checkpoints``)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()
        self.url = self.root.as_uri()

    def __repr__(self) -> str:
        return f"LocalStore({str(self.root)!r})"

    def _path(self, key: str) -> Path:
        target = self.root / check_key(key)
        resolved = target.resolve()
        if resolved != self.root and self.root not in resolved.parents:
            raise StorageError(
                f"store key {key!r} resolves outside the store root (through a link?)"
            )
        return target

    def local_path(self, key: str) -> Path | None:
        """Filesystem path of ``key`` (it may not exist yet)."""
        return self._path(key)

    def put_file(self, key: str, *, src: Path, sha256: str | None = None) -> None:
        """Copy ``src`` to ``key`` (temp name, fsync, rename); ``sha256`` is not needed here."""
        dst = self._path(key)
        try:
            atomic_copy(src, dst)
        except FileNotFoundError as exc:
            raise NotFound(f"local file {src} does not exist") from exc
        except OSError as exc:
            raise StorageError(f"cannot write {key!r} in {self.root}: {exc}") from exc

    def get_file(self, key: str, *, dst: Path) -> None:
        """Copy ``key`` to the local file ``dst`` atomically."""
        src = self._path(key)
        if not src.is_file():
            raise NotFound(f"{key!r} not found in {self.root}")
        dst = Path(dst)
        try:
            atomic_copy(src, dst)
        except OSError as exc:
            raise StorageError(f"cannot copy {key!r} to {dst}: {exc}") from exc

    def exists(self, key: str) -> bool:
        """True when ``key`` is a file in the store."""
        return self._path(key).is_file()

    def size(self, key: str) -> int:
        """Size of ``key`` in bytes."""
        p = self._path(key)
        try:
            return p.stat().st_size
        except FileNotFoundError:
            raise NotFound(f"{key!r} not found in {self.root}") from None

    def list(self, prefix: str = "") -> list[str]:
        """Sorted keys under ``prefix``; temp files of unfinished writes are not listed."""
        base = self._path(prefix) if prefix else self.root
        if not base.is_dir():
            return []
        keys = []
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = [d for d in dirnames if not d.startswith(TMP_PREFIX)]
            for name in filenames:
                if name.startswith(TMP_PREFIX):
                    continue
                keys.append(Path(dirpath, name).relative_to(self.root).as_posix())
        return sorted(keys)

    def delete(self, key: str) -> None:
        """Delete ``key`` and the folders it leaves empty (up to the root)."""
        p = self._path(key)
        try:
            p.unlink()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise StorageError(f"cannot delete {key!r}: {exc}") from exc
        parent = p.parent
        while parent != self.root and parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent

    def read_hashed(self, key: str) -> tuple[bytes | bytearray, str]:
        """The content of ``key`` and its sha256, hashed while it is read."""
        p = self._path(key)
        if not p.is_file():
            raise NotFound(f"{key!r} not found in {self.root}")
        try:
            return read_hashed(p)
        except FileNotFoundError:
            raise NotFound(f"{key!r} not found in {self.root}") from None
        except OSError as exc:
            raise StorageError(f"cannot read {key!r}: {exc}") from exc

    def read_bytes(self, key: str) -> bytes:
        """The content of ``key``."""
        p = self._path(key)
        try:
            return p.read_bytes()
        except FileNotFoundError:
            raise NotFound(f"{key!r} not found in {self.root}") from None
        except OSError as exc:
            raise StorageError(f"cannot read {key!r}: {exc}") from exc

    def write_bytes(self, key: str, *, data: bytes) -> None:
        """Write ``data`` to ``key`` (temp name, fsync, rename, fsync of the folder)."""
        try:
            atomic_write_bytes(self._path(key), data)
        except OSError as exc:
            raise StorageError(f"cannot write {key!r} in {self.root}: {exc}") from exc
