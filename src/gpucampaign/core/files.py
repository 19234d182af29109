"""One helper of each kind for files: hashing, atomic writes, JSON and JSONL, UTC time, the
checkout's commit and the median. Every module uses these instead of its own copy."""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import mmap
import os
import shutil
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, BinaryIO

_BLOCK = 8 * 1024 * 1024
_READ_CHUNK = 16 * 1024 * 1024  # read_hashed: one chunk read while the one before is hashed
# Temporary names start with this; listings and stores skip them.
TMP_PREFIX = ".tmp-"


# (device, inode, size, mtime_ns, ctime_ns) -> sha256: a file is hashed once per process.
_HASHED: dict[tuple[int, int, int, int, int], str] = {}
# A file changed less than this before its hash started may change again within the
# filesystem's timestamp granularity without its key changing: its hash is not cached.
_RACY_NS = 2_000_000_000


def _stat_key(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def sha256_file(path: str | Path) -> str:
    """sha256 (hex) of a file's bytes, read in 8 MiB blocks; cached per process.

    The cache is keyed by device, inode, size, mtime and ctime, so any write or replacement
    of the file misses it; a file modified in the last two seconds is hashed every time.
    """
    started = time.time_ns()
    with open(path, "rb") as f:
        key = _stat_key(os.fstat(f.fileno()))
        if key in _HASHED:
            return _HASHED[key]
        h = hashlib.sha256()
        while block := f.read(_BLOCK):
            h.update(block)
        after = _stat_key(os.fstat(f.fileno()))
    digest = h.hexdigest()
    if after == key and key[3] < started - _RACY_NS and key[4] < started - _RACY_NS:
        _HASHED[key] = digest
    return digest


#: The checksum of checkpoint files: CRC32C (in hardware through ``awscrt``, ~20 GB/s on one
#: core, against ~1.7 GB/s for sha256). It catches accidental corruption (a flipped bit, a
#: torn or truncated write, a wrong block); it is no seal against someone altering a file on
#: purpose. Pins and seals (the corpus, the manifest, the meta pinned by ``LATEST``) use sha256.
FAST_CHECKSUM = "crc32c"
CHECKSUMS = ("crc32c", "sha256")


class _Crc32c:
    """CRC32C with the ``update``/``hexdigest`` interface of a hashlib object."""

    def __init__(self) -> None:
        # awscrt (boto3's [crt] extra) only when a CRC32C is asked for
        from awscrt.checksums import crc32c

        self._crc32c = crc32c
        self.value = 0

    def update(self, data: Any) -> None:
        self.value = self._crc32c(data, self.value)

    def hexdigest(self) -> str:
        return f"{self.value:08x}"


def new_checksum(kind: str) -> Any:
    """A running checksum of ``kind`` (one of ``CHECKSUMS``): ``update(bytes)``, ``hexdigest()``."""
    if kind == "sha256":
        return hashlib.sha256()
    if kind == "crc32c":
        return _Crc32c()
    raise ValueError(f"unknown checksum {kind!r}: use one of {CHECKSUMS}")


def checksum_bytes(data: Any, *, kind: str) -> str:
    """The ``kind`` checksum (hex) of bytes in memory."""
    h = new_checksum(kind)
    mv = memoryview(data).cast("B")
    for off in range(0, len(mv), _READ_CHUNK):
        h.update(mv[off : off + _READ_CHUNK])
    return str(h.hexdigest())


def map_checked(path: Path, *, kind: str) -> tuple[mmap.mmap, str, os.stat_result]:
    """A private, writable mapping of ``path``, its ``kind`` checksum and the file's stat.

    The checksum is what reads the file: it runs over the mapping, so every page comes from
    the disk once, straight into the page cache, with no copy into a buffer (a read into a
    fresh buffer costs a copy and a page fault per page on top). Tensors can be views of the
    mapping; writes to it stay private to this process (copy on write).
    """
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        if st.st_size == 0:
            raise ValueError(f"{path} is empty")
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    if hasattr(mapped, "madvise"):
        mapped.madvise(mmap.MADV_SEQUENTIAL)
    h = new_checksum(kind)
    with memoryview(mapped) as mv:
        for off in range(0, len(mv), _READ_CHUNK):
            h.update(mv[off : off + _READ_CHUNK])
    return mapped, str(h.hexdigest()), st


def read_hashed(path: Path) -> tuple[bytearray, str]:
    """The content of ``path`` and its sha256, hashed while it is read.

    The file is read in chunks into one buffer; each chunk is hashed in a second thread while
    the next one is read (hashlib releases the GIL), so a restore costs about the slower of
    the read and the hash instead of their sum.
    """
    size = os.path.getsize(path)
    buf = bytearray(size)
    mv = memoryview(buf)
    h = hashlib.sha256()
    off = 0
    with ThreadPoolExecutor(max_workers=1) as pool, open(path, "rb", buffering=0) as f:
        pending = None
        while off < size:
            n = f.readinto(mv[off : off + _READ_CHUNK])
            if not n:
                break
            if pending is not None:
                pending.result()
            pending = pool.submit(h.update, mv[off : off + n])
            off += n
        extra = f.read(1)  # the file grew since its size was taken
        if pending is not None:
            pending.result()
    if extra or off < size:
        data = bytearray(path.read_bytes())
        return data, hashlib.sha256(data).hexdigest()
    return buf, h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    """sha256 (hex) of bytes in memory."""
    return hashlib.sha256(data).hexdigest()


def fsync_dir(path: Path) -> None:
    """fsync a directory so a rename inside it survives a crash (no-op where unsupported)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


@contextlib.contextmanager
def _replacing(path: Path, *, sync: bool = True) -> Iterator[BinaryIO]:
    """A file opened under a temp name beside ``path``; on success fsynced and renamed over
    ``path`` (and the folder fsynced), on failure removed, leaving ``path`` as it was.
    ``sync=False``: renamed without either fsync (``sync_files`` later)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{path.name}.", dir=path.parent)
    try:
        # mkstemp creates 0600; output files are meant to be copied off and shared.
        os.fchmod(fd, 0o666 & ~_UMASK)
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            if sync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if sync:
        fsync_dir(path.parent)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write through a temp name, fsync, rename, fsync the folder: a reader never sees half a
    file, and a crash leaves the old file or the new one."""
    with _replacing(Path(path)) as f:
        f.write(data)


def replace_dir(dst: Path, new: Path) -> None:
    """Put the complete folder ``new`` (written beside ``dst``) at ``dst``, the way
    :func:`atomic_write_bytes` puts a file: ``new`` fsynced, an old ``dst`` moved aside and
    then removed, the parent fsynced. A reader sees the old folder or the new one."""
    fsync_dir(new)
    if dst.exists():
        old = dst.with_name(f"{TMP_PREFIX}old-{dst.name}-{uuid.uuid4().hex[:8]}")
        dst.rename(old)
        new.rename(dst)
        shutil.rmtree(old, ignore_errors=True)
    else:
        new.rename(dst)
    fsync_dir(dst.parent)


def replace_bytes(path: str | Path, data: bytes) -> Path:
    """Write through a temp name and rename, without fsync: a reader never sees half a file;
    ``sync_files`` makes it durable later (the training loop: at its next checkpoint)."""
    with _replacing(Path(path), sync=False) as f:
        f.write(data)
    return Path(path)


def sync_files(paths: list[Path]) -> None:
    """fsync each file and its folder (once each), then empty ``paths``; a file gone since is
    skipped."""
    for folder in dict.fromkeys(p.parent for p in paths):
        for p in (q for q in paths if q.parent == folder):
            try:
                fd = os.open(p, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(folder)
    paths.clear()


def atomic_copy(src: str | Path, dst: str | Path) -> Path:
    """Copy a file the same way as :func:`atomic_write_bytes` writes one.

    Raises:
        FileNotFoundError: ``src`` does not exist (``dst`` is untouched).
        OSError: the copy failed; no temp file is left and ``dst`` is untouched.
    """
    dst = Path(dst)
    with open(src, "rb") as fin, _replacing(dst) as fout:
        shutil.copyfileobj(fin, fout, _BLOCK)
    return dst


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, Path):
        return obj.as_posix()
    if isinstance(obj, datetime):
        return obj.isoformat()
    if isinstance(obj, Decimal):
        return float(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def json_bytes(obj: Any, *, sort_keys: bool = True) -> bytes:
    """Indented, key-sorted JSON with a final newline (pydantic models, numpy, paths allowed);
    ``sort_keys=False`` keeps the mappings' own order (a report rendered from it reads the same
    rows in the same order)."""
    text = json.dumps(obj, indent=2, sort_keys=sort_keys, ensure_ascii=False, default=_json_default)
    return (text + "\n").encode()


# What json.dumps(sort_keys=True, ensure_ascii=False, default=...) builds at every call, built
# once: the training loop writes a line per step.
_LINE = json.JSONEncoder(sort_keys=True, ensure_ascii=False, default=_json_default)


def jsonl_line(record: Mapping[str, Any]) -> str:
    """One JSONL line (floats written exactly, so a read gives back the same numbers)."""
    return _LINE.encode(record) + "\n"


def _c_line_encoder() -> Any:
    """The C encoder ``_LINE.encode`` builds at every call (``JSONEncoder.iterencode``), built
    once with the same settings, so the lines are the same bytes; None where the json module
    has no C speedups. Without the circular-reference check: a row is flat, built here."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return None
    return make(
        None, _json_default, json.encoder.encode_basestring, None, ": ", ", ", True, False, True
    )


