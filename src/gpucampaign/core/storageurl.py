"""The storage URLs a spec's ``storage.url`` may hold: the one place that knows the schemes.

``'local'`` keeps checkpoints inside the output folder; ``'s3://bucket/prefix'`` puts them in
an S3 bucket (endpoint and keys from the environment). The spec validates with ``check_url``,
the storage package opens by ``is_local``/``is_s3``, and every other test of a URL asks here.
"""

from __future__ import annotations

import re

LOCAL = "local"
S3_SCHEME = "s3://"
#: What to write, for messages.
KNOWN = f"'{LOCAL}' or '{S3_SCHEME}bucket/prefix'"
_S3_URL = re.compile(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$")


def is_local(url: str) -> bool:
    """True for ``'local'``: checkpoints inside the output folder."""
    return url == LOCAL


def is_s3(url: str) -> bool:
    """True for an ``s3://`` URL (its bucket and prefix are checked by ``check_url``)."""
    return url.startswith(S3_SCHEME)


def check_url(url: str) -> str:
    """``url`` when it is ``'local'`` or ``s3://bucket[/prefix]`` with a valid bucket name.

    Raises:
        ValueError: Any other URL.
    """
    if not is_local(url) and not _S3_URL.match(url):
        raise ValueError(f"use {KNOWN} (credentials go in the environment)")
    return url


def split_s3(url: str) -> tuple[str, str]:
    """``('bucket', 'prefix/rest')`` of ``s3://bucket/prefix/rest``, unchecked."""
    bucket, _, prefix = url.removeprefix(S3_SCHEME).partition("/")
    return bucket, prefix


def normal_url(url: str) -> str:
    """One spelling per store: ``s3://bucket/prefix`` without the slashes around the prefix
    (``s3://b/p/`` and ``s3://b//p`` are the store ``s3://b/p``, as the store opens them);
    ``'local'`` as it is. What names the store's locks."""
    if not is_s3(url):
        return url
    bucket, prefix = split_s3(url)
    prefix = prefix.strip("/")
    return f"{S3_SCHEME}{bucket}/{prefix}" if prefix else f"{S3_SCHEME}{bucket}"
