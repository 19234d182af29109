"""`campaign verify` cross-checks ``timeline.jsonl`` with the folder's other records: a forged
row resealed into the manifest (so every hash matches) is named ``timeline_inconsistent``: a
plausible segment of another campaign's run, a segment of 60,752 hours in a campaign of
minutes, a lost time longer than its segment. The folder's own timeline passes."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gpucampaign.verify.checks import verify_output
from gpucampaign.verify.context import VerifyContext
from gpucampaign.verify.timeline import check_timeline
from tests.helpers import reseal


def _rows(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "timeline.jsonl").read_text().splitlines()]


def _train_row(out: Path) -> dict[str, Any]:
    """The folder's own last training row, the model a forger copies."""
    return next(r for r in reversed(_rows(out)) if r.get("phase") == "train" and r.get("run"))


def _plus(when: str, seconds: float) -> str:
    return (datetime.fromisoformat(when) + timedelta(seconds=seconds)).isoformat()


def _forged(row: dict[str, Any]) -> dict[str, Any]:
    return {**row, "segment": "f0f0f0f0f0f0", "event": "end"}


FORGERIES = {
    # Another campaign's run, at a plausible time and length: not a run of this manifest.
    "another campaign's run": lambda r: _forged({**r, "run": "wider-elsewhere"}),
    # 60,752 hours down: an interrupted segment far past the close.
    "60752 hours down": lambda r: _forged(
        {
            **r,
            "outcome": "interrupted: the machine was lost",
            "end": _plus(r["start"], 60752 * 3600),
            "seconds": 60752 * 3600.0,
        }
    ),
    # Its end honest, its seconds not: more time than the segment held.
    "seconds beyond the segment": lambda r: _forged({**r, "seconds": 86400.0 * 30}),
    "lost time beyond the segment": lambda r: _forged({**r, "lost_seconds": 86400.0 * 30}),
    # Days before the campaign started.
    "before the campaign": lambda r: _forged(
        {**r, "start": _plus(r["start"], -86400 * 3), "end": _plus(r["start"], -86400 * 3 + 60)}
    ),
}


@pytest.fixture
def folder(out: Path) -> Path:
    """The closed folder with the ``campaign.json`` a campaign writes at its first start (the
    test helper's close writes none): started at the second of its first row."""
    first = datetime.fromisoformat(_rows(out)[0]["start"])
    manifest = json.loads((out / "manifest.json").read_text())
    started = {
        "campaign_id": f"{manifest['campaign']}-{first:%Y%m%dT%H%M%SZ}-0",
        "spec_sha256": manifest["spec_sha256"],
        "started_at": f"{first:%Y%m%dT%H%M%SZ}",
    }
    (out / "campaign.json").write_text(json.dumps(started, indent=2) + "\n")
    reseal(out)
    return out


def test_the_folders_own_timeline_agrees_with_its_records(folder: Path) -> None:
    assert _train_row(folder)
    assert check_timeline(VerifyContext.open(folder, reload=False)) == []
    assert verify_output(folder, reload=False).verified


@pytest.mark.parametrize("forgery", list(FORGERIES))
def test_a_forged_timeline_row_resealed_is_named(folder: Path, forgery: str) -> None:
    out = folder
    row = FORGERIES[forgery](_train_row(out))
    with (out / "timeline.jsonl").open("a") as f:
        f.write(json.dumps(row) + "\n")
    reseal(out)
    report = verify_output(out, reload=False)
    found = [p for p in report.problems if p.code == "timeline_inconsistent"]
    assert not report.verified and len(found) == 1, report.problems
    n = len(_rows(out))
    assert found[0].path == "timeline.jsonl" and f"row {n} " in found[0].detail, found