_C_LINE = _c_line_encoder()


def jsonl_lines(records: Iterable[Mapping[str, Any]]) -> str:
    """``jsonl_line`` of each record, joined: the metrics' rows, a batch at a time, with the
    C encoder built once (a training step writes a row: the encoder's setup was a third of
    its cost)."""
    encode = _C_LINE
    if encode is None:
        return "".join([_LINE.encode(r) + "\n" for r in records])
    lines = ["".join(encode(r, 0)) for r in records]
    return "\n".join(lines) + "\n" if lines else ""


def append_jsonl(path: str | Path, record: Mapping[str, Any]) -> None:
    """Append one record and fsync: an append-only log survives a crash up to its last line."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(jsonl_line(record))
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """All records of a JSONL file (empty when absent). A torn last line, left by a process
    killed mid-write, is skipped; a torn line anywhere else is an error."""
    p = Path(path)
    if not p.is_file():
        return []
    lines = [line for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
    rows: list[dict[str, Any]] = []
    for i, line in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break
            raise
    return rows


def write_jsonl(path: str | Path, records: Iterable[Mapping[str, Any]]) -> None:
    """Replace a JSONL file atomically with ``records``."""
    atomic_write_bytes(path, "".join(jsonl_line(r) for r in records).encode())


def utc_now(*, timespec: str = "milliseconds") -> str:
    """Current time, ISO 8601 UTC."""
    return datetime.now(UTC).isoformat(timespec=timespec)


def parse_time(text: str) -> datetime:
    """An ISO 8601 time as written by :func:`utc_now` (naive times are taken as UTC)."""
    t = datetime.fromisoformat(text)
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def median(values: Iterable[float]) -> float | None:
    """The median, or None for no values."""
    vals = list(values)
    return statistics.median(vals) if vals else None


def git_commit(cwd: str | Path | None = None, *, tracking: str | Path | None = None) -> str | None:
    """The checkout's commit (with ``-dirty`` when tracked files changed), or None outside git.

    ``tracking``: a file that checkout must track, else None: an installed copy of the library
    in a virtual environment inside the user's own repository is no file of that repository.
    """

    def git(*args: str) -> str:
        out = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=True
        )
        return out.stdout.strip()

    try:
        if tracking is not None:
            git("ls-files", "--error-unmatch", "--", str(tracking))
        head = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("-dirty" if dirty else "") if head else None


def csv_text(rows: Sequence[Mapping[str, Any]], *, columns: Sequence[str] = ()) -> str:
    """CSV text: ``columns``, else the rows' keys in first-seen order; floats written with
    ``repr``, so a read gives back the same floats (the reload check compares them exactly).
    """
    columns = list(columns)
    for r in rows:
        columns += [k for k in r if k not in columns]
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    for r in rows:
        writer.writerow([_cell(r.get(c)) for c in columns])
    return buf.getvalue()


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return repr(v)
    if hasattr(v, "item"):
        return _cell(v.item())
    return str(v)
