"""The expense ledger: append-only, validated, kept apart from the rental."""

from __future__ import annotations

import pytest

from gpucampaign.close.ledger import add_expense, read_ledger, sealed_prefix_intact
from gpucampaign.core.errors import ArgumentError, FolderError
from gpucampaign.core.files import sha256_bytes
from gpucampaign.folder.layout import LEDGER_FILE


@pytest.fixture()
def out(tmp_path):
    (tmp_path / "spec.yaml").write_text("name: x\n")
    return tmp_path


def test_expenses_append_in_order_and_read_back(out) -> None:
    add_expense(out, usd=12.5, what="egress of the checkpoints", order_ref="ITG-2026-0042")
    add_expense(out, usd=47.14, what="a second 3-day lot")
    rows = read_ledger(out)
    assert [(r.usd, r.what, r.order_ref) for r in rows] == [
        (12.5, "egress of the checkpoints", "ITG-2026-0042"),
        (47.14, "a second 3-day lot", None),
    ]
    assert rows[0].as_expense()["note"].startswith("order ITG-2026-0042; recorded ")


@pytest.mark.parametrize(
    ("kw", "option"),
    [
        ({"usd": 0, "what": "x"}, "--usd"),
        ({"usd": -3, "what": "x"}, "--usd"),
        ({"usd": float("nan"), "what": "x"}, "--usd"),
        ({"usd": 1, "what": "  "}, "--what"),
        ({"usd": 1, "what": "two\nlines"}, "--what"),
        ({"usd": 1, "what": "x", "order_ref": "../etc"}, "--order-ref"),
    ],
)
def test_bad_expense_names_the_option_and_writes_nothing(out, kw, option) -> None:
    with pytest.raises(ArgumentError) as err:
        add_expense(out, **kw)
    assert f"option '{option}'" in str(err.value)
    assert not (out / LEDGER_FILE).exists()


def test_a_folder_that_is_not_a_campaign_is_refused(tmp_path) -> None:
    with pytest.raises(FolderError, match="not a campaign's output folder"):
        add_expense(tmp_path, usd=1, what="x")
    assert not (tmp_path / LEDGER_FILE).exists()


def test_growth_after_sealing_keeps_the_sealed_part(out) -> None:
    add_expense(out, usd=1, what="first")
    sealed = (out / LEDGER_FILE).read_bytes()
    add_expense(out, usd=2, what="after the close")
    now = (out / LEDGER_FILE).read_bytes()
    assert sealed_prefix_intact(now, size=len(sealed), sha256=sha256_bytes(sealed))
    tampered = now.replace(b'"usd": 1.0', b'"usd": 9.0')
    assert not sealed_prefix_intact(tampered, size=len(sealed), sha256=sha256_bytes(sealed))
