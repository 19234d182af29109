"""A user's recipe run reloads and predicts like ``load_from_checkpoint`` / ``pyfunc``:
``predictions.csv`` keyed by the dataset's IDs, an error analysis from the predicted rows (a
classifier's per-class table and confusion figure; a regressor's residuals and worst IDs), and
``campaign predict`` on new input giving exactly the recipe's own ``predict``."""

from __future__ import annotations

import csv
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import gpucampaign
from gpucampaign.cli import app
from gpucampaign.close.error_analysis import rows_analysis
from tests.helpers.recipefolder import build_recipe_folder, write_images


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return build_recipe_folder(tmp_path_factory.mktemp("images"), "images")


@pytest.mark.slow
def test_predictions_csv_is_keyed_by_the_datasets_ids(images: dict) -> None:
    out, rid = images["out"], images["run_ids"]["control"]
    rows = _rows(out / "runs" / rid / "predictions.csv")
    files = sorted((images["src"] / "data" / "images").rglob("*.png"), key=lambda p: p.stem)
    test_ids = [p.stem for n, p in enumerate(files) if n % 5 == 4]
    assert [r["id"] for r in rows] == test_ids
    assert list(rows[0]) == ["id", "label", "prediction", "confidence"]


@pytest.mark.slow
def test_a_recipe_classifier_gets_per_class_tables_and_a_confusion_figure(images: dict) -> None:
    out, rid = images["out"], images["run_ids"]["control"]
    rows = _rows(out / "runs" / rid / "predictions.csv")
    analysis = json.loads((out / "runs" / rid / "error_analysis.json").read_text())
    assert analysis["task"] == "classification" and analysis["n"] == len(rows)
    assert sum(map(sum, analysis["confusion"])) == len(rows)
    for c in analysis["per_class"]:
        true = [r for r in rows if r["label"] == c["class"]]
        assert c["support"] == len(true)
        hits = sum(r["prediction"] == c["class"] for r in true)
        assert c["recall"] == (hits / len(true) if true else None)
    assert (out / "figures" / "confusion.png").is_file()
    assert "| class | support | precision | recall |" in (out / "report.md").read_text()


def _own_predict(src: Path, module: str, cls: str, *, weights: Path, data: Path) -> list[dict]:
    """The recipe's own predict on ``data``, called by hand: every split in order, by IDs."""
    from safetensors.torch import load_file

    sys.path.insert(0, str(src))
    recipe = getattr(importlib.import_module(module), cls)()
    model = torch.nn.Linear(64, 2)
    model.load_state_dict(load_file(str(weights)))
    model.eval()
    ctx = type("Ctx", (), {"corpus": type("C", (), {"path": data})()})()
    rows = []
    for split, ds in recipe.datasets(ctx).items():
        loader = torch.utils.data.DataLoader(ds, batch_size=4, shuffle=False)
        got = [r for b in loader for r in recipe.predict(model, b)]
        rows += [{"id": i, "split": split, **r} for i, r in zip(ds.ids, got, strict=True)]
    return rows


@pytest.mark.slow
def test_campaign_predict_on_new_input_is_the_recipes_own_predict(
    images: dict, tmp_path: Path
) -> None:
    out, rid = images["out"], images["run_ids"]["control"]
    new = write_images(tmp_path / "new", n=10, seed=7)
    to = tmp_path / "new.csv"
    done = CliRunner().invoke(
        app, ["predict", str(out), "control", "--input", str(new), "--to", str(to)]
    )
    assert done.exit_code == 0, done.output
    got = _rows(to)
    module, cls = images["spec"].control.recipe.split(":")
    want = _own_predict(
        images["src"],
        module,
        cls,
        weights=out / "runs" / rid / "model" / "model.safetensors",
        data=new,
    )
    assert [r["id"] for r in got] == [r["id"] for r in want] and len(got) == 10
    for g, w in zip(got, want, strict=True):
        assert (g["split"], int(g["label"]), int(g["prediction"])) == (
            w["split"],
            w["label"],
            w["prediction"],
        )
        assert float(g["confidence"]) == w["confidence"]
    loaded = gpucampaign.load_model(out, "control")
    assert loaded.run_id == rid and loaded.recipe.__class__.__name__ == cls
    assert [r["id"] for r in loaded.predict(new)] == [r["id"] for r in want]


