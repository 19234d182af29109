"""Layers shared by the recipes."""

from __future__ import annotations

import torch
from torch import nn


class Standardize(nn.Module):
    """``(x - mean) / std`` with the train split's statistics kept as buffers.

    The statistics are saved with the weights, so a reloaded model needs no side file.
    """

    mean: torch.Tensor  # buffers, registered in __init__
    std: torch.Tensor

    def __init__(self, n_features: int) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(n_features))
        self.register_buffer("std", torch.ones(n_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std

    @torch.no_grad()
    def fit(self, X: torch.Tensor) -> None:
        """Set mean and std from ``X`` (constant features keep std 1)."""
        X = X.to(dtype=torch.float64)
        self.mean.copy_(X.mean(dim=0).to(self.mean.dtype))
        std = X.std(dim=0, unbiased=False)
        self.std.copy_(torch.where(std > 0, std, torch.ones_like(std)).to(self.std.dtype))
