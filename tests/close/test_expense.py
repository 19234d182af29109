"""`campaign expense`: an expense recorded after the start goes into ledger.jsonl, apart from
the rental; the close and `campaign report` count it; the check of the folder accepts the
ledger's growth only while its sealed part is intact."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpucampaign.cli import app
from gpucampaign.close.budget import close_budget, render_budget_md
from gpucampaign.close.closing import close_folder
from gpucampaign.close.ledger import budget_with_ledger, read_ledger
from gpucampaign.config import Package
from gpucampaign.verify.checks import verify_output
from tests.helpers import reseal

runner = CliRunner()


def _expense(out: Path, *args: str):
    return runner.invoke(app, ["expense", str(out), *args])


def test_an_expense_is_recorded_and_the_report_recomputes_the_budget(out: Path, closed: dict):
    spent = closed["budget"]["spent_usd"]
    res = _expense(
        out, "--usd", "12.5", "--what", "egress of the checkpoints", "--order-ref", "INV-2026-001"
    )
    assert res.exit_code == 0, res.output
    assert "12.50 USD" in res.output and "INV-2026-001" in res.output
    (entry,) = read_ledger(out)
    assert (entry.usd, entry.what, entry.order_ref) == (
        12.5,
        "egress of the checkpoints",
        "INV-2026-001",
    )
    summary = json.loads(runner.invoke(app, ["report", str(out), "--json"]).output)
    assert summary["spent_usd"] == pytest.approx(spent + 12.5)
    assert summary["rental_usd"] == closed["budget"]["rental_usd"]  # kept apart from the rental
    shown = runner.invoke(app, ["report", str(out)]).output
    assert "recomputed now" in shown and "egress of the checkpoints" in shown
    recomputed = budget_with_ledger(out, closed["budget"])  # nothing added but the ledger's
    assert [e["name"] for e in recomputed["expenses"]] == ["egress of the checkpoints"]


def test_the_close_counts_the_ledger(out: Path, closed: dict):
    _expense(out, "--usd", "30", "--what", "a second lot bought mid-campaign")
    spec = closed["spec"]
    src = Path(closed["out"]).parent / "src"
    closed2, _ = close_folder(
        spec, root=out, base_dir=src, campaign_id="closing-test-0001", analyses={}
    )
    names = [e["name"] for e in closed2.budget["expenses"]]
    assert "a second lot bought mid-campaign" in names
    assert closed2.budget["spent_usd"] == pytest.approx(closed["budget"]["spent_usd"] + 30)


def test_verify_accepts_the_ledgers_growth_only_with_its_sealed_part_intact(out: Path):
    assert _expense(out, "--usd", "5", "--what", "storage").exit_code == 0
    assert verify_output(out, reload=False).verified  # a ledger started after the seal
    reseal(out)  # the ledger is now sealed in the manifest
    assert _expense(out, "--usd", "7", "--what", "more storage").exit_code == 0
    assert verify_output(out, reload=False).verified  # appended after the seal: accepted
    ledger = out / "ledger.jsonl"
    text = ledger.read_text()
    assert '"usd": 5.0' in text
    ledger.write_text(text.replace('"usd": 5.0', '"usd": 1.0'))  # a sealed expense rewritten
    report = verify_output(out, reload=False)
    assert not report.verified
    assert "ledger.jsonl" in {p.path for p in report.problems}


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--usd", "-3", "--what", "x"], "--usd"),
        (["--usd", "abc", "--what", "x"], "--usd"),
        (["--usd", "3", "--what", "  "], "--what"),
        (["--usd", "3", "--what", "x", "--order-ref", "../../etc"], "--order-ref"),
        (["--what", "x"], "--usd"),
    ],
)
def test_bad_input_exits_2_naming_the_option_and_changes_nothing(out: Path, args, option):
    res = _expense(out, *args)
    assert res.exit_code == 2 and option in res.output, res.output
    assert not (out / "ledger.jsonl").exists()


def test_an_expense_needs_an_output_folder(tmp_path: Path):
    res = _expense(tmp_path, "--usd", "3", "--what", "x")
    assert res.exit_code == 2 and "not a campaign's output folder" in res.output


def test_the_budget_lists_each_lot_with_its_order_reference():
    budget = close_budget(
        [Package(gpu="rtx4090", days=3, price_usd=47.14, order_ref="ORD-77")],
        expenses=[{"name": "egress", "usd": 2.0, "note": ""}],
        unit=None,
    )
    md = render_budget_md(budget)
    assert "order ORD-77" in md and "egress: 2.00 USD" in md and budget["spent_usd"] == 49.14
