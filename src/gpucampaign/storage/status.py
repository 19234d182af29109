"""What is safely off the rented machine: ``campaign status OUT``.

Reads an output folder and its store, changes nothing. For each checkpoint and each output
file it says whether the store holds it (the checkpoint listing of the store; the mirror
index, compared by sha256, for the output files) or whether it exists only on this machine,
how long the rental has left, and the command that brings the campaign back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpucampaign.config import CampaignSpec, load_spec
from gpucampaign.core.errors import FolderError
from gpucampaign.core.files import sha256_file
from gpucampaign.core.storageurl import is_local
from gpucampaign.folder.layout import (
    CHECKPOINT_LATEST,
    CHECKPOINT_STEP_PREFIX,
    CHECKPOINTS_DIR,
    LOCK_FILE,
    MANIFEST,
    PLAN,
    RUNS_DIR,
    SPEC_COPY,
    SPOOL_DIR,
    OutputFolder,
    is_live_progress,
)
from gpucampaign.plan.rental import iso, rental_of
from gpucampaign.storage.base import LocalStore, NotFound, StorageError
from gpucampaign.storage.mirror import MIRROR_INDEX, retrieve_folder
from gpucampaign.storage.open import open_store, read_wait_s
from gpucampaign.storage.spool import spooled_keys


def say_left(hours: float | None) -> str:
    """``'2 d 3 h'``, ``'5.5 h'``, ``'ended 3 h ago'`` or ``'unknown'``."""
    if hours is None:
        return "unknown"
    if hours < 0:
        return f"ended {say_left(-hours)} ago"
    if hours >= 48:
        return f"{int(hours // 24)} d {hours % 24:.0f} h"
    return f"{hours:.1f} h"


def campaign_folder_spec(out: str | Path) -> CampaignSpec:
    """The spec a campaign's output folder keeps (``spec.yaml``).

    Raises:
        SpecError: ``out`` is not a campaign's output folder.
    """
    root = Path(out)
    if not root.is_dir() or not any((root / n).is_file() for n in (SPEC_COPY, PLAN, MANIFEST)):
        raise FolderError(
            f"'{out}' is not a campaign output folder (no spec.yaml, plan.json or "
            "manifest.json): give the folder that `campaign run --out` wrote.",
            field="OUT",
        )
    spec = OutputFolder(root).path(SPEC_COPY)  # a link out of the folder is refused
    if not spec.is_file():
        raise FolderError(
            f"'{out}' has no spec.yaml: its storage and lots are unknown.", field="OUT"
        )
    return load_spec(spec, recipe_folder=False)  # the folder is no place to import from


def _output_files(root: Path) -> list[str]:
    """The folder's files that belong off the machine: what the mirror copies (not the
    checkpoints or the spool, counted apart; not the writer's empty lock or the live
    progress records, which the mirror leaves out too)."""
    skip = (f"{CHECKPOINTS_DIR}/", f"{SPOOL_DIR}/")
    return [
        k
        for k in LocalStore(root).list()
        if not k.startswith(skip) and k not in (MIRROR_INDEX, LOCK_FILE) and not is_live_progress(k)
    ]


def _is_checkpoint_key(key: str) -> bool:
    """A checkpoint's key in the store (``<run_id>/LATEST``, ``<run_id>/step-*/<file>``), told
    apart from the mirrored output folder's keys by its shape: the run IDs are not needed, so
    the recipe that hashes into them is never looked for (it may not import from here)."""
    parts = key.split("/")
    if parts[0] in (RUNS_DIR, CHECKPOINTS_DIR, SPOOL_DIR):
        return False
    if len(parts) == 2:
        return parts[1] == CHECKPOINT_LATEST
    return len(parts) == 3 and parts[1].startswith(CHECKPOINT_STEP_PREFIX)


def _mirrored(store: Any) -> dict[str, Any]:
    try:
        return dict(json.loads(store.read_bytes(MIRROR_INDEX)).get("files") or {})
    except NotFound:
        return {}
    except (ValueError, AttributeError):
        return {}


def campaign_status(
    out: str | Path,
    *,
    now: datetime | None = None,
    env: Mapping[str, str] | None = None,
    store: Any = None,
) -> dict[str, Any]:
    """Where a campaign's files are, and how long the rental has left.

    Args:
        out: The campaign's output folder.
        now: The time to count from (default: now, UTC).
        env: The AWS variables for an S3 store (default: the environment).
        store: An open store instead of the one ``storage.url`` names.

    Returns:
        ``{"out", "name", "storage", "ends_at", "hours_left", "time_left", "checkpoints":
        {"in_store", "only_local"}, "outputs": {"in_store", "only_local"}, "safe",
        "retrieve", "store_error"}``; ``safe`` is true when nothing is only local.

    Raises:
        SpecError: ``out`` is not a campaign's output folder.
    """
    root = Path(out)
    spec = campaign_folder_spec(root)
    url = spec.storage.url
    rental = rental_of(spec)
    now = now or datetime.now(UTC)
    hours_left = None if rental is None else rental.hours_left(now)
    outputs = _output_files(root)
    ck_store: list[str] = []
    ck_local: list[str] = []
    out_store: list[str] = []
    error = None
    if is_local(url):
        ck_local = LocalStore(root / CHECKPOINTS_DIR).list()
        out_local = outputs
    else:
        ck_local = spooled_keys(root)
        try:
            # Status answers now: an unreachable store is said, not waited for.
            store = store or open_store(url, out=root, env=env, spool=False, read_wait_s=0)
            local = set(ck_local)
            ck_store = [k for k in store.list() if _is_checkpoint_key(k) and k not in local]
            index = _mirrored(store)
        except StorageError as exc:
            error, index = str(exc), {}
        out_store = [
            r
            for r in outputs
            if r in index and index[r].get("sha256") == sha256_file(OutputFolder(root).path(r))
        ]
        out_local = [r for r in outputs if r not in set(out_store)]
    return {
        "out": str(root),
        "name": spec.name,
        "storage": url,
        "ends_at": iso(rental.ends_at) if rental else None,
        "hours_left": None if hours_left is None else round(hours_left, 2),
        "time_left": say_left(hours_left),
        "checkpoints": {"in_store": ck_store, "only_local": ck_local},
        "outputs": {"in_store": out_store, "only_local": out_local},
        "safe": not is_local(url) and error is None and not ck_local and not out_local,
        "retrieve": None if is_local(url) else f"campaign retrieve {url} --to DIR",
        "store_error": error,
    }


def render_status(status: Mapping[str, Any]) -> str:
    """The status as a few lines of text for a person."""
    ck, outs = status["checkpoints"], status["outputs"]
    lines = [
        f"campaign {status['name']} in {status['out']}",
        f"rental ends: {status['ends_at'] or 'unknown (no starts_at on the lots)'}; "
        f"time left: {status['time_left']}",
        f"storage: {status['storage']}",
    ]
    if status["store_error"]:
        lines.append(f"store unreachable: {status['store_error']}")
    lines.append(
        f"checkpoints: {len(ck['in_store'])} file(s) in the store, "
        f"{len(ck['only_local'])} only on this machine"
    )
    lines.append(
        f"output files: {len(outs['in_store'])} in the store, "
        f"{len(outs['only_local'])} only on this machine"
    )
    for key in (ck["only_local"] + outs["only_local"])[:20]:
        lines.append(f"  only local: {key}")
    if status["retrieve"]:
        lines.append(f"retrieve: {status['retrieve']}")
    else:
        lines.append(
            "storage is 'local': every file is on this machine only; copy the folder "
            "off before the rental ends, or use storage.url: s3://bucket/prefix"
        )
    lines.append(
        "everything is off the machine" if status["safe"] else "NOT everything is off the machine"
    )
    return "\n".join(lines)


class RentalEnding(RuntimeError):
    """The rental ends within the margin while some files are still only on this machine."""


def check_rental_margin(
    out: str | Path,
    *,
    margin_hours: float = 12.0,
    now: datetime | None = None,
    env: Mapping[str, str] | None = None,
    store: Any = None,
) -> dict[str, Any]:
    """The campaign's status, after checking that nothing is at risk of being lost.

    Returns:
        ``campaign_status(out)``.

    Raises:
        RentalEnding: Less than ``margin_hours`` remain (or the rental has ended) while a
            checkpoint or an output file exists only on this machine.
    """
    status = campaign_status(out, now=now, env=env, store=store)
    left = status["hours_left"]
    if left is None or left >= margin_hours or status["safe"]:
        return status
    only = status["checkpoints"]["only_local"] + status["outputs"]["only_local"]
    where = (
        f"copy the folder off now ({status['storage']} keeps everything on this machine)"
        if status["retrieve"] is None
        else f"mirror it to {status['storage']} now; then `{status['retrieve']}`"
    )
    raise RentalEnding(
        f"the rental of '{status['name']}' ends at {status['ends_at']} ({status['time_left']} "
        f"left, under the {margin_hours:g} h margin) and {len(only)} file(s) are only on this "
        f"machine, e.g. {', '.join(only[:3])}: {where}"
        + (f"; the store is unreachable: {status['store_error']}" if status["store_error"] else "")
    )


def folder_to_check(
    out: str | Path, *, dest: str | Path, env: Mapping[str, str] | None = None, store: Any = None
) -> Path:
    """The folder a scheduled check reads: a fresh copy retrieved from the store, not the disk.

    For an S3 store that holds a mirror of the folder, the mirror is retrieved into ``dest``
    (every file checked by size and sha256) and ``dest`` is returned; otherwise (local storage,
    or no mirror yet while the campaign runs) ``out`` itself, whose checkpoints the check
    still reads from the store. ``store`` replaces the one ``storage.url`` names.

    Raises:
        SpecError: ``out`` is not a campaign's output folder.
        StorageError: The store holds a mirror that cannot be retrieved.
    """
    spec = campaign_folder_spec(out)
    if is_local(spec.storage.url):
        return Path(out)
    store = store or open_store(
        spec.storage.url, out=out, env=env, spool=False, read_wait_s=read_wait_s(spec)
    )
    if not store.exists(MIRROR_INDEX):
        return Path(out)
    retrieve_folder(store, dest=dest)
    return Path(dest)
