"""The timeline and the campaign ID in the store while a campaign runs, so a loss is on the
ledger, and the campaign one campaign, on any host.

With an ``s3://`` store the campaign may resume on another host, into a fresh output folder
(a relaunch after its machine died). That folder never saw the first host's segments, so the
loss would vanish from the report. Each durable checkpoint therefore copies ``timeline.jsonl``
to its key in the store (the key the close's mirror gives it), and a fresh folder starts from
that copy: the dead host's open segment is then closed as interrupted by the next start, as on
one host, with the time until training resumed (the steps it trained after its last checkpoint
stayed on the lost machine: they are not known there).

``campaign.json`` (the campaign ID) goes with it, so the fresh folder continues the same
campaign: its reports, notifications and MLflow parent run are the first host's, not a second
campaign's. The ID is taken only for the same spec (its sha256 in ``campaign.json``), as a
folder refuses another spec.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from gpucampaign.core.files import atomic_write_bytes
from gpucampaign.folder.layout import CAMPAIGN_FILE, TIMELINE
from gpucampaign.storage.base import NotFound, Store

log = logging.getLogger(__name__)

# (store, campaign.json's bytes) copied by this process: the ID never changes, one copy will do.
_SHARED_IDS: set[tuple[str, bytes]] = set()


def share_timeline(root: str | Path, *, store: Store) -> None:
    """Copy the folder's timeline, and once its ``campaign.json``, to the store (remote stores
    only; best effort: a failed copy is logged, the training goes on)."""
    root = Path(root)
    if store.local_path(TIMELINE) is not None:
        return
    for name in (CAMPAIGN_FILE, TIMELINE):
        src = root / name
        if not src.is_file():
            continue
        try:
            data = src.read_bytes()
            if name == CAMPAIGN_FILE and (store.url, data) in _SHARED_IDS:
                continue
            store.write_bytes(name, data=data)
        except Exception as exc:  # the checkpoints say more about an outage; the copy is a bonus
            log.warning("%s not copied to %s: %s", name, store.url, exc)
            continue
        if name == CAMPAIGN_FILE:
            _SHARED_IDS.add((store.url, data))


def adopt_timeline(root: str | Path, *, store: Store, spec_sha256: str | None = None) -> bool:
    """Start a folder without a timeline from the store's copy; True when one was taken.

    With ``spec_sha256``, a folder without ``campaign.json`` takes the store's too when it
    records that spec (the campaign goes on with its ID); another spec's is left there.
    """
    root = Path(root)
    if store.local_path(TIMELINE) is not None:
        return False
    if spec_sha256 is not None and not (root / CAMPAIGN_FILE).exists():
        _adopt_campaign_id(root, store=store, spec_sha256=spec_sha256)
    dst = root / TIMELINE
    if dst.exists():
        return False
    try:
        data = store.read_bytes(TIMELINE)
    except NotFound:
        return False
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(data)
    return True


def _adopt_campaign_id(root: Path, *, store: Store, spec_sha256: str) -> None:
    try:
        data = store.read_bytes(CAMPAIGN_FILE)
        record = json.loads(data)
    except (NotFound, ValueError):  # none, or not one a campaign wrote: the folder makes its own
        return
    if (
        isinstance(record, dict)
        and record.get("spec_sha256") == spec_sha256
        and isinstance(record.get("campaign_id"), str)
    ):
        root.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(root / CAMPAIGN_FILE, data)
