"""The rental deadline: lots with starts_at, ends_at in the plan, the late-retrieval warning."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from gpucampaign.cli import app
from gpucampaign.config import parse_spec
from gpucampaign.core.clock import DrivenClock, use_clock
from gpucampaign.plan import calendar


def _spec(hours_before_retrieval: float, **lot: Any) -> Any:
    return parse_spec(
        {
            "name": "t",
            "packages": [{"gpu": "rtx4090", "days": 3, **lot}],
            "calendar": [
                {"name": "load", "kind": "machine", "resource": "cpu", "hours": 1},
                {
                    "name": "checkpoint-save-transfer-restore",
                    "kind": "machine",
                    "resource": "gpu",
                    "hours": 1,
                    "after": ["load"],
                },
                {
                    "name": "eval",
                    "kind": "machine",
                    "resource": "gpu",
                    "hours": hours_before_retrieval,
                    "after": ["checkpoint-save-transfer-restore"],
                },
                {
                    "name": "outputs",
                    "kind": "machine",
                    "resource": "cpu",
                    "hours": 1,
                    "after": ["eval"],
                },
                {
                    "name": "retrieve",
                    "kind": "machine",
                    "resource": "none",
                    "hours": 2,
                    "after": ["outputs"],
                },
            ],
        }
    )


def test_a_lot_with_starts_at_gives_ends_at_in_the_plan() -> None:
    spec = _spec(10, starts_at="2026-03-02T09:00:00Z", order_ref="ORD-1")
    assert spec.packages[0].order_ref == "ORD-1"
    d = calendar.plan(spec).to_dict()
    assert d["starts_at"] == "2026-03-02T09:00:00Z"
    assert d["ends_at"] == "2026-03-05T09:00:00Z"
    assert d["rental"]["lots"][0]["order_ref"] == "ORD-1"
    assert not [w for w in d["warnings"] if "rental ends" in w]


def test_a_naive_time_is_read_as_utc_and_an_offset_is_converted() -> None:
    assert (
        _spec(1, starts_at="2026-03-02T09:00:00").packages[0].ends_at.isoformat()
        == "2026-03-05T09:00:00+00:00"
    )
    assert _spec(1, starts_at="2026-03-02T11:00:00+02:00").packages[0].starts_at.hour == 9


def test_retrieval_after_the_rental_ends_is_warned() -> None:
    # 1 + 1 + 70 + 1 = 73 h before the 2-hour retrieval: it ends at 75 h, the lot at 72 h.
    p = calendar.plan(_spec(70, starts_at="2026-03-02T09:00:00Z"))
    late = [w for w in p.warnings if "after the rental ends" in w]
    assert len(late) == 1 and "'retrieve'" in late[0] and "2026-03-05T09:00:00Z" in late[0]


def test_no_starts_at_no_deadline() -> None:
    d = calendar.plan(_spec(70)).to_dict()
    assert d["ends_at"] is None and d["rental"] is None
    assert not [w for w in d["warnings"] if "rental ends" in w]


def test_plan_json_carries_ends_at_and_the_warning(tmp_path: Path) -> None:
    spec = _spec(70, starts_at="2026-03-02T09:00:00Z")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude_none=True)))
    # Planned before the lot starts (a lot that has ended is refused: test_ended_lots.py).
    with use_clock(DrivenClock(datetime(2026, 3, 1, tzinfo=UTC))):
        res = CliRunner().invoke(app, ["plan", str(path), "--json"])
    out = json.loads(res.stdout)
    assert out["ends_at"] == "2026-03-05T09:00:00Z"
    assert any("after the rental ends" in w for w in out["warnings"])
