"""`campaign schema | plan | packages`: exact numbers, exit codes, clear invalid-input messages."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gpucampaign.cli import app

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
runner = CliRunner()
MINIMAL = """\
name: example
packages: [{gpu: rtx4090, days: 3, count: 1}]
window_hours: 72
people: 1
calendar:
  - {name: prep, kind: human, hours: 6}
  - {name: load, kind: machine, resource: cpu, hours: 1, after: [prep]}
  - {name: control, kind: machine, resource: gpu, hours: 10, after: [load], tier: essential}
"""


def plan_json(path: Path) -> tuple[int, dict]:
    result = runner.invoke(app, ["plan", str(path), "--json"])
    return result.exit_code, json.loads(result.stdout)


def test_48h_example_exact_numbers() -> None:
    code, d = plan_json(EXAMPLES / "calendar-48h.yaml")
    assert code == 0
    assert {
        k: d[k]
        for k in ("span_hours", "window_hours", "uncommitted_hours", "overrun_hours", "fits")
    } == {
        "span_hours": 48,
        "window_hours": 72,
        "uncommitted_hours": 24,
        "overrun_hours": 0,
        "fits": True,
    }
    assert d["total_price_usd"] == 47.14 and d["options"] == [] and d["warnings"] == []
    assert d["packages"] == [
        {
            "gpu": "rtx4090",
            "days": 3,
            "gpus": 1,
            "count": 1,
            "price_usd": 47.14,
            "total_usd": 47.14,
            "price_source": "catalog",
        }
    ]
    step = d["steps"][0]
    assert set(step) >= {
        "name",
        "kind",
        "resource",
        "tier",
        "lane",
        "start_hours",
        "end_hours",
        "run",
    }
    assert d["machine_hours"] + d["human_hours"] == 48


def test_78h_example_exact_numbers_and_options() -> None:
    code, d = plan_json(EXAMPLES / "calendar-78h.yaml")
    assert code == 4
    assert (d["span_hours"], d["overrun_hours"], d["uncommitted_hours"], d["fits"]) == (
        78,
        6,
        0,
        False,
    )
    larger = next(o for o in d["options"] if o["kind"] == "larger_package")
    assert larger["total_price_usd"] == 110 and larger["fits"] and "7-day" in larger["description"]
    smaller = next(o for o in d["options"] if o["kind"] == "smaller_protocol")
    assert smaller["dropped"] == ["variant-long"] and smaller["fits"]
    for o in d["options"]:
        assert set(o) >= {
            "kind",
            "description",
            "span_hours",
            "total_price_usd",
            "fits",
            "dropped",
            "requires",
        }
    assert "no state to move between lots" in larger["requires"]
    assert "stays open" in smaller["requires"]


def test_no_usd_per_hour_in_the_plan() -> None:
    _, d = plan_json(EXAMPLES / "calendar-78h.yaml")
    text = json.dumps(d).lower()
    assert "per_hour" not in text and "usd/h" not in text and "per hour" not in text


def test_two_lots_example() -> None:
    code, d = plan_json(EXAMPLES / "two-lots.yaml")
    assert code == 0 and d["total_price_usd"] == 94.28 and d["gpu_lanes"] == 2


def test_minimal_contract_shape(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text(MINIMAL)
    code, d = plan_json(tmp_path / "c.yaml")
    assert code == 0 and d["span_hours"] == 17 and d["uncommitted_hours"] == 55
    # a GPU calendar without validation, outputs or checkpoints is warned about, not refused
    assert any("no validation step" in w for w in d["warnings"])


def test_table_and_figure(tmp_path: Path) -> None:
    png = tmp_path / "fig" / "gantt.png"
    result = runner.invoke(app, ["plan", str(EXAMPLES / "calendar-78h.yaml"), "--figure", str(png)])
    assert result.exit_code == 4
    assert "78 h" in result.stdout and "larger_package" in result.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_schema() -> None:
    result = runner.invoke(app, ["schema"])
    schema = json.loads(result.stdout)
    assert result.exit_code == 0
    assert {"name", "packages", "window_hours", "calendar"} <= set(schema["properties"])
    assert schema["additionalProperties"] is False


def test_packages_command() -> None:
    result = runner.invoke(app, ["packages", "--hours", "78", "--gpu", "rtx4090", "--json"])
    assert result.exit_code == 0
    covers = json.loads(result.stdout)["covers"]
    assert [c["price_usd"] for c in covers] == sorted(c["price_usd"] for c in covers)
    assert {"lots": [{"days": 7}], "price_usd": 110.0}.items() <= {
        k: v for c in covers for k, v in c.items() if c["lots"] == [{"days": 7}]
    }.items()
    assert covers[0]["price_usd"] == 94.28
    table = runner.invoke(app, ["packages", "--hours", "78"])
    assert table.exit_code == 0 and "94.28 USD" in table.stdout


def test_packages_nothing_covers() -> None:
    assert runner.invoke(app, ["packages", "--hours", "5000", "--gpu", "rtx4090"]).exit_code == 4


@pytest.mark.parametrize(
    ("args", "field"), [(["--hours", "0"], "--hours"), (["--hours", "5", "--gpu", "a100"], "--gpu")]
)
def test_packages_invalid(args: list[str], field: str) -> None:
    result = runner.invoke(app, ["packages", *args])
    assert result.exit_code == 2 and field in result.stderr and "Traceback" not in result.output


# --- every invalid-input class: exit 2, the field named, no traceback -------------------------

BASE = yaml.safe_load(MINIMAL)


def _with(**changes: object) -> dict:
    return {**BASE, **changes}


def _cal(*steps: dict) -> list[dict]:
    return [dict(s) for s in steps]


INVALID = {
    "unknown key": (_with(colour="red"), "colour"),
    "unknown step key": (
        _with(calendar=_cal({"name": "a", "kind": "human", "hours": 1, "hourz": 2})),
        "calendar[0].hourz",
    ),
    "negative hours": (
        _with(calendar=_cal({"name": "a", "kind": "human", "hours": -1})),
        "calendar[0].hours",
    ),
    "zero hours": (
        _with(calendar=_cal({"name": "a", "kind": "human", "hours": 0})),
        "calendar[0].hours",
    ),
    "infinite hours": (
        _with(calendar=_cal({"name": "a", "kind": "human", "hours": float("inf")})),
        "calendar[0].hours",
    ),
    "unknown step in after": (
        _with(calendar=_cal({"name": "a", "kind": "human", "hours": 1, "after": ["ghost"]})),
        "calendar",
    ),
    "cycle": (
        _with(
            calendar=_cal(
                {"name": "a", "kind": "human", "hours": 1, "after": ["b"]},
                {"name": "b", "kind": "human", "hours": 1, "after": ["a"]},
            )
        ),
        "calendar",
    ),
    "duplicate names": (
        _with(
            calendar=_cal(
                {"name": "a", "kind": "human", "hours": 1},
                {"name": "a", "kind": "human", "hours": 2},
            )
        ),
        "calendar",
    ),
    "unknown gpu": (_with(packages=[{"gpu": "a100", "days": 3}]), "packages[0].gpu"),
    "unknown duration": (_with(packages=[{"gpu": "rtx4090", "days": 5}]), "packages[0].days"),
    "lot without a known price": (
        _with(packages=[{"gpu": "b200", "days": 3}]),
        "packages[0].price_usd",
    ),
    "window shorter than every lot": (_with(window_hours=48), "window_hours"),
    "catalog escaping the folder": (_with(catalog="../tariffs.yaml"), "catalog"),
    "absolute catalog path": (_with(catalog="/etc/passwd"), "catalog"),
    "missing catalog file": (_with(catalog="nope.yaml"), "catalog"),
    "human step with a resource": (
        _with(calendar=_cal({"name": "a", "kind": "human", "resource": "gpu", "hours": 1})),
        "calendar[0]",
    ),
    "no packages": (_with(packages=[]), "packages"),
}


FIX_VERBS = ("fix", "give", "use ", "remove", "set ", "add ", "keep ")


@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_input(tmp_path: Path, case: str) -> None:
    data, field = INVALID[case]
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(data))
    for args in (["plan", str(spec)], ["plan", str(spec), "--json"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (case, result.output)
        assert result.stdout == ""
        message = result.stderr
        assert field in message, (case, message)
        assert "Traceback" not in result.output
        assert "\n" not in message.strip(), "one paragraph"
        assert any(verb in message.lower() for verb in FIX_VERBS), (case, message)


def test_missing_spec_file(tmp_path: Path) -> None:
    result = runner.invoke(app, ["plan", str(tmp_path / "absent.yaml")])
    assert result.exit_code == 2 and "does not exist" in result.stderr


@pytest.mark.process
def test_installed_entry_point_runs_the_example() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpucampaign.cli",
            "plan",
            str(EXAMPLES / "calendar-48h.yaml"),
            "--json",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["uncommitted_hours"] == 24
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpucampaign.cli",
            "plan",
            str(EXAMPLES / "calendar-48h.yaml"),
            "--jsn",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_calibrate_from_an_earlier_campaign_replaces_the_run_steps_hours(tmp_path: Path) -> None:
    """`plan --calibrate-from OUT`: step time x planned steps + load + evals + saves, per run."""
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    pilot = {
        "batch_size": 64,
        "n_train": 1000,
        "load_s": 36.0,
        "step_s": 0.5,
        "eval_s": 9.0,
        "evals": 20,
        "save_s": 18.0,
        "saves": 10,
        "planned_steps": 320,
    }
    (earlier / "estimates.json").write_text(
        json.dumps(
            {
                "campaign_id": "old-1",
                "measured": {
                    "load_s": 36.0,
                    "step_s": 1.0,
                    "eval_s": 9.0,
                    "save_s": 18.0,
                    "restore_s": None,
                },
                "pilot": {"control": pilot},
            }
        )
    )
    spec = EXAMPLES / "digits" / "campaign.yaml"
    result = runner.invoke(app, ["plan", str(spec), "--json", "--calibrate-from", str(earlier)])
    d = json.loads(result.stdout)
    hours = {s["name"]: s["hours"] for s in d["steps"]}
    data = yaml.safe_load(spec.read_text())
    n_train = 1259  # the digits corpus's train split, read from the spec's corpus
    steps = data["control"]["epochs"] * -(-n_train // 64)
    expected = (36.0 + steps * 1.0 + 20 * 9.0 + 10 * 18.0) / 3600
    assert hours["train-control"] == pytest.approx(expected, rel=1e-3)
    assert hours["train-short"] == pytest.approx(
        (36.0 + 8 * -(-n_train // 64) * 1.0 + 20 * 9.0 + 10 * 18.0) / 3600, rel=1e-3
    )
    assert hours["prepare"] == 1  # steps that train no run keep their hours
    assert "old-1" in d["calibrated"]["train-control"]

    missing = runner.invoke(app, ["plan", str(spec), "--calibrate-from", str(tmp_path / "none")])
    assert missing.exit_code == 2 and "estimates.json" in missing.output
