"""How the framework calls a recipe: its context, its checked datasets, the device moves,
the evaluation of one split, the record of which recipe ran, and a preflight that tries every
method once before a campaign starts.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from gpucampaign.config import CampaignSpec, ResolvedRun, RunConfig, SpecError
from gpucampaign.config.recipefile import recipe_file
from gpucampaign.recipe.contract import (
    Pinned,
    Recipe,
    RecipeContext,
    RecipeError,
    call,
    check_datasets,
    check_loss,
    check_metrics,
    check_scores,
    has_score,
    load_recipe,
)


def recipe_context(
    config: RunConfig, *, corpus: Any, run_id: str, device: torch.device
) -> RecipeContext:
    """The ``ctx`` a run's recipe receives; ``corpus`` is a table ``Corpus`` or a ``Pinned``."""
    pinned = Pinned(
        path=Path(corpus.path),
        sha256=corpus.sha256,
        kind=getattr(corpus, "kind", "file"),
        load_s=corpus.load_s,
    )
    return RecipeContext(
        args=dict(config.args),
        corpus=pinned,
        device=device,
        seed=config.seed,
        run_id=run_id,
        inputs=dict(corpus.inputs),
        config=config,
        table=corpus if hasattr(corpus, "splits") else None,
    )


def build_datasets(recipe: Recipe, config: RunConfig, ctx: RecipeContext) -> dict[str, Any]:
    """The recipe's splits, checked (``train`` present and non-empty)."""
    if config.builtin and ctx.table is None:
        raise SpecError(
            f"recipe '{config.recipe}' trains on a feature table (CSV/Parquet "
            "with id, split and label columns); give one as the corpus.",
            field="corpus.path",
        )
    return check_datasets(config.recipe, call(config.recipe, "datasets", recipe.datasets, ctx))


def train_rows(run: ResolvedRun, *, corpus: Any) -> int:
    """Examples in the run's train split (a recipe's datasets are built to count them)."""
    config = run.config
    if config.builtin:
        return len(corpus.split("train"))
    recipe = load_recipe(config.recipe)
    ctx = recipe_context(config, corpus=corpus, run_id=run.run_id, device=torch.device("cpu"))
    return len(build_datasets(recipe, config, ctx)["train"])


def recipe_record(run: ResolvedRun) -> dict[str, Any]:
    """The recipe, its arguments and its file's name and hash (built-ins: no file).

    The hash is the one in the run's ID. No absolute path is recorded: the output folder
    must not point outside itself.
    """
    config = run.config
    if config.builtin:
        return {"recipe": config.recipe, "args": config.args}
    return {
        "recipe": config.recipe,
        "args": config.args,
        "recipe_file": recipe_module_path(config.recipe),
        "recipe_sha256": run.recipe_sha256,
    }


def recipe_module_path(recipe: str) -> str:
    """The recipe file's path relative to its ``sys.path`` folder (``pkg/mod.py``)."""
    module = recipe.partition(":")[0]
    path = recipe_file(recipe)
    parts = module.split(".")
    if path.name == "__init__.py":
        parts.append("__init__")
    return "/".join(parts[:-1] + [parts[-1] + path.suffix])


class PlacedSplit(Dataset):
    """An evaluation split's tensors placed in the device's memory once, for every evaluation
    of a run (``engine.parts.place_eval_splits``). Indexed by a slice, it gives the batch the host's
    ``ordered_loader`` collates from the same rows: a list of the tensors' rows, in order.
    ``ids``: the split's own, kept (``example_ids``)."""

    def __init__(self, tensors: tuple[torch.Tensor, ...], *, ids: Any = None) -> None:
        self.tensors, self.ids = tensors, ids

    def __len__(self) -> int:
        return int(self.tensors[0].shape[0])

    def __getitem__(self, rows: slice) -> list[torch.Tensor]:
        return [t[rows] for t in self.tensors]


