"""Predictions of a user's recipe: ``predictions.csv`` written from the SAVED model, and the
reload check that rebuilds the model through the recipe in a fresh process and compares.

A recipe with ``predict(model, batch) -> list[dict]`` gives the rows; without it, each row is
one batch of the decision split with the recipe's ``evaluate`` on that batch. Either way the
file is made on CPU, in order, from the reloaded model, so a reload reproduces it byte for
byte. The built-in table recipes keep their classifier predictions (``predictions.py``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from gpucampaign.config import RunConfig
from gpucampaign.core.files import csv_text
from gpucampaign.folder.layout import (
    ERROR_ANALYSIS_FILE,
    PREDICTIONS_FILE,
    OutputFolder,
    corpus_file,
    model_config,
    read_manifest,
    run_relpath,
)
from gpucampaign.modelfolder.saveload import load_run_model
from gpucampaign.recipe.contract import (
    Pinned,
    Recipe,
    RecipeError,
    call,
    check_metrics,
    load_recipe,
)
from gpucampaign.recipe.runtime import (
    batch_len,
    build_datasets,
    example_ids,
    ordered_loader,
    recipe_context,
)


def _has_predict(recipe: Recipe) -> bool:
    return type(recipe).predict is not Recipe.predict


def recipe_predict_rows(
    recipe: Recipe, model: Any, dataset: Any, *, config: RunConfig
) -> list[dict[str, Any]]:
    """The recipe's ``predict`` rows for one split, each keyed by its example's ID first.

    The ID is the dataset's ``ids`` when it has one per example (as in ``scores-<split>.csv``),
    else the row's own ``id``, else the position in the split. CPU, batches in order, no
    gradient.

    Raises:
        RecipeError: ``predict`` returns another number of rows than a batch holds.
    """
    ids = example_ids(dataset)
    own_ids = getattr(dataset, "ids", None) is not None and len(ids) == len(dataset)
    rows: list[dict[str, Any]] = []
    model.eval()
    name = config.recipe
    with torch.no_grad():
        for batch in ordered_loader(recipe, dataset, config=config):
            got = [dict(r) for r in call(name, "predict", recipe.predict, model, batch)]
            if len(got) != batch_len(batch):
                raise RecipeError(
                    name,
                    "predict()",
                    f"returned {len(got)} rows for a batch of {batch_len(batch)} examples; "
                    "return one row (a dict) per example",
                )
            for row in got:
                n = len(rows)
                key = ids[n] if own_ids or "id" not in row else str(row["id"])
                rows.append({"id": key, **{k: v for k, v in row.items() if k != "id"}})
    return rows


def prediction_rows(
    recipe: Recipe, model: Any, dataset: Any, *, config: RunConfig
) -> list[dict[str, Any]]:
    """The rows of ``predictions.csv`` for one split, on CPU, batches in order, no gradient:
    the recipe's ``predict`` keyed by example ID, else its ``evaluate`` of each batch."""
    if _has_predict(recipe):
        return recipe_predict_rows(recipe, model, dataset, config=config)
    rows: list[dict[str, Any]] = []
    loader = ordered_loader(recipe, dataset, config=config)
    model.eval()
    name = config.recipe
    with torch.no_grad():
        for i, batch in enumerate(loader):
            metrics = check_metrics(
                name, call(name, "evaluate", recipe.evaluate, model, [batch]), need=None
            )
            rows.append({"batch": i, "rows": batch_len(batch), **metrics})
    return rows


