"""The recipe contract: the user's model, data, loss and evaluation; the framework owns the rest.

A recipe is a class named in the spec by import path, ``module.path:ClassName``, subclassing
:class:`Recipe`. The spec's folder is put on ``sys.path`` first, so a recipe file next to
``campaign.yaml`` just works; installed packages work too. The built-in ``mlp`` and ``cnn``
are recipes written against the same contract (``gpucampaign.builtin.tabular``).

This module does not import torch at import time: the spec hashes a recipe's file through it.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import os
import sys
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpucampaign.config.recipefile import (
    RecipeError,
    import_path,
    recipe_file,
    recipe_file_sha256,
    use_recipe_dir,
)
from gpucampaign.core.files import sha256_file
from gpucampaign.core.text import redact_secrets
from gpucampaign.data.pins import Pinned

if TYPE_CHECKING:
    import torch

REQUIRED_METHODS: tuple[str, ...] = ("model", "datasets", "loss", "evaluate")


@dataclass
class RecipeContext:
    """What a recipe's ``model`` and ``datasets`` receive.

    Attributes:
        args: The run's recipe arguments, after the variant's changes.
        corpus: The pinned corpus (``path``, ``sha256``), already verified.
        device: The ``torch.device`` the run trains on.
        seed: The run's seed (the framework has seeded every RNG with it already).
        run_id: The run ID.
        inputs: The other pinned inputs by name (same shape as ``corpus``).
        config: The whole run config (optimizer, batch size...), read-only.
        table: The parsed feature table, for the built-in table recipes only.
    """

    args: dict[str, Any]
    corpus: Pinned | None
    device: torch.device
    seed: int
    run_id: str
    inputs: dict[str, Pinned] = field(default_factory=dict)
    config: Any = None
    table: Any = None


class Recipe:
    """Base class of a training recipe: what to train; the framework owns how.

    Subclass it and name the class in the spec as ``control.recipe: "module:ClassName"``::

        class MyRecipe(Recipe):
            metric = "mse"
            def model(self, ctx): ...                 # an untrained torch.nn.Module
            def datasets(self, ctx): ...              # {"train": ds, "val": ds, "test": ds}
            def loss(self, model, batch): ...         # a scalar tensor
            def evaluate(self, model, batches): ...   # {"mse": 0.12, ...} over one split
            def predict(self, model, batch): ...      # optional: rows for predictions.csv
            def score(self, model, batch): ...        # optional: {"mse": one value per example}

    ``ctx`` is a :class:`RecipeContext` (``args``, ``corpus.path``, ``corpus.sha256``,
    ``device``, ``seed``, ``run_id``, ``inputs``). ``model`` draws its initial weights from
    torch's global RNG, which the framework seeded. ``evaluate`` gets an iterable of batches of
    one split (already on the device, model in eval mode, no gradient), made by the framework's
    loader from the recipe's dataset.

    ``score`` (optional) gives the verdict its interval: for a metric that is a mean over
    examples (accuracy, loss, mse, mae, per-token loss), one value per example of the batch,
    whose mean over a split is that split's metric. The close calls it on the selection and
    the report splits with each run's saved model and keeps the values, keyed by the dataset's
    ``ids`` attribute when it has one (else the position in the split), in
    ``scores-<split>.csv``; the verdict's paired interval is computed from them. Without it,
    the verdict has point estimates only and never adopts on one when the rule asks for a
    minimum gain.

    The framework keeps: seeding, the optimizer and scheduler, precision (autocast,
    GradScaler), the loop, the data order and cursor, full-state checkpoints, the stop rules
    (a non-finite ``loss``; the decision metric from ``evaluate`` missing its floor), pilot
    timings, the exact restart check, predictions and the close. A recipe with state of its
    own adds it to checkpoints through ``state_dict`` / ``load_state_dict``.

    Attributes:
        metric: The metric the decision rule may name; its direction comes from the rule.
        collate_fn: Optional ``DataLoader`` collate function for this recipe's batches.
    """

    metric: str = "loss"
    collate_fn: Any = None

    def model(self, ctx: RecipeContext) -> torch.nn.Module:
        """The untrained model."""
        raise NotImplementedError

    def datasets(self, ctx: RecipeContext) -> dict[str, Any]:
        """``{"train": ..., "val": ..., "test": ...}`` (torch Datasets; ``train`` required)."""
        raise NotImplementedError

    def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        """The scalar training loss of one batch."""
        raise NotImplementedError

    def evaluate(self, model: torch.nn.Module, batches: Iterable[Any]) -> dict[str, float]:
        """Metric name -> value over the batches of one split."""
        raise NotImplementedError

    def predict(self, model: torch.nn.Module, batch: Any) -> list[dict[str, Any]]:
        """Optional: one row per example of ``batch`` for ``predictions.csv``."""
        raise NotImplementedError

    def score(self, model: torch.nn.Module, batch: Any) -> dict[str, torch.Tensor]:
        """Optional: metric name -> one value per example of ``batch`` (a 1-D tensor)."""
        raise NotImplementedError

    def describe(self, ctx: RecipeContext, datasets: dict[str, Any]) -> dict[str, Any]:
        """What ``params.json`` and the model's ``config.json`` record about the data."""
        return {"split_sizes": {k: len(v) for k, v in datasets.items()}}

    def state_dict(self) -> dict[str, Any]:
        """The recipe's own state, kept in every checkpoint (empty by default)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""


#: The sha256 of each recipe module's file when this process imported it.
_IMPORTED: dict[str, str] = {}


def load_recipe(recipe: str) -> Recipe:
    """Import ``module.path:ClassName`` and return an instance, checked against the contract.

    Raises:
        RecipeError: The module does not import, the class is missing or not a ``Recipe``,
            or a required method is not defined.
    """
    module_name, _, class_name = import_path(recipe).partition(":")
    origin = recipe_file(recipe)
    digest = sha256_file(origin)
    cached = sys.modules.get(module_name)
    if cached is not None and (
        getattr(cached, "__file__", None) != str(origin)  # another folder's module of that name
        or _IMPORTED.get(module_name, digest) != digest  # its file was edited since the import
    ):
        del sys.modules[module_name]
    try:
        module = importlib.import_module(module_name)
        _IMPORTED[module_name] = digest
    except Exception as exc:  # any error in the user's module is reported, not raised
        raise RecipeError(
            recipe,
            "import",
            f"module '{module_name}' does not import ({type(exc).__name__}: {exc})",
        ) from None
    cls = getattr(module, class_name, None)
    if cls is None:
        raise RecipeError(recipe, "import", f"module '{module_name}' has no '{class_name}'")
    if not (isinstance(cls, type) and issubclass(cls, Recipe)):
        raise RecipeError(
            recipe,
            "class",
            f"'{class_name}' is not a subclass of "
            "gpucampaign.Recipe; write `class {class_name}(Recipe): ...`",
        )
    missing = [m for m in REQUIRED_METHODS if getattr(cls, m) is getattr(Recipe, m)]
    if missing:
        raise RecipeError(
            recipe,
            f"{missing[0]}()",
            "the method is missing; a recipe defines "
            + ", ".join(f"{m}()" for m in REQUIRED_METHODS),
        )
    try:
        return cls()
    except Exception as exc:
        raise RecipeError(recipe, "__init__()", f"{type(exc).__name__}: {exc}") from None


def has_score(recipe: Recipe) -> bool:
    """Whether the recipe defines the optional ``score`` (per-example values)."""
    return type(recipe).score is not Recipe.score


def call(recipe: str, method: str, fn: Any, *args: Any) -> Any:
    """Call a recipe's method; an error in it becomes a ``RecipeError`` naming both."""
    try:
        return fn(*args)
    except RecipeError:
        raise
    except Exception as exc:
        raise recipe_raised(recipe, method, exc) from exc


