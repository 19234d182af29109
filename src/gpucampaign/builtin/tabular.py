"""The built-in recipes ``mlp`` and ``cnn``: classifiers over the corpus's feature table.

They are written against the public ``Recipe`` contract like any user's recipe; the only
extra they read is ``ctx.table`` (the parsed, pinned feature table) and the run config's
``hidden`` and ``dropout``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from gpucampaign.builtin.classify import evaluate_classifier
from gpucampaign.builtin.models import build_model, fit_input_stats
from gpucampaign.recipe.contract import Recipe, RecipeContext

SPLITS: tuple[str, ...] = ("train", "val", "test")


class TabularClassifier(Recipe):
    """A model of the run config's ``recipe`` trained with cross-entropy on the feature table."""

    metric = "accuracy"
    name = "mlp"

    def __init__(self) -> None:
        self.n_classes = 0

    def describe(self, ctx: RecipeContext, datasets: dict[str, Any]) -> dict[str, Any]:
        """Sizes, class names and feature names: ``params.json`` and the model's config."""
        table = ctx.table
        return {
            "n_features": table.n_features,
            "n_classes": table.n_classes,
            "classes": list(table.classes),
            "feature_names": list(table.feature_names),
        }

    def datasets(self, ctx: RecipeContext) -> dict[str, TensorDataset]:
        """``{train, val, test}``: each split's (features, class index) rows, with the
        table's row IDs as ``ids``."""
        table = ctx.table
        self.n_classes = table.n_classes
        out = {}
        for name in SPLITS:
            if name in table.splits:
                part = table.splits[name]
                out[name] = TensorDataset(*part.tensors())
                out[name].ids = [str(i) for i in part.ids.tolist()]  # type: ignore[attr-defined]
        return out

    def model(self, ctx: RecipeContext) -> nn.Module:
        """The untrained model, its input statistics fitted on the train split."""
        table = ctx.table
        model = build_model(
            ctx.config.model_copy(update={"recipe": self.name}),
            n_features=table.n_features,
            n_classes=table.n_classes,
        )
        fit_input_stats(model, torch.as_tensor(table.splits["train"].X))
        return model

    def loss(self, model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """Mean cross-entropy of one batch, computed in float32 from the model's logits."""
        xb, yb = batch
        return F.cross_entropy(model(xb).float(), yb)

    def score(self, model: nn.Module, batch: tuple[torch.Tensor, ...]) -> dict[str, torch.Tensor]:
        """Per example: ``accuracy`` (1 when the class is right) and ``loss`` (cross-entropy),
        whose means over a split are its accuracy and loss."""
        xb, yb = batch
        logits = model(xb).float()
        return {
            "accuracy": (logits.argmax(dim=1) == yb).float(),
            "loss": F.cross_entropy(logits, yb, reduction="none"),
        }

    def evaluate(self, model: nn.Module, batches: Iterable[Any]) -> dict[str, float]:
        """Accuracy, macro F1 and loss of ``model`` over the split's batches."""
        xs, ys = zip(*batches, strict=True)
        X, y = torch.cat(xs), torch.cat(ys).cpu()
        return evaluate_classifier(model, X, y, n_classes=self.n_classes, device=X.device)


class MLP(TabularClassifier):
    """``mlp``: a multilayer perceptron on the feature vector."""

    name = "mlp"


class CNN(TabularClassifier):
    """``cnn``: a small convolutional net for square images given as flat features."""

    name = "cnn"
