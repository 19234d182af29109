"""The timeline in the store while a campaign runs, so a loss is on the ledger on any host.

With an ``s3://`` store the campaign may resume on another host, into a fresh output folder
(a relaunch after its machine died). That folder never saw the first host's segments, so the
loss would vanish from the report. Each durable checkpoint therefore copies ``timeline.jsonl``
to its key in the store (the key the close's mirror gives it), and a fresh folder starts from
that copy: the dead host's open segment is then closed as interrupted by the next start, as on
one host, with the time until training resumed (the steps it trained after its last checkpoint
stayed on the lost machine: they are not known there).
"""

from __future__ import annotations

import logging
from pathlib import Path

from gpucampaign.folder.layout import TIMELINE
from gpucampaign.storage.base import NotFound, Store

log = logging.getLogger(__name__)


def share_timeline(root: str | Path, *, store: Store) -> None:
    """Copy the folder's timeline to the store (remote stores only; best effort: a failed copy
    is logged, the training goes on)."""
    src = Path(root) / TIMELINE
    if store.local_path(TIMELINE) is not None or not src.is_file():
        return
    try:
        store.write_bytes(TIMELINE, data=src.read_bytes())
    except Exception as exc:  # the checkpoints say more about an outage; the copy is a bonus
        log.warning("timeline not copied to %s: %s", store.url, exc)


def adopt_timeline(root: str | Path, *, store: Store) -> bool:
    """Start a folder without a timeline from the store's copy; True when one was taken."""
    dst = Path(root) / TIMELINE
    if store.local_path(TIMELINE) is not None or dst.exists():
        return False
    try:
        data = store.read_bytes(TIMELINE)
    except NotFound:
        return False
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(data)
    return True
