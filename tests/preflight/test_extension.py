"""Which spec changes extend a campaign in place (more seeds, more variants) and which make
another campaign (``preflight.extension.extension_of``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpucampaign.cli.scaffold import init_campaign
from gpucampaign.config import CampaignSpec, load_spec, parse_spec
from gpucampaign.preflight.extension import extension_of


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[CampaignSpec, dict[str, Any]]:
    path = init_campaign(tmp_path_factory.mktemp("p") / "d")
    return load_spec(path), yaml.safe_load(path.read_text())


def _edit(data: dict[str, Any], **changes: Any) -> CampaignSpec:
    return parse_spec({**data, **changes})


def test_more_seeds_and_a_new_variant_extend_the_campaign(demo):
    spec, data = demo
    seeded = _edit(data, control={**data["control"], "seeds": [0, 4]})
    assert extension_of(spec, seeded) == "extended in place: added seeds 4 of 'control'"
    variants = [*data["variants"], {"name": "wide", "changes": {"hidden": [256]}}]
    assert extension_of(spec, _edit(data, variants=variants)) == (
        "extended in place: added variant 'wide'"
    )
    # Extended twice: the second from the first.
    more = _edit(data, control={**data["control"], "seeds": [0, 4, 5]})
    assert extension_of(seeded, more) == "extended in place: added seeds 5 of 'control'"


@pytest.mark.parametrize(
    "change",
    [
        {"control": "lr"},  # a changed factor
        {"control": "first-seed"},  # the run itself would change
        {"variants": "reordered"},
        {"decision_rule": "min_gain"},
        {},  # nothing added
    ],
    ids=["lr", "first-seed", "reordered", "rule", "same"],
)
def test_any_other_change_is_another_campaign(demo, change):
    spec, data = demo
    edit: dict[str, Any] = {}
    if change.get("control") == "lr":
        edit["control"] = {**data["control"], "lr": 0.002, "seeds": [0, 1]}
    if change.get("control") == "first-seed":
        edit["control"] = {**data["control"], "seeds": [1, 2]}
    if change.get("variants"):
        edit["variants"] = list(reversed(data["variants"]))
    if change.get("decision_rule"):
        edit["decision_rule"] = {**data["decision_rule"], "min_gain": 0.01}
    assert extension_of(spec, _edit(data, **edit)) is None


def test_a_campaign_extended_in_place_is_opened_for_its_folder(tmp_path: Path):
    from gpucampaign.preflight import open_campaign, start_folder

    path = init_campaign(tmp_path / "d")
    out = tmp_path / "out"
    start_folder(open_campaign(path, out))
    (out / "plan.json").write_text("{}")
    data = yaml.safe_load(path.read_text())
    data["control"]["seeds"] = [0, 1]
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    opened = open_campaign(path, out)
    assert opened.extends == "extended in place: added seeds 1 of 'control'"
    start_folder(opened)
    assert (out / "spec.yaml").read_bytes() == path.read_bytes()
    assert (out / "specs" / "plan-1.json").read_text() == "{}"
    assert not (out / "plan.json").exists()
    # Opened again, it is the same campaign: nothing more is kept.
    again = open_campaign(path, out)
    assert again.extends is None
    start_folder(again)
    assert len((out / "spec-history.jsonl").read_text().splitlines()) == 1
