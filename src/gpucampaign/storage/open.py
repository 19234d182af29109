"""From a spec's ``storage.url`` to a store: the one place that maps a URL to a backend.

``check_storage`` tries the URL, the credentials and the bucket before anything trains. It
sits above both backends and the spool, which it wraps around an S3 store.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

from gpucampaign.config import CampaignSpec, SpecError
from gpucampaign.config.parts import DEFAULT_READ_WAIT_S
from gpucampaign.core.storageurl import KNOWN, is_local, is_s3
from gpucampaign.folder.layout import CHECKPOINTS_DIR, SPOOL_DIR
from gpucampaign.plan.rental import rental_of
from gpucampaign.storage.base import LocalStore, StorageError, Store, StoreUnreachable
from gpucampaign.storage.readwait import ReadWait
from gpucampaign.storage.s3 import S3Store, is_transient
from gpucampaign.storage.spool import SpoolingStore

SPOOLED_ATTEMPTS = 2  # attempts per request of an S3 store with a spool behind it


def read_wait_s(spec: CampaignSpec, *, now: datetime | None = None) -> float:
    """How long a read of the spec's store waits for it to answer: ``storage.read_wait_s``,
    and never past the rental's end when the lots carry ``starts_at`` (the machine is gone
    then; waiting longer only spends it)."""
    bound = float(spec.storage.read_wait_s)
    rental = rental_of(spec)
    if rental is None:
        return bound
    return max(0.0, min(bound, rental.hours_left(now or datetime.now(UTC)) * 3600.0))


def open_store(
    url: str,
    *,
    out: str | Path,
    env: Mapping[str, str] | None = None,
    spool: bool = True,
    read_wait_s: float = DEFAULT_READ_WAIT_S,
) -> Store:
    """The store named by a spec's ``storage.url``.

    Args:
        url: ``'local'`` (checkpoints in ``out/checkpoints``) or ``'s3://bucket/prefix'``.
        out: The campaign's output folder.
        env: The AWS variables for an S3 store (default: the environment).
        spool: For S3, keep what the server cannot take now in ``out/spool`` and upload it
            in the background (``spool.SpoolingStore``); ``False`` for the bare ``S3Store``.
        read_wait_s: For S3, how long a read waits, retrying with backoff, for a server that
            does not answer (``read_wait_s(spec)`` for a campaign's store; 0: not at all).

    Raises:
        SpecError: The URL names no known storage.
        StorageError: The S3 client cannot be configured (a missing profile, say).
    """
    if is_local(url):
        return LocalStore(Path(out) / CHECKPOINTS_DIR)
    if is_s3(url):
        if not spool:
            return S3Store(url, env=env, read_wait_s=read_wait_s)
        # The spool retries for as long as it takes: a request gives up after two attempts,
        # so a refused or frozen server sends the checkpoint to the spool within a minute.
        return SpoolingStore(
            S3Store(url, env=env, max_attempts=SPOOLED_ATTEMPTS, read_wait_s=read_wait_s),
            spool_dir=Path(out) / SPOOL_DIR,
        )
    raise SpecError(
        f"field 'storage.url': unknown storage '{url}'; use {KNOWN}.", field="storage.url"
    )


def check_storage(url: str, *, env: Mapping[str, str] | None = None, wait_s: float = 0.0) -> None:
    """Before anything trains: the URL, the credentials and the bucket of ``storage.url``.

    ``'local'`` needs no check. For ``s3://`` a probe object is written, read back and deleted;
    while the store does not answer, the probe is tried again with backoff for up to ``wait_s``
    seconds (a campaign's start: ``read_wait_s(spec)``; 0, ``campaign plan``: not at all).

    Raises:
        SpecError: What is wrong, naming the URL and the endpoint (never a key), or that the
            store did not answer for ``wait_s`` (nothing is lost: run the campaign again).
    """
    if is_local(url):
        return
    try:
        store = open_store(url, out=".", env=env, spool=False, read_wait_s=0)
        if isinstance(store, S3Store):
            # A campaign's start waits out a store that does not answer (a restart, a freeze),
            # as its reads do, said once; a refusal (keys, bucket) ends it at once.
            probe = ReadWait(url, bound_s=wait_s, transient=is_transient)
            probe.run("a probe object (the check of the store at the start)", store.check)
    except StoreUnreachable as exc:
        raise SpecError(f"field 'storage.url': {exc}", field="storage.url") from None
    except StorageError as exc:
        raise SpecError(
            f"field 'storage.url': {url} is not usable: {exc}", field="storage.url"
        ) from None
