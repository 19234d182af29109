"""A run's ``metrics.jsonl`` and the classification metrics written into it.

Each row has a ``kind``: ``train`` (step, epoch, loss, lr, step_s, samples_per_s), ``eval``
(split, the metrics, eval_s, final), ``checkpoint`` (step, costs, interval) or ``restore``.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from gpucampaign.core.files import jsonl_line, read_jsonl, write_jsonl

EVAL_BATCH = 4096


class MetricsLog:
    """Append-only ``metrics.jsonl``; floats are written exactly (a read gives them back)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._f = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()

    def write(self, row: dict[str, Any]) -> None:
        """Append one row (flushed, not fsynced: ``sync`` before a checkpoint commits)."""
        self._f.write(jsonl_line(row))
        self._f.flush()

    def sync(self) -> None:
        """Make every row written so far durable."""
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        """Close the file."""
        self._f.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All rows of a ``metrics.jsonl`` (empty list when absent)."""
    return read_jsonl(path)


def truncate_metrics(path: Path, *, through_step: int) -> None:
    """Keep only rows of steps <= ``through_step`` (a resume continues from there)."""
    write_jsonl(path, [r for r in read_metrics(path) if r.get("step", 0) <= through_step])


def classification_metrics(
    y_true: np.ndarray, y_pred: np.ndarray, *, n_classes: int
) -> dict[str, float]:
    """Accuracy and macro F1 (over the classes present in truth or prediction, as scikit-learn)."""
    if len(y_true) == 0:
        return {"accuracy": math.nan, "macro_f1": math.nan}
    cm = np.zeros((n_classes, n_classes), dtype=np.int64)
    np.add.at(cm, (y_true, y_pred), 1)
    tp = np.diag(cm).astype(float)
    support, predicted = cm.sum(axis=1), cm.sum(axis=0)
    present = (support + predicted) > 0
    denom = support + predicted
    f1 = np.divide(2 * tp, denom, out=np.zeros_like(tp), where=denom > 0)
    return {"accuracy": float(tp.sum() / len(y_true)), "macro_f1": float(f1[present].mean())}


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    *,
    n_classes: int,
    device: torch.device,
) -> dict[str, float]:
    """Accuracy, macro F1 and mean cross-entropy of ``model`` on (X, y).

    Computed in float32 without autocast, like ``recipes.predict``; the model's train/eval
    mode is restored.
    """
    was_training = model.training
    model.eval()
    try:
        losses, preds = [], []
        for start in range(0, len(X), EVAL_BATCH):
            xb = X[start : start + EVAL_BATCH].to(device)
            yb = y[start : start + EVAL_BATCH].to(device)
            logits = model(xb).float()
            losses.append(F.cross_entropy(logits, yb, reduction="sum").item())
            preds.append(logits.argmax(dim=1).cpu())
        pred = torch.cat(preds).numpy() if preds else np.zeros(0, dtype=np.int64)
        out = classification_metrics(y.numpy(), pred, n_classes=n_classes)
        out["loss"] = sum(losses) / len(X) if len(X) else math.nan
        return out
    finally:
        model.train(was_training)
