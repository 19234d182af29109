"""boto3 plumbing of the S3 store: the client from the standard AWS variables, the hashes
an upload is verified with, and a download target that hashes while the parts arrive."""

from __future__ import annotations

import base64
import hashlib
import mmap
import os
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpucampaign.core.text import redact_secrets

_BLOCK = 8 * 1024 * 1024


#: The variables the S3 store reads (``campaign schema``, ``infra/compose.yaml`` name them).
S3_VARIABLES: tuple[str, ...] = (
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_DEFAULT_REGION",
    "AWS_PROFILE",
    "GPUCAMPAIGN_S3_CONNECT_TIMEOUT_S",
    "GPUCAMPAIGN_S3_READ_TIMEOUT_S",
)
CONNECT_TIMEOUT_S = 5.0  # a server that does not answer the connection
READ_TIMEOUT_S = 25.0  # a server that took the connection and stopped answering (frozen)


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 3600:  # also refuses nan and inf
        raise ValueError(f"{name}={raw!r}: give seconds, more than 0 and at most 3600")
    return value


def timeouts(env: Mapping[str, str] | None = None) -> tuple[float, float]:
    """``(connect, read)`` timeouts in seconds of the S3 client: 5 s and 25 s, or
    ``GPUCAMPAIGN_S3_CONNECT_TIMEOUT_S`` / ``GPUCAMPAIGN_S3_READ_TIMEOUT_S`` of ``env``.

    Raises:
        ValueError: A variable is not a number of seconds in (0, 3600].
    """
    env = os.environ if env is None else env
    return (
        _seconds(env, "GPUCAMPAIGN_S3_CONNECT_TIMEOUT_S", CONNECT_TIMEOUT_S),
        _seconds(env, "GPUCAMPAIGN_S3_READ_TIMEOUT_S", READ_TIMEOUT_S),
    )


def s3_client(env: Mapping[str, str] | None = None, *, max_attempts: int = 5) -> Any:
    """A boto3 S3 client from the standard AWS variables of ``env`` (default: the environment).

    ``AWS_ENDPOINT_URL`` (or ``AWS_ENDPOINT_URL_S3``), ``AWS_ACCESS_KEY_ID``,
    ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_DEFAULT_REGION`` and
    ``AWS_PROFILE`` are read; without keys boto3's own chain (profile, instance role) applies.
    Transient errors are retried with exponential backoff (``max_attempts`` in all). Requests
    time out (``timeouts``: 5 s to connect, 25 s without an answer), so a frozen server fails
    a request as a refused one does, and the spool takes the checkpoint.

    Raises:
        ValueError: The variables name no usable configuration (a missing profile, say).
    """
    # boto3/botocore only for an s3:// store: slow to import
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError

    env = os.environ if env is None else env
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None
    connect_s, read_s = timeouts(env)
    try:
        session = boto3.session.Session(
            aws_access_key_id=env.get("AWS_ACCESS_KEY_ID") or None,
            aws_secret_access_key=env.get("AWS_SECRET_ACCESS_KEY") or None,
            aws_session_token=env.get("AWS_SESSION_TOKEN") or None,
            region_name=env.get("AWS_DEFAULT_REGION") or env.get("AWS_REGION") or "us-east-1",
            profile_name=env.get("AWS_PROFILE") or None,
        )
        return session.client(
            "s3",
            endpoint_url=endpoint,
            config=Config(
                retries={"mode": "standard", "total_max_attempts": max_attempts},
                s3={"addressing_style": "path"} if endpoint else {},
                # Whole-file hashes are checked after each transfer; per-request CRCs only slow it.
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
                connect_timeout=connect_s,
                read_timeout=read_s,
                max_pool_connections=16,
            ),
        )
    except (BotoCoreError, ValueError) as exc:
        message = f"cannot configure the S3 client: {type(exc).__name__}: {exc}"
        raise ValueError(redact_secrets(message)) from None


