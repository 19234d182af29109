"""Where checkpoints live: a small ``Store`` interface and its local implementation.

Keys are relative POSIX paths (``<run_id>/step-000000020/model.safetensors``); a key that is
absolute, empty, or climbs with ``..`` is refused before any file is touched. Vendor and OS
errors are turned into our own types (``StorageError``, ``NotFound``) so callers never
depend on a backend's exceptions.

Backends: ``LocalStore`` (a folder, atomic writes with fsync). An S3 backend plugs in by
implementing the same protocol (``local_path`` returns ``None`` there, which makes the
checkpoint code stage files locally and upload them with ``put_file``); ``open_store`` is
the one place that maps a spec's ``storage.url`` to a backend.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Protocol, runtime_checkable

from gpucampaign.files import TMP_PREFIX, atomic_write_bytes, fsync_dir
from gpucampaign.spec import SpecError

_CHUNK = 8 * 1024 * 1024


class StorageError(OSError):
    """A store operation failed (I/O error, refused key, backend error)."""


class NotFound(StorageError):
    """The key does not exist in the store."""


def check_key(key: str) -> str:
    """Return ``key`` when it is a safe relative POSIX path, else raise ``StorageError``."""
    if not isinstance(key, str) or not key or "\\" in key or "\x00" in key:
        raise StorageError(f"invalid store key {key!r}: use a non-empty relative POSIX path")
    p = PurePosixPath(key)
    if p.is_absolute() or any(part in ("..", ".", "") for part in key.split("/")):
        raise StorageError(f"store key {key!r} must be relative and must not contain '.', '..' or '//'")
    return key


@runtime_checkable
class Store(Protocol):
    """A flat key -> bytes store. Writes are atomic: a reader sees the old or the new object."""

    url: str

    def put_file(self, key: str, *, src: Path) -> None:
        """Upload the local file ``src`` to ``key``."""
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
            raise StorageError(f"store key {key!r} resolves outside the store root (through a link?)")
        return target

    def local_path(self, key: str) -> Path | None:
        """Filesystem path of ``key`` (it may not exist yet)."""
        return self._path(key)

    def put_file(self, key: str, *, src: Path) -> None:
        """Copy ``src`` to ``key`` (temp name, fsync, rename)."""
        dst = self._path(key)
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(f"{TMP_PREFIX}{dst.name}.{uuid.uuid4().hex[:8]}")
        try:
            with open(src, "rb") as fin, open(tmp, "wb") as fout:
                shutil.copyfileobj(fin, fout, _CHUNK)
                fout.flush()
                os.fsync(fout.fileno())
            os.replace(tmp, dst)
        except FileNotFoundError as exc:
            raise NotFound(f"local file {src} does not exist") from exc
        except OSError as exc:
            raise StorageError(f"cannot write {key!r} in {self.root}: {exc}") from exc
        finally:
            tmp.unlink(missing_ok=True)
        fsync_dir(dst.parent)

    def get_file(self, key: str, *, dst: Path) -> None:
        """Copy ``key`` to the local file ``dst`` atomically."""
        src = self._path(key)
        if not src.is_file():
            raise NotFound(f"{key!r} not found in {self.root}")
        dst = Path(dst)
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(f"{TMP_PREFIX}{dst.name}.{uuid.uuid4().hex[:8]}")
        try:
            with open(src, "rb") as fin, open(tmp, "wb") as fout:
                shutil.copyfileobj(fin, fout, _CHUNK)
                fout.flush()
                os.fsync(fout.fileno())
            os.replace(tmp, dst)
        except OSError as exc:
            raise StorageError(f"cannot copy {key!r} to {dst}: {exc}") from exc
        finally:
            tmp.unlink(missing_ok=True)

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


def open_store(url: str, *, out_dir: str | Path, env: Mapping[str, str] | None = None) -> Store:
    """The store named by a spec's ``storage.url``.

    Args:
        url: ``'local'`` (checkpoints in ``out_dir/checkpoints``) or ``'s3://bucket/prefix'``.
        out_dir: The campaign's output folder.
        env: Environment with the S3 endpoint and keys (read by an S3 backend only).

    Raises:
        SpecError: For ``s3://`` URLs: this build has no S3 backend yet.
    """
    del env  # only an S3 backend reads it
    if url == "local":
        return LocalStore(Path(out_dir) / "checkpoints")
    if url.startswith("s3://"):
        raise SpecError(
            f"field 'storage.url': '{url}' needs the S3 backend, which this build does not have yet "
            "(it comes with the services issue); use storage.url: local for now.",
            field="storage.url",
        )
    raise SpecError(f"field 'storage.url': unknown storage '{url}'; use 'local'.", field="storage.url")