def recipe_raised(recipe: str, method: str, exc: Exception) -> RecipeError:
    """The ``RecipeError`` that ``call`` raises (``from exc``) when a recipe's method raised
    ``exc``."""
    # Its text redacted (RecipeError's own message is): the cause travels with it into
    # tracebacks, Prefect's records and a persisted result.
    with contextlib.suppress(Exception):
        exc.args = tuple(redact_secrets(a) if isinstance(a, str) else a for a in exc.args)
    return RecipeError(recipe, f"{method}()", f"raised {type(exc).__name__}: {exc}")


def raised_in_recipe(recipe: Recipe, exc: BaseException) -> tuple[str, str]:
    """Where in the recipe's own file an exception was raised, and its traceback to keep.

    Returns:
        `` (textlm.py, line 57)`` (empty when no frame of the recipe's file is in the
        traceback), and the traceback's text with the recipe's folder cut from its paths (the
        output folder that keeps it names no folder of the user's) and no credential.
    """
    source = inspect.getsourcefile(type(recipe))
    # Redacted as a whole: the exceptions it chains (one raised while handling another) keep
    # their own text, which no redaction of ``exc`` reached.
    trace = redact_secrets("".join(traceback.format_exception(exc)))
    if source is None:
        return "", trace
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == source]
    where = f" ({Path(source).name}, line {frames[-1].lineno})" if frames else ""
    return where, trace.replace(str(Path(source).parent) + os.sep, "")


