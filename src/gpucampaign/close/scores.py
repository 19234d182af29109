"""Per-example scores: what the verdict's paired interval is computed from for a metric that is a
mean over examples (accuracy, loss, mse, mae, per-token loss).

A recipe's ``score(model, batch)`` gives one value per example; the close calls it with each
run's SAVED model on CPU, on the selection and the report splits, and keeps the values in
``runs/<run_id>/scores-<split>.csv`` (``id`` then one column per metric). A recipe without
``score`` has no such file, and the verdict says what its intervals lack.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gpucampaign.config import RunConfig
from gpucampaign.core.files import csv_text
from gpucampaign.folder.layout import OutputFolder, run_relpath, scores_file
from gpucampaign.modelfolder import load_run_model
from gpucampaign.recipe.contract import RecipeError, has_score, load_recipe
from gpucampaign.recipe.runtime import build_datasets, recipe_context, score_split


@dataclass(frozen=True)
class Scores:
    """One run's per-example scores on one split: ``values[metric][i]`` is example ``ids[i]``'s;
    ``seed``: the training seed of the replicate that scored them (None when not known)."""

    ids: tuple[str, ...]
    values: Mapping[str, tuple[float, ...]]
    seed: int | None = None

    def mean(self, metric: str) -> float | None:
        """The metric over the split (the mean of its per-example values); None without it."""
        got = self.values.get(metric)
        if not got:
            return None
        return round(math.fsum(got) / len(got), 12)


def no_scores_reason(config: RunConfig, *, metric: str) -> str:
    """Why a run has no per-example ``metric``: its recipe defines no ``score``, or its
    ``score`` does not return that metric."""
    try:
        recipe = load_recipe(config.recipe)
    except RecipeError:
        return f"recipe '{config.recipe}' does not load"
    if not has_score(recipe):
        return f"recipe '{config.recipe}' defines no score()"
    return f"the score() of recipe '{config.recipe}' returns no '{metric}'"


def write_run_scores(
    root: str | Path, run_id: str, *, config: RunConfig, corpus: Any, splits: Sequence[str]
) -> dict[str, Scores]:
    """Write ``scores-<split>.csv`` of each split from the run's SAVED model, on CPU.

    Nothing is written when the recipe has no ``score``, or for a split its datasets lack;
    a split whose file exists is read back, not scored again (a resumed close).

    Returns:
        The scores per split.
    """

    folder = OutputFolder(root)
    recipe = load_recipe(config.recipe)
    if not has_score(recipe):
        return {}
    out = {}
    todo = []
    for split in splits:
        path = folder.path(run_relpath(run_id, scores_file(split)))
        if path.is_file():
            out[split] = read_scores(path)
        else:
            todo.append(split)
    if not todo:
        return out
    threads = torch.get_num_threads()
    try:
        model = load_run_model(root, run_id)
        ctx = recipe_context(config, corpus=corpus, run_id=run_id, device=torch.device("cpu"))
        datasets = build_datasets(recipe, config, ctx)
        for split in todo:
            if not len(datasets.get(split) or ()):
                continue
            ids, columns = score_split(recipe, model, datasets[split], config=config)
            names = sorted(columns)
            rows = [{"id": i, **{m: columns[m][n] for m in names}} for n, i in enumerate(ids)]
            folder.write_text(
                run_relpath(run_id, scores_file(split)), csv_text(rows, columns=("id", *names))
            )
            out[split] = Scores(tuple(ids), {m: tuple(columns[m]) for m in names})
    finally:
        torch.set_num_threads(threads)
    return out


def read_scores(path: str | Path) -> Scores:
    """Read ``scores-<split>.csv`` back.

    Raises:
        ValueError: no ``id`` column first, or a value that is not a number.
    """
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if not header or header[0] != "id":
            raise ValueError(f"{path}: the first column must be 'id', got {header}")
        names = header[1:]
        ids: list[str] = []
        columns: list[list[float]] = [[] for _ in names]
        for n, row in enumerate(reader, start=2):
            if len(row) != len(header):
                raise ValueError(f"{path}: line {n} has {len(row)} fields, expected {len(header)}")
            ids.append(row[0])
            for col, cell in zip(columns, row[1:], strict=True):
                col.append(float(cell))
    return Scores(tuple(ids), {m: tuple(c) for m, c in zip(names, columns, strict=True)})
