"""The campaign spec: the minimal planning contract, defaults, schema, and refused input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpucampaign.config import CampaignSpec, SpecError, load_spec, parse_spec, resolve_inside

MINIMAL: dict[str, Any] = {
    "name": "example",
    "packages": [{"gpu": "rtx4090", "days": 3, "count": 1}],
    "window_hours": 72,
    "people": 1,
    "calendar": [
        {"name": "prep", "kind": "human", "hours": 6},
        {"name": "load", "kind": "machine", "resource": "cpu", "hours": 1, "after": ["prep"]},
        {
            "name": "control",
            "kind": "machine",
            "resource": "gpu",
            "hours": 10,
            "after": ["load"],
            "tier": "essential",
        },
    ],
}


def test_minimal_contract_shape_parses() -> None:
    spec = parse_spec(MINIMAL)
    assert spec.window == 72 and spec.people == 1
    assert [s.name for s in spec.calendar] == ["prep", "load", "control"]
    assert spec.control is None and spec.variants == ()


def test_defaults() -> None:
    data = {
        "name": "x",
        "packages": [{"gpu": "RTX4090", "days": 7}],
        "calendar": [
            {"name": "a", "kind": "machine", "hours": 1},
            {"name": "b", "kind": "human", "hours": 2},
        ],
    }
    spec = parse_spec(data)
    assert spec.window == 168  # the shortest committed lot
    assert spec.packages[0].gpu == "rtx4090" and spec.packages[0].count == 1
    assert spec.packages[0].price_usd is None  # taken from the catalog later
    a, b = spec.calendar
    assert (a.resource, a.tier, a.after) == ("none", "essential", ())
    assert b.resource is None and spec.people == 1


def test_every_field_of_the_schema_has_a_description() -> None:
    schema = CampaignSpec.model_json_schema()
    models = [schema, *schema["$defs"].values()]
    missing = [
        f"{m.get('title')}.{name}"
        for m in models
        for name, prop in m.get("properties", {}).items()
        if not prop.get("description")
    ]
    assert missing == []


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"extra": 1}, "extra"),
        ({"packages": []}, "packages"),
        ({"people": 0}, "people"),
        ({"window_hours": -5}, "window_hours"),
        ({"catalog": "../up.yaml"}, "catalog"),
        ({"gpu_lock": {"name": "gpu/host1"}}, "gpu_lock.name"),
        ({"calendar": [{"name": "a b", "kind": "human", "hours": 1}]}, "calendar[0].name"),
        ({"calendar": [{"name": "a", "kind": "robot", "hours": 1}]}, "calendar[0].kind"),
        (
            {"calendar": [{"name": "a", "kind": "human", "hours": 1, "tier": "nice"}]},
            "calendar[0].tier",
        ),
    ],
)
def test_invalid_spec_names_the_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec({**MINIMAL, **change})
    assert err.value.field == field
    assert field in str(err.value)


def test_a_gpu_limit_per_host_is_named_gpu_colon_host() -> None:
    assert parse_spec({**MINIMAL, "gpu_lock": {"name": "gpu:node-7"}}).gpu_lock.name == "gpu:node-7"


def test_variants_are_checked_against_the_control() -> None:
    with pytest.raises(SpecError, match="add 'control'"):
        parse_spec({**MINIMAL, "variants": [{"name": "v", "changes": {"lr": 0.1}}]})
    with pytest.raises(SpecError, match="unknown run setting"):
        parse_spec(
            {**MINIMAL, "control": {}, "variants": [{"name": "v", "changes": {"colour": 1}}]}
        )
    spec = parse_spec(
        {**MINIMAL, "control": {"lr": 0.001}, "variants": [{"name": "v", "changes": {"lr": 0.01}}]}
    )
    assert (
        spec.run_config("v").lr == 0.01
        and spec.resolve_run("v").run_id != spec.resolve_run("control").run_id
    )


def test_load_spec_errors(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="does not exist"):
        load_spec(tmp_path / "absent.yaml")
    (tmp_path / "bad.yaml").write_text("name: [unclosed")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(tmp_path / "bad.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(SpecError, match="mapping"):
        load_spec(tmp_path / "list.yaml")


def test_resolve_inside(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    assert (
        resolve_inside(tmp_path, "sub/file.yaml", field="f")
        == (tmp_path / "sub" / "file.yaml").resolve()
    )
    for bad in ("../x", "/etc/passwd", "sub/../../x"):
        with pytest.raises(SpecError) as err:
            resolve_inside(tmp_path, bad, field="catalog")
        assert err.value.field == "catalog"