def _model_and_data(
    root: str | Path, run_id: str, *, corpus: Any, split: str, trust_folder_code: bool = False
) -> tuple[Recipe, Any, Any, RunConfig]:
    """The reloaded model, its recipe, the split's dataset and the run config (the recipe's
    copy in the folder imported only with ``trust_folder_code``)."""

    folder = OutputFolder(root)
    info = json.loads(folder.path(model_config(run_id)).read_text("utf-8"))
    config = RunConfig.model_validate(info["run_config"])
    # Checks the recipe file's hash; the folder's copy goes on sys.path only when trusted.
    model = load_run_model(root, run_id, trust_folder_code=trust_folder_code)
    recipe = load_recipe(config.recipe)
    pinned = corpus_for(root, info, corpus)
    ctx = recipe_context(config, corpus=pinned, run_id=run_id, device=torch.device("cpu"))
    datasets = build_datasets(recipe, config, ctx)
    return recipe, model, datasets.get(split) or datasets["train"], config


def corpus_for(root: str | Path, info: dict[str, Any], corpus: Any) -> Any:
    """The corpus given, else the manifest's copy, else the path the model recorded."""
    if corpus is not None:
        return corpus
    recorded = info.get("corpus") or {}
    try:
        ref = read_manifest(root).get("corpus")
    except (OSError, ValueError):
        ref = None
    path = corpus_file(root, ref) if ref else Path(recorded.get("path") or ".")
    inputs = {
        name: Pinned(path=Path(p["path"]), sha256=p["sha256"], kind=p.get("kind", "file"))
        for name, p in (info.get("inputs") or {}).items()
    }
    return Pinned(
        path=path,
        sha256=recorded.get("sha256", ""),
        kind=recorded.get("kind", "file"),
        inputs=inputs,
    )


def write_recipe_predictions(
    root: str | Path, run_id: str, *, corpus: Any, split: str
) -> list[dict[str, Any]]:
    """Write ``runs/<run_id>/predictions.csv`` from the saved model; its rows."""
    recipe, model, dataset, config = _model_and_data(root, run_id, corpus=corpus, split=split)
    rows = prediction_rows(recipe, model, dataset, config=config)
    OutputFolder(root).write_text(run_relpath(run_id, PREDICTIONS_FILE), csv_text(rows))
    return rows


def recorded_split(root: str | Path, run_id: str) -> str:
    """The split a recipe run's ``predictions.csv`` holds, as ``error_analysis.json`` recorded
    it when the file was written (``test`` without one)."""
    analysis = OutputFolder(root).path(run_relpath(run_id, ERROR_ANALYSIS_FILE))
    if not analysis.is_file():
        return "test"
    return str(json.loads(analysis.read_text(encoding="utf-8")).get("split", "test"))


def recipe_reload_check(
    root: str | Path, run_id: str, *, corpus: Any = None, trust_folder_code: bool = False
) -> dict[str, Any]:
    """Rebuild the model through its recipe, predict again, compare with the file exactly.

    The split is the one ``error_analysis.json`` recorded when the file was written. The
    recipe is imported as installed or from a spec's folder; the copy kept in the model folder
    only with ``trust_folder_code`` (``modelfolder.RecipeCodeNotTrusted`` otherwise).
    """
    folder = OutputFolder(root)
    expected = folder.path(run_relpath(run_id, PREDICTIONS_FILE)).read_text(encoding="utf-8")
    split = recorded_split(root, run_id)
    recipe, model, dataset, config = _model_and_data(
        root, run_id, corpus=corpus, split=split, trust_folder_code=trust_folder_code
    )
    got = csv_text(prediction_rows(recipe, model, dataset, config=config))
    want_lines, got_lines = expected.splitlines(), got.splitlines()
    bad = [
        n
        for n in range(max(len(want_lines), len(got_lines)))
        if n >= len(want_lines) or n >= len(got_lines) or want_lines[n] != got_lines[n]
    ]
    first = None
    if bad:
        n = bad[0]
        first = {
            "line": n + 1,
            "expected": want_lines[n] if n < len(want_lines) else None,
            "got": got_lines[n] if n < len(got_lines) else None,
        }
    return {
        "ok": not bad,
        "rows": max(0, len(want_lines) - 1),
        "mismatches": len(bad),
        "first_mismatch": first,
        "error": None,
    }