def expected_etag(part_md5s: list[bytes]) -> str:
    if len(part_md5s) == 1:
        return part_md5s[0].hex()
    return f"{hashlib.md5(b''.join(part_md5s), usedforsecurity=False).hexdigest()}-{len(part_md5s)}"


def _each_part(path: Path, *, part_size: int | None, fn: Callable[[memoryview], None]) -> None:
    """Call ``fn`` on the file's bytes in the parts it goes up in (``None``: one PUT, in
    blocks), as views of a mapping of the file: hashing them copies nothing. A view is valid
    only during its call."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            fn(memoryview(b""))
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            step = part_size or _BLOCK
            for start in range(0, size, step):
                with memoryview(mapped)[start : start + step] as part:
                    fn(part)


def file_etag(path: Path, *, part_size: int | None) -> str:
    """The ETag S3 computes (an MD5, or an MD5 of part MD5s) for ``path`` uploaded in parts of
    ``part_size`` (``None``: one PUT)."""
    md5s: list[bytes] = []
    whole = hashlib.md5(usedforsecurity=False)

    def add(data: memoryview) -> None:
        if part_size:
            md5s.append(hashlib.md5(data, usedforsecurity=False).digest())
        else:
            whole.update(data)

    _each_part(path, part_size=part_size, fn=add)
    return expected_etag(md5s or [whole.digest()])


def _b64_crc(crc: int) -> str:
    return base64.b64encode(crc.to_bytes(4, "big")).decode()


@dataclass(frozen=True)
class FileDigests:
    """What an upload of one file is verified with."""

    sha256: str | None  # None when the caller already knew it
    size: int
    crc32c: str  # as S3 reports ``ChecksumCRC32C``: of the bytes, or of the part CRCs + "-N"


def file_digests(path: Path, *, part_size: int | None, sha256: bool = True) -> FileDigests:
    """The CRC32C checksum S3 reports for ``path`` uploaded in parts of ``part_size``
    (``None``: one PUT), its size and (with ``sha256``) its sha256, in one read of the file;
    the sha256 runs on a second core, the CRC32C in hardware (awscrt, as botocore uses)."""
    from awscrt.checksums import crc32c

    sha = hashlib.sha256() if sha256 else None
    crcs: list[int] = []
    crc, size = 0, 0

    def add(data: memoryview) -> None:
        nonlocal crc, size
        job = pool.submit(sha.update, data) if sha else None  # hashlib releases the GIL
        if part_size:
            crcs.append(crc32c(data))
        else:
            crc = crc32c(data, crc)
        size += len(data)
        if job:
            job.result()

    with ThreadPoolExecutor(max_workers=1) as pool:
        _each_part(path, part_size=part_size, fn=add)
    if part_size and crcs:
        whole = crc32c(b"".join(c.to_bytes(4, "big") for c in crcs))
        checksum = f"{_b64_crc(whole)}-{len(crcs)}"
    else:
        checksum = _b64_crc(crc)
    return FileDigests(sha256=sha.hexdigest() if sha else None, size=size, crc32c=checksum)


def _length(piece: int | bytes) -> int:
    return piece if isinstance(piece, int) else len(piece)


class HashingSink:
    """A download target that hashes what it is given, in order, on a thread of its own.

    It is seekable, so the transfer manager writes each range where it belongs as soon as it
    arrives (as ``download_file`` does); the hash follows the part written without a gap.
    All writes come from the transfer manager's one I/O thread. With a ``target`` file, ranges
    that arrive ahead of the hash wait in memory for it; with none, the bytes go into one
    buffer of ``size`` bytes (``data()``) and are hashed from it, copied once. Use it as a
    context manager.
    """

    _BATCH = 8 * 1024 * 1024

    def __init__(self, target: Any = None, *, size: int = 0) -> None:
        self._sha = hashlib.sha256()
        self._hasher = ThreadPoolExecutor(max_workers=1)  # one worker: updates stay in order
        self._buffer = bytearray(size) if target is None else None
        self._view = memoryview(self._buffer) if self._buffer is not None else None
        self._early: dict[int, Any] = {}  # offset -> what arrived ahead of the hash
        self._hashed_to = 0  # written without a gap up to here
        self._queued_to = 0  # handed to the hashing thread up to here
        self._batch: list[Any] = []
        self._offset = 0
        self._digest: str | None = None
        self._closed = False
        self.size = 0
        self.target = target

    def __enter__(self) -> HashingSink:
        return self

    def __exit__(self, *exc: object) -> None:
        # The digest is taken before the hashing thread stops: ``hexdigest`` stays valid after
        # the block (a caller that never asked inside it got a shut-down pool before).
        try:
            if exc[0] is None:
                self.hexdigest()
        finally:
            self._closed = True
            self._hasher.shutdown(wait=True)

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        if whence != 0:
            raise OSError("a HashingSink seeks to absolute offsets only")
        self._offset = offset
        return offset

    def tell(self) -> int:
        return self._offset

    def _hash(self, batch: list[Any]) -> None:
        # One large update when the pieces are separate: the GIL is dropped once per batch,
        # not retaken per 256 KiB chunk while the download threads hold it.
        self._sha.update(batch[0] if len(batch) == 1 else b"".join(batch))

    def write(self, data: bytes | memoryview) -> int:
        start, n = self._offset, len(data)
        given = n
        self._offset = start + n
        # A retried range is written again from its start: keep what is here, take only the
        # bytes beyond the hashed part (a hashed byte is never replaced).
        have = self._early.get(start)
        if start + n <= self._hashed_to or (have is not None and _length(have) >= n):
            return given
        if start < self._hashed_to:
            data, start = memoryview(data)[self._hashed_to - start :], self._hashed_to
            n = len(data)
        if have is not None:  # a longer piece replaces a shorter one not hashed yet
            self.size -= _length(have)
        if self._view is not None:
            if start + n > len(self._view):
                raise OSError(f"more bytes arrived than the {len(self._view)} listed")
            self._view[start : start + n] = data
            self._early[start] = n
        else:
            self.target.seek(start)
            self.target.write(data)
            self._early[start] = bytes(data)
        self.size += n
        self._advance()
        return given

    def _advance(self) -> None:
        """Queue for the hash what now follows the hashed part without a gap."""
        while self._hashed_to in self._early:
            piece = self._early.pop(self._hashed_to)
            if self._view is None:
                self._batch.append(piece)
            self._hashed_to += _length(piece)
        if self._hashed_to - self._queued_to >= self._BATCH:
            self._queue()

    def _queue(self) -> None:
        if self._view is not None:
            self._batch = [self._view[self._queued_to : self._hashed_to]]
        if self._batch:
            self._hasher.submit(self._hash, self._batch)
        self._batch, self._queued_to = [], self._hashed_to

    def hexdigest(self) -> str:
        """The sha256 of everything written, once the writing is over (waits for the hashing
        thread); a gap in what was written hashes as a mismatch."""
        if self._digest is None:
            if self._closed:  # left the block on an error: hash what is left, here
                if self._view is not None:
                    self._batch = [self._view[self._queued_to : self._hashed_to]]
                if self._batch:
                    self._hash(self._batch)
                self._batch, self._queued_to = [], self._hashed_to
            else:
                self._queue()
                self._hasher.submit(lambda: None).result()
            gap = "incomplete:" if self._early else ""  # bytes after a gap: not in order
            self._digest = gap + self._sha.hexdigest()
        return self._digest

    def data(self) -> bytearray:
        """The bytes kept in memory (no ``target``)."""
        assert self._buffer is not None
        return self._buffer if self.size == len(self._buffer) else self._buffer[: self.size]
