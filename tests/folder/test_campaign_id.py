"""``campaign.json``: one writer (``fix_campaign_id``, at the flow's first start) and one
reader (``read_campaign_id``: tracking and notifications)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from gpucampaign.folder.layout import CAMPAIGN_FILE
from gpucampaign.folder.records import fix_campaign_id, read_campaign_id


def test_the_id_is_fixed_at_the_first_start_and_read_back(tmp_path: Path) -> None:
    assert read_campaign_id(tmp_path) is None
    cid = fix_campaign_id(tmp_path, name="digits", spec_sha256="abcdef0123456789")
    assert re.fullmatch(r"digits-\d{8}T\d{6}Z-abcdef01", cid)
    record = json.loads((tmp_path / CAMPAIGN_FILE).read_text())
    assert record == {
        "campaign_id": cid,
        "spec_sha256": "abcdef0123456789",
        "started_at": cid.split("-")[1],
    }
    assert read_campaign_id(tmp_path) == cid
    assert fix_campaign_id(tmp_path, name="other", spec_sha256="ffff") == cid  # never rewritten


def test_an_unreadable_record_reads_as_none(tmp_path: Path) -> None:
    (tmp_path / CAMPAIGN_FILE).write_text("{not json")
    assert read_campaign_id(tmp_path) is None
    (tmp_path / CAMPAIGN_FILE).write_text("{}")
    assert read_campaign_id(tmp_path) is None
