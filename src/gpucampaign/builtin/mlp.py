"""``mlp``: a multilayer perceptron on the feature vector."""

from __future__ import annotations

from torch import nn

from gpucampaign.builtin.layers import Standardize
from gpucampaign.config import RunConfig


def build_mlp(config: RunConfig, *, n_features: int, n_classes: int) -> nn.Module:
    """Standardize -> [Linear -> ReLU -> Dropout] per width in ``config.hidden`` -> Linear."""
    layers: list[nn.Module] = [Standardize(n_features)]
    width = n_features
    for h in config.hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        if config.dropout > 0:
            layers.append(nn.Dropout(config.dropout))
        width = h
    layers.append(nn.Linear(width, n_classes))
    return nn.Sequential(*layers)
