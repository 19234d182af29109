"""The built-in recipes' models: build one from a run config, fit its input statistics."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from gpucampaign.builtin.cnn import build_cnn
from gpucampaign.builtin.layers import Standardize
from gpucampaign.builtin.mlp import build_mlp
from gpucampaign.config import RunConfig, SpecError

RECIPES: dict[str, Callable[..., nn.Module]] = {"mlp": build_mlp, "cnn": build_cnn}


def build_model(config: RunConfig, *, n_features: int, n_classes: int) -> nn.Module:
    """The untrained model of ``config.recipe``; parameters drawn from torch's global RNG."""
    if n_features < 1 or n_classes < 2:
        raise SpecError(
            f"a model needs at least 1 feature and 2 classes (got {n_features} and {n_classes}).",
            field="corpus",
        )
    try:
        factory = RECIPES[config.recipe]
    except KeyError:
        raise SpecError(
            f"unknown recipe '{config.recipe}': use one of {sorted(RECIPES)}.", field="recipe"
        ) from None
    return factory(config, n_features=n_features, n_classes=n_classes)


def fit_input_stats(model: nn.Module, X: torch.Tensor) -> None:
    """Set the model's input standardization from the training features ``X``."""
    layers = [m for m in model.modules() if isinstance(m, Standardize)]
    assert len(layers) == 1, "every recipe starts with exactly one Standardize layer"
    layers[0].fit(X)