# --- checks of what a recipe returns ------------------------------------------------------
def check_datasets(recipe: str, datasets: Any) -> dict[str, Any]:
    """``datasets()``'s result: a mapping with a non-empty ``train`` and sized splits."""
    if not isinstance(datasets, dict):
        raise RecipeError(
            recipe, "datasets()", f"must return a dict of splits, got {type(datasets).__name__}"
        )
    unknown = sorted(set(datasets) - {"train", "val", "test"})
    if unknown:
        raise RecipeError(recipe, "datasets()", f"unknown split(s) {unknown}; use train, val, test")
    if "train" not in datasets:
        raise RecipeError(recipe, "datasets()", "returned no 'train' split")
    for name, ds in datasets.items():
        if not hasattr(ds, "__len__") or not hasattr(ds, "__getitem__"):
            raise RecipeError(
                recipe,
                "datasets()",
                f"split '{name}' is not a map-style Dataset (it needs __len__ and __getitem__)",
            )
    if len(datasets["train"]) == 0:
        raise RecipeError(recipe, "datasets()", "the 'train' split is empty")
    return datasets


def check_loss(recipe: str, loss: Any) -> torch.Tensor:
    """``loss()``'s result: a scalar tensor."""
    import torch

    if not isinstance(loss, torch.Tensor) or loss.ndim != 0:
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise RecipeError(recipe, "loss()", f"must return a scalar tensor, got {shape}")
    return loss


def check_metrics(recipe: str, metrics: Any, *, need: str | None) -> dict[str, float]:
    """``evaluate()``'s result: names to floats, with the metric the decision rule names."""
    if not isinstance(metrics, dict):
        raise RecipeError(
            recipe, "evaluate()", f"must return a dict of metrics, got {type(metrics).__name__}"
        )
    if need is not None and need not in metrics:
        raise RecipeError(
            recipe,
            "evaluate()",
            f"did not return '{need}', the metric the decision rule names (got {sorted(metrics)})",
        )
    try:
        return {str(k): float(v) for k, v in metrics.items()}
    except (TypeError, ValueError) as exc:
        raise RecipeError(recipe, "evaluate()", f"metric values must be numbers ({exc})") from None


def check_scores(recipe: str, scores: Any, *, rows: int) -> dict[str, list[float]]:
    """``score()``'s result: metric names to one number per example of the batch."""
    if not isinstance(scores, dict) or not scores:
        raise RecipeError(
            recipe,
            "score()",
            f"must return a dict of metric name -> per-example values, got {scores!r:.80}",
        )
    out = {}
    for name, values in scores.items():
        if hasattr(values, "detach"):
            values = values.detach().cpu().reshape(-1).tolist()
        try:
            got = [float(v) for v in values]
        except (TypeError, ValueError):
            got = None
        if got is None or len(got) != rows:
            size = "not numbers" if got is None else f"{len(got)} values"
            raise RecipeError(
                recipe, "score()", f"'{name}' must hold one number per example ({rows}), got {size}"
            )
        out[str(name)] = got
    return out


__all__ = [
    "Recipe",
    "RecipeContext",
    "RecipeError",
    "Pinned",
    "load_recipe",
    "recipe_file",
    "recipe_file_sha256",
    "use_recipe_dir",
    "check_datasets",
    "check_loss",
    "check_metrics",
    "check_scores",
    "has_score",
]
