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

from gpucampaign.core.errors import SpecError
from gpucampaign.core.files import atomic_write_bytes, parse_time
from gpucampaign.folder.layout import CAMPAIGN_FILE, TIMELINE
from gpucampaign.folder.records import read_campaign_id
from gpucampaign.storage.base import NotFound, Store

log = logging.getLogger(__name__)

# (store, campaign.json's bytes) copied by this process: the ID never changes, one copy will do.
_SHARED_IDS: set[tuple[str, bytes]] = set()


def share_timeline(root: str | Path, *, store: Store, key: str = TIMELINE) -> None:
    """Copy the folder's timeline, and once its ``campaign.json``, to the store (remote stores
    only; best effort: a failed copy is logged, the training goes on).

    ``key``: where the timeline goes; a machine running one lot's lanes gives its own
    (``storage.lanefiles``) and shares no ``campaign.json``: the campaign's flow writes those.
    """
    root = Path(root)
    if store.local_path(TIMELINE) is not None:
        return
    for name in (CAMPAIGN_FILE, TIMELINE) if key == TIMELINE else (TIMELINE,):
        src = root / name
        if not src.is_file():
            continue
        try:
            data = src.read_bytes()
            if name == CAMPAIGN_FILE and (store.url, data) in _SHARED_IDS:
                continue
            store.write_bytes(key if name == TIMELINE else name, data=data)
        except Exception as exc:  # the checkpoints say more about an outage; the copy is a bonus
            log.warning("%s not copied to %s: %s", name, store.url, exc)
            continue
        if name == CAMPAIGN_FILE:
            _SHARED_IDS.add((store.url, data))


def adopt_timeline(root: str | Path, *, store: Store, spec_sha256: str | None = None) -> bool:
    """Start a folder without a timeline from the store's copy; True when one was taken.

    The store's timeline is this campaign's only when the store's ``campaign.json`` is: with
    ``spec_sha256``, a folder without ``campaign.json`` takes the store's when it records that
    spec (the campaign goes on with its ID); the timeline is then taken only when the folder's
    campaign ID is the store's. Another campaign on the same prefix (another spec, another ID)
    starts its own timeline.

    Raises:
        SpecError: The store's timeline of this campaign is not one a campaign wrote (a line
            that is not a timeline row, or a duration no campaign lasts).
    """
    root = Path(root)
    if store.local_path(TIMELINE) is not None or spec_sha256 is None:
        return False
    owner = _store_campaign(store, spec_sha256=spec_sha256)
    if owner is None:
        return False
    if not (root / CAMPAIGN_FILE).exists():
        root.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(root / CAMPAIGN_FILE, owner[1])
    if read_campaign_id(root) != owner[0]:
        log.info("the timeline in %s is another campaign's: not taken", store.url)
        return False
    dst = root / TIMELINE
    if dst.exists():
        return False
    try:
        data = store.read_bytes(TIMELINE)
    except NotFound:
        return False
    check_timeline(data, where=f"{store.url}/{TIMELINE}")
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(data)
    return True


def _store_campaign(store: Store, *, spec_sha256: str) -> tuple[str, bytes] | None:
    """The campaign ID in the store's ``campaign.json`` and its bytes, when it records the
    spec ``spec_sha256``; None otherwise (none, another spec's, or not a campaign's)."""
    try:
        data = store.read_bytes(CAMPAIGN_FILE)
        record = json.loads(data)
    except (NotFound, ValueError):  # none, or not one a campaign wrote: the folder makes its own
        return None
    if (
        isinstance(record, dict)
        and record.get("spec_sha256") == spec_sha256
        and isinstance(record.get("campaign_id"), str)
    ):
        return record["campaign_id"], data
    return None


#: The longest segment a timeline row may say (a year): a longer one is not a campaign's.
MAX_SEGMENT_SECONDS = 366 * 24 * 3600.0


def check_timeline(data: bytes, *, where: str) -> None:
    """Every line of a shared ``timeline.jsonl`` is a timeline row: a JSON object with a
    ``phase``, its times ISO dates, its counts whole numbers, its seconds within a year.

    Raises:
        SpecError: The first line that is not, named with the fix.
    """
    for n, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        why = _row_problem(line)
        if why:
            raise SpecError(
                f"the campaign's timeline in the store ({where}) is not one a campaign wrote: "
                f"line {n}: {why}. Delete that key (the campaign then starts its timeline on "
                "this host) or restore the one its first host wrote.",
                field="storage.url",
            )


def _row_problem(line: str) -> str:
    try:
        row = json.loads(line)
    except ValueError:
        return "not JSON"
    if not isinstance(row, dict) or not isinstance(row.get("phase"), str):
        return "not an object with a 'phase'"
    for key in ("start", "end", "seen"):
        if row.get(key) not in (None, ""):
            try:
                parse_time(str(row[key]))
            except ValueError:
                return f"'{key}' is not a date"
    for key in ("seconds", "lost_seconds"):
        value = row.get(key)
        if value is not None and (
            not isinstance(value, int | float) or not 0 <= value <= MAX_SEGMENT_SECONDS
        ):
            return f"'{key}' is {value!r}, not a duration within a year"
    for key in ("steps", "checkpoint_step", "lost_steps"):
        value = row.get(key)
        if value is not None and (not isinstance(value, int) or value < 0):
            return f"'{key}' is {value!r}, not a whole number"
    return ""
