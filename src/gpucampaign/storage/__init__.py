"""Where checkpoints and mirrored folders live: ``Store``, the local and S3 backends, the spool,
the mirror."""

from gpucampaign.storage.base import (
    ContentMismatch,
    LocalStore,
    NoAnswer,
    NotFound,
    StorageError,
    Store,
    StoreUnreachable,
    check_key,
)
from gpucampaign.storage.open import check_storage, open_store
from gpucampaign.storage.s3 import S3Store, parse_s3_url
from gpucampaign.storage.spool import SpoolingStore, spooled_keys

__all__ = [
    "ContentMismatch",
    "LocalStore",
    "NoAnswer",
    "NotFound",
    "S3Store",
    "SpoolingStore",
    "StorageError",
    "Store",
    "StoreUnreachable",
    "check_key",
    "check_storage",
    "open_store",
    "parse_s3_url",
    "spooled_keys",
]