@pytest.mark.slow
@pytest.mark.process
def test_predict_runs_no_folder_code_unless_trusted(images: dict, tmp_path: Path) -> None:
    """Without the spec's folder on the path, the recipe's only code is the folder's copy: the
    command refuses (exit 2, saying how to trust it) until --trust-folder-code."""
    out = images["out"]
    base = [sys.executable, "-P", "-m", "gpucampaign.cli", "predict", str(out), "control"]
    env = {k: v for k, v in os.environ.items()}
    refused = subprocess.run(
        [*base, "--to", str(tmp_path / "a.csv")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert refused.returncode == 2, refused.stderr
    assert "--trust-folder-code" in refused.stderr and "Traceback" not in refused.stderr
    assert not (tmp_path / "a.csv").exists()
    trusted = subprocess.run(
        [*base, "--to", str(tmp_path / "b.csv"), "--trust-folder-code"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert trusted.returncode == 0, trusted.stderr
    assert _rows(tmp_path / "b.csv") == _rows(
        out / "runs" / images["run_ids"]["control"] / "predictions.csv"
    )


def test_a_classifier_from_rows_has_precision_recall_and_confusion() -> None:
    rows = [
        {"id": "a", "label": "cat", "prediction": "cat", "confidence": 0.9},
        {"id": "b", "label": "cat", "prediction": "dog", "confidence": 0.8},
        {"id": "c", "label": "dog", "prediction": "dog", "confidence": 0.7},
        {"id": "d", "label": "dog", "prediction": "dog", "confidence": 0.6},
    ]
    a = rows_analysis(rows, split="test")
    assert a["task"] == "classification" and a["classes"] == ["cat", "dog"]
    assert a["confusion"] == [[1, 1], [0, 2]]
    cat, dog = a["per_class"]
    assert (cat["precision"], cat["recall"]) == (1.0, 0.5)
    assert (dog["precision"], dog["recall"]) == (2 / 3, 1.0)
    assert a["most_confident_errors"] == [
        {"id": "b", "label": "cat", "prediction": "dog", "confidence": 0.8}
    ]


def test_a_regressor_from_rows_has_residuals_and_the_worst_ids() -> None:
    rows = [
        {"id": f"r{i}", "target": float(i), "prediction": float(i) + (i % 3) * 0.5}
        for i in range(9)
    ]
    rows[4]["prediction"] = 10.0
    a = rows_analysis(rows, split="test", top_k=2)
    assert a["task"] == "regression" and a["n"] == 9
    assert [w["id"] for w in a["worst"]] == ["r4", "r2"] and a["worst"][0]["residual"] == 6.0
    assert sum(a["residual"]["histogram"]["counts"]) == 9
    assert a["residual"]["quantiles"]["1"] == 6.0


@pytest.mark.slow
def test_a_builtin_model_predicts_a_new_table_by_row_id(
    closed: dict, out: Path, tmp_path: Path
) -> None:
    """The built-in mlp reads new rows of the corpus's kind (a feature table): its classes and
    confidences by row ID, the same as predictions.csv for the rows the campaign predicted.
    (``out``: a private copy of the session's closed folder, ``closed``.)"""
    rid = closed["run_ids"]["control"]
    to = tmp_path / "table.csv"
    table = closed["out"].parent / "src" / "corpus.csv"  # the corpus the folder was built on
    done = CliRunner().invoke(
        app, ["predict", str(out), rid, "--input", str(table), "--to", str(to), "--split", "test"]
    )
    assert done.exit_code == 0, done.output
    got = {r["id"]: r for r in _rows(to)}
    kept = _rows(out / "runs" / rid / "predictions.csv")
    assert list(got) == [r["id"] for r in kept]
    for r in kept:
        assert got[r["id"]]["prediction"] == r["prediction"]
        assert float(got[r["id"]]["confidence"]) == float(r["confidence"])
