"""The S3 backend of ``Store``: boto3 with its client and hashing helpers in ``s3client``.

Its ``local_path`` returns ``None``, which makes the checkpoint code stage files locally and
upload them with ``put_file``.
"""

from __future__ import annotations

import base64
import hashlib
import os
import tempfile
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gpucampaign.config import SpecError
from gpucampaign.core.files import TMP_PREFIX, sha256_bytes
from gpucampaign.core.storageurl import S3_SCHEME, is_s3, split_s3
from gpucampaign.core.text import redact_secrets
from gpucampaign.storage.base import ContentMismatch, NoAnswer, NotFound, StorageError, check_key
from gpucampaign.storage.readwait import ReadWait
from gpucampaign.storage.s3client import HashingSink, file_digests, file_etag, s3_client

_MIB = 1024 * 1024
_PROBE_PREFIX = ".gpucampaign-probe-"
#: The S3 client's operations on one object, and what their failure is said to be.
_OBJECT_OPS = {
    "head_object": "cannot read",
    "download_fileobj": "cannot download",
    "put_object": "cannot write",
    "delete_object": "cannot delete",
}
#: What a server says while it restarts or sheds load: a read waits it out (``ReadWait``).
_TRANSIENT_CODES = {"InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout"}


def is_transient(error: StorageError) -> bool:
    """True when ``error`` says the store did not answer (not: refused, missing, altered)."""
    return isinstance(error, NoAnswer)


def parse_s3_url(url: str) -> tuple[str, str]:
    """``('bucket', 'prefix')`` of ``s3://bucket/prefix`` (the prefix without slashes around it).

    Raises:
        SpecError: The URL is not ``s3://bucket[/prefix]`` or its prefix is not a safe key.
    """
    bucket, prefix = split_s3(url)
    prefix = prefix.strip("/")
    if not is_s3(url) or not bucket:
        raise SpecError(
            f"'{url}' is not an S3 URL: use {S3_SCHEME}bucket/prefix.", field="storage.url"
        )
    if prefix:
        try:
            check_key(prefix)
        except StorageError:
            raise SpecError(
                f"'{url}': the prefix must be a relative path without '.', '..' or '//'.",
                field="storage.url",
            ) from None
    return bucket, prefix


