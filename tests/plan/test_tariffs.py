"""The provider catalog: exact money, lots without a price, user catalogs, covering lots."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest

from gpucampaign.config import Package, SpecError, parse_spec
from gpucampaign.core.errors import ArgumentError
from gpucampaign.plan.tariffs import (
    BUILTIN_CATALOG,
    format_usd,
    load_catalog,
    packages_covering,
    resolve_package,
    usd,
)


def test_builtin_rtx4090_tariffs() -> None:
    prices = {lot.days: lot.price_usd for lot in BUILTIN_CATALOG.lots_of("rtx4090")}
    assert prices == {3: Decimal("47.14"), 7: Decimal("110"), 30: Decimal("390")}
    assert all(lot.gpus == 1 for lot in BUILTIN_CATALOG.lots_of("rtx4090"))


def test_b200_lot_has_two_gpus_and_no_invented_price() -> None:
    lots = BUILTIN_CATALOG.lots_of("b200")
    assert [lot.days for lot in lots] == [3, 7, 30]
    assert all(lot.gpus == 2 and lot.price_usd is None for lot in lots)


def test_two_three_day_lots_cost_exactly_94_28() -> None:
    r = resolve_package(Package(gpu="rtx4090", days=3, count=2), BUILTIN_CATALOG)
    assert r.total_usd == Decimal("94.28")
    assert usd(r.total_usd) == 94.28
    assert format_usd(r.total_usd) == "94.28 USD"
    assert r.lanes == 2


def test_b200_price_is_per_lot_not_per_gpu() -> None:
    r = resolve_package(Package(gpu="b200", days=7, price_usd=500), BUILTIN_CATALOG)
    assert (r.gpus_per_lot, r.lanes, r.total_usd, r.price_source) == (2, 2, Decimal("500"), "spec")


def test_b200_without_price_names_the_field_and_the_fix() -> None:
    with pytest.raises(SpecError) as err:
        resolve_package(Package(gpu="b200", days=3), BUILTIN_CATALOG, index=1)
    assert err.value.field == "packages[1].price_usd"
    assert "give price_usd" in str(err.value)


def test_unknown_gpu_and_unknown_duration() -> None:
    with pytest.raises(SpecError) as err:
        resolve_package(Package(gpu="a100", days=3), BUILTIN_CATALOG)
    assert err.value.field == "packages[0].gpu" and "rtx4090" in str(err.value)
    with pytest.raises(SpecError) as err:
        resolve_package(Package(gpu="rtx4090", days=5), BUILTIN_CATALOG)
    assert err.value.field == "packages[0].days" and "3, 7, 30" in str(err.value)


def test_user_catalog_adds_a_model_and_prices_a_b200_lot(tmp_path: Path) -> None:
    (tmp_path / "cat.yaml").write_text(
        "provider: MyCloud\n"
        "lots:\n"
        "  - {gpu: h100, days: 3, gpus: 8, price_usd: 999.99}\n"
        "  - {gpu: b200, days: 7, gpus: 2, price_usd: 1234.5}\n"
    )
    cat = load_catalog(tmp_path / "cat.yaml")
    h100 = cat.find("h100", 3)
    assert h100 is not None and h100.price_usd == Decimal("999.99") and h100.provider == "MyCloud"
    b200 = cat.find("b200", 7)
    assert b200 is not None and b200.price_usd == Decimal("1234.5")
    assert cat.find("rtx4090", 3) == BUILTIN_CATALOG.find("rtx4090", 3)
    # through the spec field 'catalog', relative to the spec's folder
    spec = parse_spec(
        {
            "name": "x",
            "catalog": "cat.yaml",
            "packages": [{"gpu": "h100", "days": 3}],
            "calendar": [{"name": "a", "kind": "human", "hours": 1}],
        }
    )
    assert load_catalog(spec=spec, base_dir=tmp_path).find("h100", 3) == h100


@pytest.mark.parametrize(
    "content",
    [
        "lots: [{gpu: h100, days: 3}]",
        "lots: [{gpu: h100, days: 3, gpus: 1, colour: red}]",
        "- 1",
        "a: [",
    ],
)
def test_invalid_user_catalog_is_a_spec_error(tmp_path: Path, content: str) -> None:
    (tmp_path / "cat.yaml").write_text(content)
    with pytest.raises(SpecError) as err:
        load_catalog(tmp_path / "cat.yaml")
    assert err.value.field == "catalog"


def test_catalog_path_escaping_the_folder_is_refused(tmp_path: Path) -> None:
    spec_dir = tmp_path / "campaign"
    spec_dir.mkdir()
    (tmp_path / "outside.yaml").write_text("lots: [{gpu: h100, days: 3, gpus: 1}]")
    (spec_dir / "link.yaml").symlink_to(tmp_path / "outside.yaml")
    spec = parse_spec(
        {
            "name": "x",
            "catalog": "link.yaml",
            "packages": [{"gpu": "rtx4090", "days": 3}],
            "calendar": [{"name": "a", "kind": "human", "hours": 1}],
        }
    )
    with pytest.raises(SpecError) as err:
        load_catalog(spec=spec, base_dir=spec_dir)
    assert err.value.field == "catalog"


def test_packages_covering_78_hours_cheapest_first() -> None:
    covers = packages_covering(78, gpu="rtx4090")
    listed = [(c.days, c.price_usd) for c in covers]
    assert listed[0] == ((3, 3), Decimal("94.28"))
    assert ((7,), Decimal("110")) in listed
    prices = [p for _, p in listed]
    assert prices == sorted(prices)
    assert "back to back" in covers[0].requires and "checkpoint" in covers[0].requires
    assert covers[1].requires.startswith("one 7-day rtx4090 lot")
    # minimal only: a 3-day lot plus a 7-day lot is not listed (the 7-day lot alone covers)
    assert (3, 7) not in [c.days for c in covers]
    assert all(c.total_hours >= 78 for c in covers)


def test_packages_covering_lists_unpriced_lots_last_with_a_note() -> None:
    covers = packages_covering(60)
    assert covers[0].days == (3,) and covers[0].price_usd == Decimal("47.14")
    unpriced = [c for c in covers if c.price_usd is None]
    assert unpriced and all(c.gpu == "b200" for c in unpriced)
    assert all("price not in catalog: give price_usd" in c.requires for c in unpriced)
    assert covers.index(unpriced[0]) > max(covers.index(c) for c in covers if c.price_usd)


def test_packages_covering_beyond_three_30_day_lots_is_empty() -> None:
    assert packages_covering(3 * 720 + 1, gpu="rtx4090") == []


@pytest.mark.parametrize("hours", [0, -3, float("nan"), float("inf")])
def test_packages_covering_refuses_bad_hours(hours: float) -> None:
    with pytest.raises(ArgumentError) as err:
        packages_covering(hours)
    assert err.value.field == "--hours"


def test_no_usd_per_hour_anywhere() -> None:
    text = json.dumps([c.to_dict() for c in packages_covering(78)]).lower()
    assert "per_hour" not in text and "/h" not in text and "per hour" not in text


def test_back_to_back_lots_say_they_need_the_state_moved_and_cost_the_recorded_restore() -> None:
    unknown = packages_covering(78, gpu="rtx4090")[0]
    assert "state (checkpoints and outputs) moved off each lot" in unknown.requires
    assert "restart from the last checkpoint on the new lot" in unknown.requires
    assert "restore whose time is not recorded yet" in unknown.requires
    measured = packages_covering(78, gpu="rtx4090", restore_s=4.2)[0]
    assert "1 switch(es), each costing the recorded restore time of 4.2 s" in measured.requires
    b200 = [c for c in packages_covering(60) if c.gpu == "b200"]
    assert b200 and all("neither is assumed" in c.requires for c in b200)