class _InOrder(Sampler[slice]):
    """Consecutive slices of ``batch_size`` rows, the last one shorter."""

    def __init__(self, n: int, *, batch_size: int) -> None:
        self.n, self.batch_size = n, batch_size

    def __len__(self) -> int:
        return -(-self.n // self.batch_size)

    def __iter__(self) -> Iterator[slice]:
        for start in range(0, self.n, self.batch_size):
            yield slice(start, start + self.batch_size)


def ordered_loader(recipe: Recipe, dataset: Any, *, config: RunConfig) -> DataLoader:
    """One split's batches in order, in this process (evaluation and predictions); a
    ``PlacedSplit``'s are cut where it lies, with no copy.

    Either way the batches come from a DataLoader's iterator, which draws its base seed from
    torch's global generator: a run's later draws (dropout) are the same with or without its
    splits placed.
    """
    if isinstance(dataset, PlacedSplit):
        slices = _InOrder(len(dataset), batch_size=config.batch_size)
        return DataLoader(dataset, sampler=slices, batch_size=None)
    return DataLoader(
        dataset,
        batch_size=config.batch_size,
        shuffle=False,
        num_workers=0,
        collate_fn=recipe.collate_fn,
    )


def evaluate_split(
    recipe: Recipe,
    model: torch.nn.Module,
    dataset: Any,
    *,
    config: RunConfig,
    device: torch.device,
    need: str | None,
    limit: int | None = None,
) -> dict[str, float]:
    """The recipe's metrics over one split: batches in order, eval mode, no gradient, fp32.

    ``limit``: only the first batches (the preflight).
    """
    loader = ordered_loader(recipe, dataset, config=config)
    batches = (to_device(b, device) for i, b in enumerate(loader) if limit is None or i < limit)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = call(config.recipe, "evaluate", recipe.evaluate, model, batches)
    finally:
        model.train(was_training)
    return check_metrics(config.recipe, out, need=need)


def example_ids(dataset: Any) -> list[str]:
    """The examples' IDs: the dataset's ``ids`` when it has one per example, else positions."""
    ids = getattr(dataset, "ids", None)
    if ids is not None and len(ids) == len(dataset):
        return [str(i) for i in (ids.tolist() if hasattr(ids, "tolist") else ids)]
    return [str(i) for i in range(len(dataset))]


def score_split(
    recipe: Recipe,
    model: torch.nn.Module,
    dataset: Any,
    *,
    config: RunConfig,
    device: torch.device | None = None,
) -> tuple[list[str], dict[str, list[float]]]:
    """The recipe's per-example scores over one split, batches in order, eval mode, no
    gradient: ``(ids, {metric: values})``, the same metrics for every batch. ``device``: move
    each batch there (a model in training); the model's mode is restored after.

    Raises:
        RecipeError: ``score`` fails, or returns other metrics or another count than a batch.
    """
    columns: dict[str, list[float]] = {}
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for batch in ordered_loader(recipe, dataset, config=config):
                if device is not None:
                    batch = to_device(batch, device)
                got = check_scores(
                    config.recipe,
                    call(config.recipe, "score", recipe.score, model, batch),
                    rows=batch_len(batch),
                )
                if columns and set(got) != set(columns):
                    raise RecipeError(
                        config.recipe,
                        "score()",
                        f"returned {sorted(got)} for one batch and {sorted(columns)} for another",
                    )
                for name, values in got.items():
                    columns.setdefault(name, []).extend(values)
    finally:
        model.train(was_training)
    return example_ids(dataset), columns


def to_device(batch: Any, device: torch.device) -> Any:
    """``batch`` with every tensor in it (tuples, lists, dicts) moved to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, list | tuple):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def batch_len(batch: Any) -> int:
    """Examples in a batch: the first dimension of its first tensor."""
    if type(batch) is list and batch and type(batch[0]) is torch.Tensor and batch[0].ndim:
        return int(batch[0].shape[0])  # a list of tensors: the built-in recipes', every step
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.ndim else 1
    if isinstance(batch, dict):
        return batch_len(next(iter(batch.values()))) if batch else 0
    if isinstance(batch, list | tuple):
        return batch_len(batch[0]) if batch else 0
    return 1


def required_splits(spec: CampaignSpec) -> tuple[str, ...]:
    """The splits a recipe's ``datasets`` must fill: train, and the one the decision is
    reported on."""
    return ("train", spec.decision_split)


def output_splits(spec: CampaignSpec) -> list[str]:
    """The splits the close calls ``predict`` and ``score`` on: the report split
    (``predictions.csv``), then the selection split when there is a decision rule."""
    return [spec.decision_split] + ([spec.selection_split] if spec.decision_rule else [])


def _has_predict(recipe: Recipe) -> bool:
    return type(recipe).predict is not Recipe.predict


def try_outputs(
    recipe: Recipe,
    model: torch.nn.Module,
    datasets: dict[str, Any],
    *,
    config: RunConfig,
    splits: list[str],
) -> None:
    """``predict`` on one batch of the report split and ``score`` on one batch of each split
    the close reads, called as the close calls them (batches in order, eval mode, no
    gradient), so a recipe whose ``predict`` or ``score`` fails is refused before anything
    trains, not after all of it.

    Raises:
        RecipeError: ``predict`` or ``score`` raised, or returned what the contract refuses;
            the message names the method and the split.
    """
    name = config.recipe
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for i, split in enumerate(dict.fromkeys(splits)):
                # The close predicts on the training split when the report split is missing.
                dataset = datasets.get(split) or (datasets["train"] if i == 0 else None)
                if dataset is None or not len(dataset):
                    continue
                batch = next(iter(ordered_loader(recipe, dataset, config=config)))
                if i == 0 and _has_predict(recipe):
                    _tried(name, "predict()", split, _rows, recipe, model, batch)
                if has_score(recipe):
                    _tried(name, "score()", split, _scores, recipe, model, batch)
    finally:
        model.train(was_training)


def _rows(name: str, recipe: Recipe, model: torch.nn.Module, batch: Any) -> None:
    """``predict``'s rows of one batch: a list of dicts, as ``predictions.csv`` takes them."""
    rows = call(name, "predict", recipe.predict, model, batch)
    try:
        [dict(r) for r in rows]
    except (TypeError, ValueError):
        raise RecipeError(
            name, "predict()", f"must return a list of dicts (one row each), got {rows!r:.80}"
        ) from None


def _scores(name: str, recipe: Recipe, model: torch.nn.Module, batch: Any) -> None:
    """``score``'s values of one batch: one per example for each metric."""
    scores = call(name, "score", recipe.score, model, batch)
    check_scores(name, scores, rows=batch_len(batch))


def _tried(name: str, method: str, split: str, fn: Any, *args: Any) -> None:
    """``fn(name, *args)``; its ``RecipeError`` said again with the split it was tried on."""
    try:
        fn(name, *args)
    except RecipeError as exc:
        problem = str(exc).removeprefix(f"recipe '{name}', {exc.method}: ")
        raise RecipeError(
            name,
            exc.method,
            f"{problem} (tried on one batch of the '{split}' split, as the close calls it "
            f"after training; nothing has trained); fix {method} and run again",
        ) from exc.__cause__


def _outputs_said(recipe: Recipe, spec: CampaignSpec) -> str:
    """``', predict on test, score on test and val'``: what ``try_outputs`` ran."""
    splits = list(dict.fromkeys(output_splits(spec)))
    said = [f"predict on {splits[0]}"] if _has_predict(recipe) else []
    said += [f"score on {' and '.join(splits)}"] if has_score(recipe) else []
    return "".join(f", {s}" for s in said)


def try_recipes(spec: CampaignSpec, *, corpus: Any) -> list[dict[str, Any]]:
    """Try each distinct recipe of the spec once on CPU: datasets (the splits the campaign
    needs filled), model, one loss, its ``predict`` and per-example ``score`` on one batch of
    each split the close calls them on (``try_outputs``), one evaluation returning the
    decision metric.

    Returns:
        One entry per recipe and args tried: ``recipe``, ``runs``, ``splits`` (sizes),
        ``metrics`` (the names ``evaluate`` returned) and ``outputs`` (what else ran, said).

    Raises:
        RecipeError: A method fails or returns what the contract refuses.
    """
    rule = spec.decision_rule
    tried: dict[str, dict[str, Any]] = {}
    for run in spec.run_names():
        config = spec.run_config(run)
        key = f"{config.recipe} {sorted(config.args.items())}"
        if key in tried:
            tried[key]["runs"].append(run)
            continue
        recipe = load_recipe(config.recipe)
        ctx = recipe_context(
            config, corpus=corpus, run_id=spec.resolve_run(run).run_id, device=torch.device("cpu")
        )
        datasets = build_datasets(recipe, config, ctx)
        for name in required_splits(spec)[1:]:
            if not len(datasets.get(name) or ()):
                raise RecipeError(
                    config.recipe,
                    "datasets()",
                    f"the '{name}' split is missing or empty, and the decision is reported on "
                    f"it; return a '{name}' split with examples",
                )
        model = call(config.recipe, "model", recipe.model, ctx)
        batch = next(
            iter(
                DataLoader(
                    datasets["train"],
                    batch_size=min(2, config.batch_size),
                    collate_fn=recipe.collate_fn,
                )
            )
        )
        check_loss(config.recipe, call(config.recipe, "loss", recipe.loss, model, batch))
        try_outputs(recipe, model, datasets, config=config, splits=output_splits(spec))
        split = next(s for s in ("val", "test", "train") if len(datasets.get(s) or ()) > 0)
        metrics = evaluate_split(
            recipe,
            model,
            datasets[split],
            config=config,
            device=ctx.device,
            need=rule.metric if rule else None,
            limit=1,
        )
        tried[key] = {
            "recipe": config.recipe,
            "runs": [run],
            "splits": {name: len(ds) for name, ds in datasets.items()},
            "metrics": sorted(metrics),
            "outputs": _outputs_said(recipe, spec),
        }
    return list(tried.values())
