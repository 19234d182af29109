"""`campaign plan` with a data-parallel run (``gpus: 2``): it needs two GPUs of ONE machine."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from gpucampaign.cli import app

runner = CliRunner()


def spec_file(tmp_path: Path, packages: list[dict]) -> Path:
    data = {
        "name": "ddp",
        "packages": packages,
        "people": 1,
        "control": {"recipe": "mlp", "gpus": 2},
        "variants": [{"name": "wider", "changes": {"hidden": [128], "gpus": 1}}],
        "calendar": [
            {"name": "prep", "kind": "human", "hours": 2},
            {
                "name": "train-control",
                "kind": "machine",
                "resource": "gpu",
                "hours": 10,
                "run": "control",
                "after": ["prep"],
            },
            {
                "name": "train-wider",
                "kind": "machine",
                "resource": "gpu",
                "hours": 4,
                "run": "wider",
                "after": ["prep"],
                "tier": "useful",
            },
            {
                "name": "eval",
                "kind": "machine",
                "resource": "gpu",
                "hours": 1,
                "after": ["train-control"],
            },
        ],
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_two_separate_4090_lots_cannot_run_a_two_gpu_run(tmp_path: Path) -> None:
    path = spec_file(tmp_path, [{"gpu": "rtx4090", "days": 3, "count": 2}])
    result = runner.invoke(app, ["plan", str(path)])
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert "train-control" in text and "gpus: 2" in text
    assert "ONE machine" in text and "do not span them" in text


def test_a_b200_lot_runs_it_on_both_gpus(tmp_path: Path) -> None:
    path = spec_file(tmp_path, [{"gpu": "b200", "days": 3, "price_usd": 900}])
    result = runner.invoke(app, ["plan", str(path), "--json"])
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    steps = {s["name"]: s for s in d["steps"]}
    assert steps["train-control"]["lane"] == "gpu0+gpu1"
    # Nothing else runs on those GPUs meanwhile: the 1-GPU run waits or runs beside it.
    control, wider = steps["train-control"], steps["train-wider"]
    assert (
        control["start_hours"] >= wider["end_hours"] or wider["start_hours"] >= control["end_hours"]
    )
    # The essential 2-GPU run first, then the 1-GPU steps side by side on its two GPUs.
    assert control["start_hours"] == 2 and wider["start_hours"] == steps["eval"]["start_hours"]
    assert {wider["lane"], steps["eval"]["lane"]} == {"gpu0", "gpu1"}
    assert d["fits"] and d["span_hours"] == 2 + 10 + 4


def test_a_b200_lot_beside_a_4090_lot_places_it_on_the_b200(tmp_path: Path) -> None:
    path = spec_file(
        tmp_path, [{"gpu": "rtx4090", "days": 3}, {"gpu": "b200", "days": 3, "price_usd": 900}]
    )
    result = runner.invoke(app, ["plan", str(path), "--json"])
    assert result.exit_code == 0, result.output
    steps = {s["name"]: s for s in json.loads(result.stdout)["steps"]}
    assert steps["train-control"]["lane"] == "gpu1+gpu2"  # the b200's two lanes
    assert steps["train-wider"]["lane"] == "gpu0"  # the 4090, at the same time
    assert steps["train-wider"]["start_hours"] == steps["train-control"]["start_hours"] == 2
