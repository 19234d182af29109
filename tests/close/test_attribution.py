"""Every second of each lot's window given to one cause, the price split in the same shares,
and the goodput (close/attribution.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from gpucampaign.close.attribution import (
    CAUSES,
    IDLE,
    MACHINE_LOSS,
    RECOVERY,
    STEPS,
    LotWindow,
    attribute_window,
)
from gpucampaign.folder.layout import ATTRIBUTION_PNG
from gpucampaign.folder.records import PlanRecord, PlanStep, TimelineRow
from gpucampaign.folder.segments import CUT_OUTCOME

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
LOT = LotWindow(number=1, hours=24.0, price_usd=Decimal("10.00"), label="lot 1")
PLAN = PlanRecord(
    steps=(PlanStep(name="train-a", hours=1.0, kind="machine", run="a", start_hours=0.0),),
    window_hours=24.0,
)


def _sums_to_window(att: dict) -> None:
    for m in att["machines"]:
        total = sum(m["seconds"].values())
        assert abs(total - m["window_s"]) <= 0.01 * m["window_s"]
        assert all(v >= -1e-9 for v in m["seconds"].values())
        assert abs(sum(m["usd"].values()) - m["price_usd"]) <= 0.01 * m["price_usd"]
    assert set(att["seconds"]) == set(CAUSES)


def test_the_closed_folder_gives_each_second_of_its_window_to_one_cause(closed: dict) -> None:
    """A real small campaign's close: the report's table and figure, summing to the window."""
    out = closed["out"]
    report = json.loads((out / "report.json").read_text())
    att = report["attribution"]
    _sums_to_window(att)
    assert att["seconds"][STEPS] > 0 and 0 < report["goodput"] <= 1
    assert report["figures"]["attribution"] == ATTRIBUTION_PNG
    assert (out / ATTRIBUTION_PNG).is_file()
    md = (out / "report.md").read_text()
    assert "## Where the lots' time went" in md and "Goodput:" in md
    assert "| **window** |" in md and "share of the price (USD)" in md


def _train_rows(first: int, last: int, step_s: float = 1.0) -> list[dict]:
    return [{"kind": "train", "step": s, "step_s": step_s} for s in range(first, last + 1)]


def _seg(start_s: float, end_s: float, **kw: object) -> TimelineRow:
    return TimelineRow.between(
        kw.pop("step", "train-a"),
        phase=str(kw.pop("phase", "train")),
        start=T0 + timedelta(seconds=start_s),
        end=T0 + timedelta(seconds=end_s),
        run=kw.pop("run", "a"),
        **kw,  # type: ignore[arg-type]
    )


def test_a_killed_and_resumed_run_puts_its_lost_time_under_recovery_on_its_machine() -> None:
    """Killed at 40 s (10 s trained since the checkpoint at step 30), resumed 5 s later on
    another machine of the lot after a 1 s restore: 16 s of recovery, charged to the machine
    loss, on the machine it ran on; the goodput falls by exactly that share of the window
    elapsed, against the same training done without the kill."""
    clean = attribute_window(
        lots=[LOT],
        plan=PLAN,
        timeline=[_seg(0, 100, host="vm-a", steps=100)],
        metrics={"a": _train_rows(1, 100)},
        results={"a": {"timings": {"train_s": 100.0}}},
    )
    cut = _seg(0, 40, host="vm-a", outcome=CUT_OUTCOME, lost_steps=10, lost_seconds=10.0)
    resumed = _seg(45, 116, host="vm-b", steps=70)
    rows = [
        *_train_rows(1, 30),
        {"kind": "checkpoint", "step": 30, "stall_s": 0.0},
        {"kind": "restore", "step": 30, "restore_s": 1.0},
        *_train_rows(31, 100),
    ]
    killed = attribute_window(
        lots=[LOT],
        plan=PLAN,
        timeline=[cut, resumed],
        metrics={"a": rows},
        results={"a": {"timings": {"train_s": 70.0}}},
    )
    _sums_to_window(killed)
    m = killed["machines"][0]
    assert m["hosts"] == ["vm-a", "vm-b"]
    assert abs(m["seconds"][RECOVERY] - 16.0) < 1e-6
    assert abs(killed["lost_by_cause"][MACHINE_LOSS] - 16.0) < 1e-6
    assert abs(m["seconds"][STEPS] - 100.0) < 1e-6
    assert killed["counted_s"] == clean["counted_s"] == 100.0
    share = m["seconds"][RECOVERY] / killed["elapsed_s"]
    assert abs(killed["goodput"] - clean["goodput"] * (1 - share)) < 1e-9
    assert abs(killed["lost_shares"][MACHINE_LOSS] - share) < 1e-9


def test_the_relaunch_that_audits_again_before_it_resumes_is_recovery_too() -> None:
    """Killed at 40 s (10 s lost since the checkpoint); the relaunch audits again from 50 to
    52 s and resumes the run at 55 s after a 1 s restore: the whole wait (15 s, its audit
    included), the lost 10 s and the restore are recovery, as the loss ledger counts them (on
    main the wait around the audit was idle and the audit an audit: 11 s of recovery)."""
    cut = _seg(0, 40, host="vm-a", outcome=CUT_OUTCOME, lost_steps=10, lost_seconds=10.0)
    audit = _seg(50, 52, host="vm-a", phase="audit", step="audit", run=None)
    resumed = _seg(55, 126, host="vm-a", steps=70)
    rows = [
        *_train_rows(1, 30),
        {"kind": "restore", "step": 30, "restore_s": 1.0},
        *_train_rows(31, 100),
    ]
    att = attribute_window(
        lots=[LOT],
        plan=PLAN,
        timeline=[cut, audit, resumed],
        metrics={"a": rows},
        results={"a": {"timings": {"train_s": 70.0}}},
    )
    _sums_to_window(att)
    (m,) = att["machines"]
    assert abs(m["seconds"][RECOVERY] - 26.0) < 1e-6
    assert m["seconds"]["audit"] == 0.0
    assert abs(att["lost_by_cause"][MACHINE_LOSS] - 26.0) < 1e-6
    assert abs(att["lost_shares"][MACHINE_LOSS] - 26.0 / att["elapsed_s"]) < 1e-9


def test_a_run_a_stop_rule_ended_counts_nothing_toward_the_goodput() -> None:
    from gpucampaign.folder.records import StopRecord

    att = attribute_window(
        lots=[LOT],
        plan=PLAN,
        timeline=[_seg(0, 50, host="vm-a", steps=50)],
        metrics={"a": _train_rows(1, 50)},
        stops=[StopRecord(stop_id="s1", rule="non_finite_loss", run_id="a-1", run="a")],
    )
    assert att["goodput"] == 0.0 and att["lost_by_cause"]["stop rule"] == 50.0


def test_each_machine_is_charged_to_the_lot_its_segments_name() -> None:
    """The second lot's machine started first: its rows name lot 2 (its worker's
    GPUCAMPAIGN_LOT), so its time is on lot 2's bar and price, not on the first lot's."""
    two = [LOT, LotWindow(number=2, hours=24.0, price_usd=Decimal("30.00"), label="lot 2")]
    att = attribute_window(
        lots=two,
        plan=PLAN,
        timeline=[
            _seg(0, 40, host="vm-b", lot=2, worker="vm-b-lot-2", steps=40),
            _seg(10, 30, host="vm-a", lot=1, worker="vm-a-lot-1", steps=20, run="b"),
        ],
        metrics={"a": _train_rows(1, 40), "b": _train_rows(1, 20)},
    )
    _sums_to_window(att)
    first, second = att["machines"]
    assert (first["lot"], first["hosts"]) == (1, ["vm-a"])
    assert (second["lot"], second["hosts"]) == (2, ["vm-b"])
    assert abs(second["seconds"][STEPS] - 40.0) < 1e-6 and second["price_usd"] == 30.0


def test_an_unused_lot_is_idle_for_its_whole_window_and_priced() -> None:
    two = [LOT, LotWindow(number=2, hours=24.0, price_usd=Decimal("10.00"), label="lot 2")]
    att = attribute_window(
        lots=two,
        plan=PLAN,
        timeline=[_seg(0, 10, host="vm-a", steps=10)],
        metrics={"a": _train_rows(1, 10)},
    )
    _sums_to_window(att)
    assert att["machines"][1]["seconds"][IDLE] == 24 * 3600.0
    assert att["machines"][1]["usd"][IDLE] == 10.0


_PHASES = ["audit", "pilot", "train", "restart", "predict", "close", "decide", "load"]


@st.composite
def _timelines(draw: st.DrawFn) -> tuple[list[LotWindow], list[TimelineRow], dict]:
    lots = [
        LotWindow(
            number=i + 1, hours=draw(st.sampled_from([0.01, 0.05, 1.0])), price_usd=Decimal("3.5")
        )
        for i in range(draw(st.integers(1, 3)))
    ]
    rows, metrics = [], {}
    for _ in range(draw(st.integers(0, 12))):
        start = draw(st.floats(0, 200))
        length = draw(st.floats(0, 120))
        phase = draw(st.sampled_from(_PHASES))
        run = draw(st.sampled_from(["a", "b", None]))
        cut = draw(st.booleans())
        rows.append(
            _seg(
                start,
                start + length,
                phase=phase,
                run=run,
                step=draw(st.sampled_from(["train-a", None])),
                host=draw(st.sampled_from(["h1", "h2", "h3", None])),
                kind=draw(st.sampled_from(["machine", "machine", "person"])),
                outcome=CUT_OUTCOME if cut else "ok",
                lost_seconds=draw(st.floats(0, 300)) if cut else None,
            )
        )
    for run in ("a", "b"):
        metrics[run] = [
            draw(
                st.sampled_from(
                    [
                        {"kind": "train", "step_s": draw(st.floats(0, 50))},
                        {"kind": "eval", "eval_s": draw(st.floats(0, 50))},
                        {"kind": "checkpoint", "stall_s": draw(st.floats(0, 50))},
                        {"kind": "restore", "restore_s": draw(st.floats(0, 50))},
                    ]
                )
            )
            for _ in range(draw(st.integers(0, 8)))
        ]
    return lots, rows, metrics


@settings(derandomize=True, max_examples=150, deadline=None)
@given(_timelines())
def test_synthetic_records_always_sum_to_each_window(case: tuple) -> None:
    """Overlaps, cuts, resumes, hosts beyond the lots, clocks that disagree: every machine's
    causes add up to its window and its shares of the price to the price."""
    lots, rows, metrics = case
    att = attribute_window(
        lots=lots,
        plan=PLAN,
        timeline=rows,
        metrics=metrics,
        results={"a": {"timings": {"train_s": 30.0}}},
    )
    _sums_to_window(att)
    goodput = att["goodput"]
    assert goodput is None or 0.0 <= goodput <= 1.0 + 1e-9


def test_status_and_the_live_line_say_the_goodput_so_far(closed: dict) -> None:
    """`campaign status --json` carries the goodput over the window elapsed until now; the
    live line of `campaign run` and `campaign watch` ends with it."""
    import io

    from rich.console import Console
    from typer.testing import CliRunner

    from gpucampaign.cli import app
    from gpucampaign.cli.progress import LiveView

    out = closed["out"]
    res = CliRunner().invoke(app, ["status", str(out), "--json"])
    assert res.exit_code == 0, res.output
    g = json.loads(res.output)["goodput"]
    assert 0 < g["goodput"] < 1 and g["line"].startswith("Goodput: ")
    view = LiveView(out, console=Console(file=io.StringIO(), width=300), live=False)
    record = {"phase": "train", "run": "control", "step": 3, "target_steps": 6}
    assert view._line(record).endswith("%") and "goodput " in view._live_line(record)
