"""The timeline a store keeps for a campaign is that campaign's alone: a folder of another
campaign on the same prefix (another spec, or its own campaign ID) never takes it, and a
timeline that no campaign wrote (a malformed line, a forged duration) is refused in one
paragraph naming the key and the fix, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpucampaign.core.errors import SpecError
from gpucampaign.folder.layout import CAMPAIGN_FILE, TIMELINE
from gpucampaign.folder.records import fix_campaign_id, read_campaign_id
from gpucampaign.storage import LocalStore
from gpucampaign.storage.sharedtimeline import adopt_timeline, share_timeline

SPEC = "ab" * 32
ROW = {"phase": "train", "start": "2026-01-01T00:00:00+00:00", "seconds": 60.0, "steps": 5}


class Bucket(LocalStore):
    """A store that is not a local folder, as an ``s3://`` bucket is not."""

    def local_path(self, key: str) -> Path | None:
        return None


def _shared(tmp_path: Path, rows: list[str]) -> tuple[Bucket, str]:
    """A bucket holding host A's campaign ID and a timeline of ``rows``."""
    host_a = tmp_path / "a"
    host_a.mkdir()
    cid = fix_campaign_id(host_a, name="c", spec_sha256=SPEC)
    (host_a / TIMELINE).write_text("".join(f"{r}\n" for r in rows))
    bucket = Bucket(tmp_path / "bucket")
    share_timeline(host_a, store=bucket)
    return bucket, cid


def test_the_same_campaign_takes_its_timeline(tmp_path: Path) -> None:
    bucket, cid = _shared(tmp_path, [json.dumps(ROW)])
    fresh = tmp_path / "b"
    assert adopt_timeline(fresh, store=bucket, spec_sha256=SPEC)
    assert read_campaign_id(fresh) == cid and (fresh / TIMELINE).is_file()


def test_a_campaign_with_its_own_id_on_the_same_prefix_does_not_take_it(tmp_path: Path) -> None:
    bucket, cid = _shared(tmp_path, [json.dumps(ROW)])
    mine = tmp_path / "mine"
    mine.mkdir()
    own = fix_campaign_id(mine, name="d", spec_sha256=SPEC)  # the same spec, its own ID
    assert own != cid
    assert not adopt_timeline(mine, store=bucket, spec_sha256=SPEC)
    assert not (mine / TIMELINE).exists() and read_campaign_id(mine) == own
    other = tmp_path / "other"
    assert not adopt_timeline(other, store=bucket, spec_sha256="cd" * 32)
    assert not (other / TIMELINE).exists() and not (other / CAMPAIGN_FILE).exists()


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("not json", "not JSON"),
        ("[1, 2]", "'phase'"),
        (json.dumps({**ROW, "start": "yesterday"}), "'start' is not a date"),
        (json.dumps({**ROW, "seconds": 60752 * 3600.0}), "not a duration within a year"),
        (json.dumps({**ROW, "seconds": -5}), "not a duration within a year"),
        (json.dumps({**ROW, "steps": "many"}), "not a whole number"),
    ],
)
def test_a_timeline_no_campaign_wrote_is_refused_naming_the_line(
    tmp_path: Path, line: str, said: str
) -> None:
    bucket, _ = _shared(tmp_path, [json.dumps(ROW), line])
    fresh = tmp_path / "b"
    with pytest.raises(SpecError) as refused:
        adopt_timeline(fresh, store=bucket, spec_sha256=SPEC)
    text = str(refused.value)
    assert "line 2" in text and said in text and "Delete that key" in text
    assert not (fresh / TIMELINE).exists()


def test_a_machine_of_one_lot_shares_its_timeline_under_its_own_key_only(tmp_path: Path) -> None:
    # The campaign's copy (timeline, campaign ID) is its flow's: a machine running one lot's
    # lanes never writes over it, at any durable checkpoint of its runs.
    bucket, _ = _shared(tmp_path, [json.dumps(ROW)])
    before = {k: bucket.read_bytes(k) for k in bucket.list()}
    machine = tmp_path / "machine"
    machine.mkdir()
    fix_campaign_id(machine, name="c", spec_sha256=SPEC)
    (machine / TIMELINE).write_text(json.dumps({**ROW, "lot": 2}) + "\n")
    share_timeline(machine, store=bucket, key=f"lanes/lot-2/{TIMELINE}")
    after = {k: bucket.read_bytes(k) for k in bucket.list()}
    assert set(after) - set(before) == {f"lanes/lot-2/{TIMELINE}"}
    assert all(after[k] == v for k, v in before.items())
