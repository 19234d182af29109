"""The built-in work of the training loop: a classifier over the corpus's feature table.

The loop reaches the model, the data, the loss and the evaluation only through the methods
of ``TabularClassifier`` (``model``, ``datasets``, ``loss``, ``evaluate``, ``save_model``),
so another kind of work can take its place without touching the loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from gpucampaign.corpus import Corpus
from gpucampaign.metrics import evaluate
from gpucampaign.recipes import build_model, fit_input_stats, save_model_dir
from gpucampaign.spec import RunConfig

SPLITS: tuple[str, ...] = ("train", "val", "test")


@dataclass
class TabularClassifier:
    """A ``config.recipe`` model (mlp, cnn) trained with cross-entropy on ``corpus``."""

    config: RunConfig
    corpus: Corpus
    _datasets: dict[str, TensorDataset] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._datasets = {
            name: TensorDataset(*self.corpus.splits[name].tensors())
            for name in SPLITS if name in self.corpus.splits
        }

    def describe(self) -> dict[str, Any]:
        """What ``params.json`` records about the data: sizes and class names."""
        return {"n_features": self.corpus.n_features, "n_classes": self.corpus.n_classes,
                "classes": list(self.corpus.classes)}

    def model(self) -> nn.Module:
        """The untrained model, its input statistics fitted on the train split.

        Draws the initial weights from torch's global RNG: the caller seeds it first.
        """
        model = build_model(self.config, n_features=self.corpus.n_features,
                            n_classes=self.corpus.n_classes)
        fit_input_stats(model, self._datasets["train"].tensors[0])
        return model

    def datasets(self) -> dict[str, TensorDataset]:
        """``{train, val, test}``: each split's (features, class index) rows."""
        return self._datasets

    def loss(self, model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """Mean cross-entropy of one batch, computed in float32 from the model's logits."""
        xb, yb = batch
        return F.cross_entropy(model(xb).float(), yb)

    def evaluate(
        self, model: nn.Module, dataset: TensorDataset, *, device: torch.device
    ) -> dict[str, float]:
        """Accuracy, macro F1 and loss of ``model`` on ``dataset``."""
        X, y = dataset.tensors
        return evaluate(model, X, y, n_classes=self.corpus.n_classes, device=device)

    def save_model(self, model: nn.Module, path: Path, *, extra: dict[str, Any]) -> None:
        """The reloadable model folder, with the corpus's names and hash beside ``extra``."""
        corpus = self.corpus
        save_model_dir(model, path, config=self.config, n_features=corpus.n_features,
                       n_classes=corpus.n_classes, extra={
                           "classes": list(corpus.classes),
                           "feature_names": list(corpus.feature_names),
                           "corpus_sha256": corpus.sha256, **extra})
