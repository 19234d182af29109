"""How a built-in classifier is evaluated: accuracy, macro F1 and mean cross-entropy over a
split, in float32 without autocast (as ``modelfolder.predict`` predicts)."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

EVAL_BATCH = 4096


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
def evaluate_classifier(
    model: torch.nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    *,
    n_classes: int,
    device: torch.device,
) -> dict[str, float]:
    """Accuracy, macro F1 and mean cross-entropy of ``model`` on (X, y).

    Computed in float32 without autocast, like ``modelfolder.predict``; the model's train/eval
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
