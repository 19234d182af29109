"""A lot's end is a hard end: a campaign whose lots all ended before it starts is refused by
`campaign plan` and `campaign run` (exit 2, the end and now named, nothing written) unless its
lots carry no ``starts_at`` (no deadline); and no phase starts on a machine whose lot has ended
or is inside the least margin (``engine.lotend.refuse_start``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gpucampaign.cli import app
from gpucampaign.cli.scaffold import init_campaign
from gpucampaign.config import load_spec
from gpucampaign.core.clock import DrivenClock, use_clock
from gpucampaign.engine import lotend
from gpucampaign.engine.lotend import LotEnded, refuse_start
from gpucampaign.plan.lots import LOT_ENV, refuse_ended_rental
from tests.helpers.noprefect import PrefectWouldStart, refuse_prefect

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def no_prefect(monkeypatch: pytest.MonkeyPatch) -> None:
    refuse_prefect(monkeypatch)
    monkeypatch.delenv(LOT_ENV, raising=False)
    lotend.forget_ended_lots()


def with_lots(spec: Path, *starts: datetime | None) -> Path:
    data = yaml.safe_load(spec.read_text())
    data["packages"] = [
        {"gpu": "rtx4090", "days": 3, **({"starts_at": s.isoformat()} if s else {})} for s in starts
    ]
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    return spec


def cli(*args: str) -> tuple[int | None, str]:
    result = CliRunner().invoke(app, list(args))
    if isinstance(result.exception, PrefectWouldStart):
        return None, result.output
    return result.exit_code, " ".join(result.output.split())


def test_a_rental_that_ended_a_month_ago_is_refused_by_plan_and_run(tmp_path: Path) -> None:
    spec = with_lots(init_campaign(tmp_path / "p"), NOW - timedelta(days=30))
    out = tmp_path / "out"
    with use_clock(DrivenClock(NOW)):
        for args in (("plan", str(spec)), ("run", str(spec), "--out", str(out))):
            code, text = cli(*args)
            assert code == 2 and "Traceback" not in text, text
            assert "every lot of the spec has ended" in text
            assert "ended at 2026-11-09T12:00:00Z" in text and "now 2026-12-06T12:00:00Z" in text
            assert "remove starts_at" in text
        assert not out.exists()
        # One lot still open, or a lot without a date (no deadline): not refused for it.
        with_lots(spec, NOW - timedelta(days=30), NOW - timedelta(days=1))
        refuse_ended_rental(load_spec(spec), now=NOW)
        with_lots(spec, NOW - timedelta(days=30), None)
        assert cli("run", str(spec), "--out", str(out))[0] is None  # Prefect would start


def test_no_phase_starts_after_the_lot_or_inside_its_least_margin(tmp_path: Path) -> None:
    spec_file = init_campaign(tmp_path / "p")
    start = NOW - timedelta(days=3)
    with use_clock(DrivenClock(NOW - timedelta(seconds=3600))) as clock:
        with_lots(spec_file, start)  # ends at NOW: an hour left
        spec = load_spec(spec_file)
        refuse_start(spec, what="train of x")  # an hour left: it starts
        clock.advance(3600 - 5)  # 5 s left: inside the least margin (10 s)
        with pytest.raises(LotEnded, match="ends in 5 s.*train of x not started"):
            refuse_start(spec, what="train of x")
        clock.advance(60)
        with pytest.raises(LotEnded, match="ended at 2026-12-06T12:00:00Z"):
            refuse_start(spec, what="train of y")
        # A later lot of the spec not open yet: still nothing starts here.
        with_lots(spec_file, start, NOW + timedelta(days=1))
        with pytest.raises(LotEnded, match="lot 1"):
            refuse_start(load_spec(spec_file), what="train of y")
        clock.advance(timedelta(days=1).total_seconds())  # lot 2 open: its runs start
        refuse_start(load_spec(spec_file), what="train of y")
        with_lots(spec_file, None)  # no date, no deadline
        refuse_start(load_spec(spec_file), what="train of y")
