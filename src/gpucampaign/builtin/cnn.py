"""``cnn``: a small convolutional net for square images given as flat features (8x8 digits)."""

from __future__ import annotations

import math

import torch
from torch import nn

from gpucampaign.builtin.layers import Standardize
from gpucampaign.config import RunConfig, SpecError


class SmallCNN(nn.Module):
    """Standardize -> view as 1 x S x S -> [Conv3x3 -> ReLU] per width -> MaxPool2 -> Linear."""

    def __init__(self, config: RunConfig, *, n_features: int, n_classes: int) -> None:
        super().__init__()
        side = math.isqrt(n_features)
        if side * side != n_features or side < 2:
            raise SpecError(
                f"recipe 'cnn' needs square images given as S*S features; this corpus has "
                f"{n_features} features. Use recipe 'mlp' for tabular features.",
                field="control.recipe",
            )
        self.side = side
        self.standardize = Standardize(n_features)
        convs: list[nn.Module] = []
        channels = 1
        for width in config.hidden:
            convs += [nn.Conv2d(channels, width, kernel_size=3, padding=1), nn.ReLU()]
            channels = width
        self.features = nn.Sequential(*convs, nn.MaxPool2d(2))
        self.dropout = nn.Dropout(config.dropout) if config.dropout > 0 else nn.Identity()
        self.head = nn.Linear(channels * (side // 2) ** 2, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.standardize(x).view(-1, 1, self.side, self.side)
        x = self.features(x).flatten(1)
        return self.head(self.dropout(x))


def build_cnn(config: RunConfig, *, n_features: int, n_classes: int) -> nn.Module:
    """A ``SmallCNN`` for ``config`` (``hidden`` gives the conv channel widths)."""
    return SmallCNN(config, n_features=n_features, n_classes=n_classes)
