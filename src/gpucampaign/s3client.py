"""boto3 plumbing of the S3 store: the client from the standard AWS variables, the hashes
an upload is verified with, and a download target that hashes while the parts arrive."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def s3_client(
    env: Mapping[str, str] | None = None, *, max_attempts: int = 5, timeout_s: float = 60.0
) -> Any:
    """A boto3 S3 client from the standard AWS variables of ``env`` (default: the environment).

    ``AWS_ENDPOINT_URL`` (or ``AWS_ENDPOINT_URL_S3``), ``AWS_ACCESS_KEY_ID``,
    ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_DEFAULT_REGION`` and
    ``AWS_PROFILE`` are read; without keys boto3's own chain (profile, instance role) applies.
    Transient errors are retried with exponential backoff (``max_attempts`` in all).

    Raises:
        ValueError: The variables name no usable configuration (a missing profile, say).
    """
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError

    env = os.environ if env is None else env
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None
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
                retries={"mode": "standard", "max_attempts": max_attempts},
                s3={"addressing_style": "path"} if endpoint else {},
                # Whole-file hashes are checked after each transfer; per-request CRCs only slow it.
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
                connect_timeout=min(timeout_s, 10.0),
                read_timeout=timeout_s,
                max_pool_connections=16,
            ),
        )
    except (BotoCoreError, ValueError) as exc:
        raise ValueError(f"cannot configure the S3 client: {type(exc).__name__}: {exc}") from None


def expected_etag(part_md5s: list[bytes]) -> str:
    if len(part_md5s) == 1:
        return part_md5s[0].hex()
    return f"{hashlib.md5(b''.join(part_md5s), usedforsecurity=False).hexdigest()}-{len(part_md5s)}"


def file_digests(path: Path, *, part_size: int | None) -> tuple[str, int, str]:
    """sha256, size and the ETag S3 computes for ``path`` uploaded in parts of ``part_size``
    (``None``: one PUT), in one read of the file; the two hashes run on two cores."""
    from concurrent.futures import ThreadPoolExecutor

    sha, md5s, size = hashlib.sha256(), [], 0
    block = part_size or 8 * 1024 * 1024
    part = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f, ThreadPoolExecutor(max_workers=1) as pool:
        while data := f.read(block):
            job = pool.submit(sha.update, data)  # hashlib releases the GIL on large buffers
            part.update(data)
            size += len(data)
            if part_size:
                md5s.append(part.digest())
                part = hashlib.md5(usedforsecurity=False)
            job.result()
    if not part_size or not md5s:
        md5s = [part.digest()]
    return sha.hexdigest(), size, expected_etag(md5s)


class HashingSink:
    """A write-only, non-seekable target: the transfer manager then writes the parts in order,
    so the sha256 is computed while the next parts are still downloading."""

    def __init__(self, target: Any = None) -> None:
        self.sha = hashlib.sha256()
        self.size = 0
        self.target = target
        self.chunks: list[bytes] = []

    def seekable(self) -> bool:
        return False

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        if self.target is None:
            self.chunks.append(bytes(data))
        else:
            self.target.write(data)
        return len(data)