class S3Store:
    """A store in an S3 bucket under a prefix (``s3://bucket/prefix``).

    Every object carries its sha256 and size in its metadata. ``put_file`` and
    ``write_bytes`` return only once the bucket holds the object with the right size and the
    checksum the server computed from the bytes it received matches the local bytes (the
    CRC32C of ``put_file``'s parts, the ETag of ``write_bytes``' one PUT); reads check size and
    sha256 against the metadata, hashing while the ranges arrive. Large files go up and down
    in parallel parts through boto3's transfer manager.

    Args:
        url: ``s3://bucket/prefix``.
        env: The AWS variables (default: the environment); see ``s3_client``.
        client: A ready boto3 client instead (``env`` is then ignored).
        multipart_threshold: Files from this size go up in parts.
        part_size: Size of each part.
        max_concurrency: Parts transferred at once.
        max_attempts: Attempts per request (botocore's retries with backoff on transient
            errors).
        read_wait_s: How long a read (``read_bytes``, ``read_hashed``, ``get_file``,
            ``exists``, ``size``, ``list``) waits, retrying with backoff, for a store that
            does not answer (``readwait.ReadWait``); 0: it fails at once. Writes never wait.
    """

    def __init__(
        self,
        url: str,
        *,
        env: Mapping[str, str] | None = None,
        client: Any = None,
        multipart_threshold: int = 64 * _MIB,
        part_size: int = 16 * _MIB,
        max_concurrency: int = 8,
        max_attempts: int = 5,
        read_wait_s: float = 0.0,
    ) -> None:
        # boto3/botocore only once an s3:// store is opened: slow to import
        from boto3.s3.transfer import TransferConfig

        self.bucket, self.prefix = parse_s3_url(url)
        self.url = f"{S3_SCHEME}{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")
        try:
            self._client = client or s3_client(env, max_attempts=max_attempts)
        except ValueError as exc:
            raise StorageError(str(exc)) from None
        self.endpoint = redact_secrets(str(self._client.meta.endpoint_url))  # said, not used
        self._transfer = TransferConfig(
            multipart_threshold=multipart_threshold,
            multipart_chunksize=part_size,
            max_concurrency=max_concurrency,
            num_download_attempts=max_attempts,
        )
        self._reads = ReadWait(self.url, bound_s=read_wait_s, transient=is_transient)

    def __repr__(self) -> str:
        return f"S3Store({self.url!r}, endpoint={self.endpoint!r})"

    def __reduce__(self) -> Any:  # a pickled client would carry the keys: refuse it
        raise TypeError("an S3Store is not picklable: open it where it is used (open_store)")

    def _obj(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _error(self, exc: Exception, *, what: str, key: str | None = None) -> StorageError:
        """Our error for a botocore/boto3 exception; never the keys, only the URL and endpoint."""
        from boto3.exceptions import Boto3Error
        from botocore.exceptions import (
            ClientError,
            EndpointConnectionError,
            HTTPClientError,
            NoCredentialsError,
        )
        from botocore.exceptions import ConnectionError as BotoConnectionError

        # The transfer manager wraps the client's error (S3UploadFailedError, RetriesExceeded).
        while isinstance(exc, Boto3Error):
            inner = getattr(exc, "last_exception", None) or exc.__cause__ or exc.__context__
            if not isinstance(inner, Exception):
                break
            exc = inner
        where = f"{self.url}/{key}" if key else self.url
        if isinstance(exc, ClientError):
            err = exc.response.get("Error", {})
            code = str(err.get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("NoSuchKey", "404", "NotFound") and key is not None:
                return NotFound(f"{where} not found")
            if code in ("NoSuchBucket",) or (code in ("404", "NotFound") and key is None):
                return StorageError(
                    f"{what} {where}: bucket '{self.bucket}' does not exist at {self.endpoint}"
                )
            if (
                code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403")
                or status == 403
            ):
                return StorageError(
                    f"{what} {where}: access denied by {self.endpoint} ({code}); check "
                    "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or AWS_PROFILE and the bucket's "
                    "policy"
                )
            message = str(err.get("Message", ""))[:200]
            busy = code in _TRANSIENT_CODES or (isinstance(status, int) and status >= 500)
            return (NoAnswer if busy else StorageError)(
                f"{what} {where}: S3 error {code or status}: {message}"
            )
        if isinstance(exc, NoCredentialsError):
            return StorageError(
                f"{what} {where}: no S3 credentials: set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE"
            )
        if isinstance(exc, EndpointConnectionError):
            return NoAnswer(f"{what} {where}: cannot reach the S3 endpoint {self.endpoint}")
        # Timed out, or the connection dropped: a frozen or restarting server.
        lost = isinstance(exc, BotoConnectionError | HTTPClientError)
        return (NoAnswer if lost else StorageError)(f"{what} {where}: {type(exc).__name__}: {exc}")

    def _call(self, what: str, key: str | None, fn: Any, /, **kwargs: Any) -> Any:
        from boto3.exceptions import Boto3Error
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn(**kwargs)
        except (ClientError, BotoCoreError, Boto3Error) as exc:
            raise self._error(exc, what=what, key=key) from None

    def _on_object(self, op: str, key: str, /, **kwargs: Any) -> Any:
        """``_call`` of the client operation ``op`` (a key of ``_OBJECT_OPS``) on the object of
        ``key``, its bucket and full key filled in."""
        fn = getattr(self._client, op)
        return self._call(
            _OBJECT_OPS[op], key, fn, Bucket=self.bucket, Key=self._obj(key), **kwargs
        )

    def _head(self, key: str) -> dict[str, Any]:
        return self._on_object("head_object", key)

    def _verify(
        self, key: str, *, sha256: str, size: int, crc32c: str | None, etag: Callable[[], str]
    ) -> None:
        """Raise unless the bucket's object has ``size``, ``sha256`` in its metadata, and the
        checksum the server computed from the bytes it received equals ours: its CRC32C when
        it keeps one, else its ETag (an MD5 of the bytes, computed here only then)."""
        head = self._on_object("head_object", key, ChecksumMode="ENABLED")
        meta = head.get("Metadata", {})
        got_crc = head.get("ChecksumCRC32C")
        if crc32c is not None and got_crc:
            sent, got = f"CRC32C {crc32c}", f"CRC32C {got_crc}"
        elif head.get("ServerSideEncryption") == "aws:kms" or head.get("SSECustomerAlgorithm"):
            sent = got = "-"  # with these the ETag is not an MD5 of the bytes: size and hash only
        else:
            sent, got = f"ETag {etag()}", f"ETag {str(head.get('ETag', '')).strip(chr(34))}"
        if head.get("ContentLength") != size or meta.get("sha256") != sha256 or got != sent:
            raise StorageError(
                f"{self.url}/{key}: the bucket does not hold what was uploaded "
                f"({head.get('ContentLength')} bytes, {got}; sent {size} bytes, {sent})"
            )

    def _upload(self, src: Path, key: str, *, extra: dict[str, Any]) -> None:
        """One upload through the transfer manager (parts above the threshold)."""
        from boto3.s3.transfer import S3Transfer

        # boto3-stubs types S3Transfer's config as botocore's Config; boto3 takes a TransferConfig.
        S3Transfer(self._client, self._transfer).upload_file(  # type: ignore[arg-type]
            str(src), self.bucket, self._obj(key), extra_args=extra
        )

    def put_file(self, key: str, *, src: Path, sha256: str | None = None) -> None:
        """Upload ``src`` to ``key`` and verify the bucket holds exactly its bytes.

        Each request carries a CRC32C the server checks (it refuses a part that arrives
        altered); afterwards the object's checksum must equal the one computed here from a
        separate read of the file, so bytes read wrongly for the upload are caught too.
        ``sha256``, when the caller knows it, goes into the metadata without hashing the file
        again; the local checksum is then computed while the upload runs.
        """
        from s3transfer.utils import ChunksizeAdjuster

        src = Path(src)
        if not src.is_file():
            raise NotFound(f"local file {src} does not exist")
        size = src.stat().st_size
        part = None
        if size >= self._transfer.multipart_threshold:
            part = ChunksizeAdjuster().adjust_chunksize(self._transfer.multipart_chunksize, size)
        with ThreadPoolExecutor(max_workers=1) as pool:
            local = pool.submit(file_digests, src, part_size=part, sha256=sha256 is None)
            sha256 = sha256 or str(local.result().sha256)
            extra = {
                "Metadata": {"sha256": sha256, "size": str(size)},
                "ChecksumAlgorithm": "CRC32C",
            }
            self._call("cannot upload to", key, self._upload, src=src, key=key, extra=extra)
            digests = local.result()
        self._verify(
            key,
            sha256=sha256,
            size=digests.size,
            crc32c=digests.crc32c,
            etag=lambda: file_etag(src, part_size=part),
        )

    def _fetch(self, key: str, target: Any = None) -> HashingSink:
        """Download ``key`` in parallel ranges into ``target`` (a file, or memory when None),
        checked against the size and sha256 its metadata records."""
        head = self._head(key)
        with HashingSink(target, size=int(head.get("ContentLength") or 0)) as sink:
            try:
                self._on_object("download_fileobj", key, Fileobj=sink, Config=self._transfer)
            except StorageError:
                raise
            except OSError as exc:  # the object changed under the download
                raise StorageError(f"{self.url}/{key}: {exc}") from None
            self._check_content(key, head, size=sink.size, sha256=sink.hexdigest)
        return sink

    def get_file(self, key: str, *, dst: Path) -> None:
        """Download ``key`` into ``dst`` atomically; a file failing its size or sha256 is not
        kept. Like boto3's ``download_file`` it does not fsync: the bucket keeps the object, and
        a caller that keeps the copy makes it durable (``mirror.retrieve_folder`` does)."""
        dst = Path(dst)
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(f"{TMP_PREFIX}{dst.name}.{uuid.uuid4().hex[:8]}")

        def fetch() -> None:
            with open(tmp, "wb") as f:  # a new try starts from an empty file
                self._fetch(key, f)

        try:
            self._reads.run(f"{self.url}/{key}", fetch)
            os.replace(tmp, dst)
        except OSError as exc:
            if isinstance(exc, StorageError):
                raise
            raise StorageError(f"cannot write {dst} from {self.url}/{key}: {exc}") from exc
        finally:
            tmp.unlink(missing_ok=True)

    def _check_content(self, key: str, head: Mapping[str, Any], *, size: int, sha256: Any) -> None:
        meta = head.get("Metadata") or {}
        want = head.get("ContentLength")
        if want is not None and size != want:
            raise StorageError(f"{self.url}/{key}: got {size} bytes, the bucket lists {want}")
        if "size" in meta and str(size) != meta["size"]:
            raise StorageError(f"{self.url}/{key}: {size} bytes, its metadata says {meta['size']}")
        if "sha256" in meta and (got := sha256()) != meta["sha256"]:
            raise ContentMismatch(
                f"{self.url}/{key}: content fails the sha256 of its metadata (altered): "
                f"sha256 {got}, its metadata says {meta['sha256']}",
                expected=str(meta["sha256"]),
                actual=str(got),
            )

    def exists(self, key: str) -> bool:
        """True when ``key`` exists."""

        def head() -> bool:
            try:
                self._head(key)
            except NotFound:
                return False
            return True

        return self._reads.run(f"{self.url}/{key}", head)

    def size(self, key: str) -> int:
        """Size of ``key`` in bytes."""
        return self._reads.run(f"{self.url}/{key}", lambda: int(self._head(key)["ContentLength"]))

    def _list(self, prefix: str) -> list[str]:
        base = self._obj(prefix) + "/" if prefix else (f"{self.prefix}/" if self.prefix else "")
        keys: list[str] = []
        paginator = self._client.get_paginator("list_objects_v2")
        pages = paginator.paginate(Bucket=self.bucket, Prefix=base)
        for page in self._call("cannot list", prefix or None, lambda: list(pages)):
            keys.extend(
                obj["Key"][len(self.prefix) + 1 if self.prefix else 0 :]
                for obj in page.get("Contents", [])
            )
        return sorted(k for k in keys if not k.startswith(_PROBE_PREFIX))

    def list(self, prefix: str = "") -> list[str]:
        """Sorted keys under the folder-like ``prefix`` ('' for all)."""
        where = f"the listing of {self.url}" + (f"/{prefix}" if prefix else "")
        return self._reads.run(where, lambda: self._list(prefix))

    def delete(self, key: str) -> None:
        """Delete ``key``; a missing key is not an error."""
        self._on_object("delete_object", key)

    def read_bytes(self, key: str) -> bytes:
        """The whole object, checked against its size and sha256."""
        return self._reads.run(f"{self.url}/{key}", lambda: bytes(self._fetch(key).data()))

    def read_hashed(self, key: str) -> tuple[bytes | bytearray, str]:
        """The whole object and the sha256 it was checked with."""
        sink = self._reads.run(f"{self.url}/{key}", lambda: self._fetch(key))
        return sink.data(), sink.hexdigest()

    def write_bytes(self, key: str, *, data: bytes) -> None:
        """Write ``data`` to ``key`` in one PUT (atomic in S3) and verify it."""
        digest = hashlib.md5(data, usedforsecurity=False)
        sha256 = sha256_bytes(data)
        self._on_object(
            "put_object",
            key,
            Body=data,
            ContentMD5=base64.b64encode(digest.digest()).decode(),
            Metadata={"sha256": sha256, "size": str(len(data))},
        )
        self._verify(key, sha256=sha256, size=len(data), crc32c=None, etag=digest.hexdigest)

    def local_path(self, key: str) -> Path | None:
        """Always ``None``: objects are not files here."""
        check_key(key)
        return None

    def check(self) -> None:
        """Reach the endpoint, prove the keys, and write, read and delete a probe object, sent
        as checkpoint files are (``put_file``: a server that refuses its checksum says so
        here, before anything trains).

        Raises:
            StorageError: What failed, with the URL and the endpoint (never the keys).
        """
        self._call("cannot open", None, self._client.head_bucket, Bucket=self.bucket)
        probe = f"{_PROBE_PREFIX}{uuid.uuid4().hex[:12]}"
        payload = uuid.uuid4().bytes
        with tempfile.TemporaryDirectory(prefix="gpucampaign-probe-") as tmp:
            (Path(tmp) / "probe").write_bytes(payload)
            self.put_file(probe, src=Path(tmp) / "probe")
        try:
            if self.read_bytes(probe) != payload:
                raise StorageError(f"{self.url}: a probe object did not read back as written")
        finally:
            self.delete(probe)
