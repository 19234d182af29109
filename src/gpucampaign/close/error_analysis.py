"""Error analysis of one run's predictions: per-class scores, the confusion matrix, the most
confident errors and the IDs that flip against the control; and its markdown section.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Predictions:
    """One run's predictions on the decision split, in a fixed row order; ``seed``: the
    training seed of the replicate that made them (None when not known)."""

    ids: tuple[str, ...]
    labels: tuple[int, ...]
    preds: tuple[int, ...]
    confidence: tuple[float, ...]
    seed: int | None = None

    def __post_init__(self) -> None:
        n = len(self.ids)
        assert len(self.labels) == n and len(self.preds) == n and len(self.confidence) == n

    @property
    def correct(self) -> list[bool]:
        """Per row: prediction equals label."""
        return [p == y for p, y in zip(self.preds, self.labels, strict=True)]


def _confusion(predictions: Predictions, *, k: int) -> list[list[int]]:
    confusion = [[0] * k for _ in range(k)]
    for y, p in zip(predictions.labels, predictions.preds, strict=True):
        confusion[y][p] += 1
    return confusion


def _per_class(confusion: list[list[int]], *, names: Sequence[str]) -> list[dict[str, Any]]:
    """Support, precision, recall and F1 of each class (precision/recall None when undefined)."""
    k = len(confusion)
    rows = []
    for c in range(k):
        tp = confusion[c][c]
        support = sum(confusion[c])
        predicted = sum(confusion[r][c] for r in range(k))
        precision = tp / predicted if predicted else None
        recall = tp / support if support else None
        f1 = (
            2 * precision * recall / (precision + recall)
            if precision is not None and recall is not None and precision + recall > 0
            else 0.0
        )
        rows.append(
            {
                "class": names[c],
                "support": support,
                "predicted": predicted,
                "precision": precision,
                "recall": recall,
                "f1": f1,
            }
        )
    return rows


def _errors_by_confidence(predictions: Predictions) -> list[dict[str, Any]]:
    """The wrong rows, most confident first (ties by ID)."""
    p = predictions
    errors: list[dict[str, Any]] = [
        {"id": i, "label": y, "prediction": pr, "confidence": c}
        for i, y, pr, c, ok in zip(p.ids, p.labels, p.preds, p.confidence, p.correct, strict=True)
        if not ok
    ]
    errors.sort(key=lambda e: (-e["confidence"], e["id"]))
    return errors


def _vs_control(predictions: Predictions, *, control: Predictions) -> dict[str, Any]:
    """The IDs that flip right->wrong and wrong->right against the control."""
    ctrl = dict(zip(control.ids, control.correct, strict=True))
    right_to_wrong, wrong_to_right = [], []
    for i, ok in zip(predictions.ids, predictions.correct, strict=True):
        if i not in ctrl:
            continue
        if ctrl[i] and not ok:
            right_to_wrong.append(i)
        elif not ctrl[i] and ok:
            wrong_to_right.append(i)
    return {
        "compared": sum(1 for i in predictions.ids if i in ctrl),
        "missing_in_control": sorted(set(predictions.ids) - set(ctrl)),
        "right_to_wrong": right_to_wrong,
        "wrong_to_right": wrong_to_right,
        "net_gain": len(wrong_to_right) - len(right_to_wrong),
    }


def error_analysis(
    predictions: Predictions,
    *,
    control: Predictions | None = None,
    class_names: Sequence[str] | None = None,
    top_k: int = 10,
) -> dict[str, Any]:
    """Per-class precision/recall, confusion matrix, most confident errors, flips vs the control.

    Args:
        predictions: the run's predictions.
        control: the control's predictions on the same IDs (None for the control itself).
        class_names: names of classes 0..K-1; by default the labels seen, as strings.
        top_k: how many of the most confident errors to list.

    Returns:
        ``{n, accuracy, macro_f1, classes, per_class, confusion, most_confident_errors,
        vs_control}``; ``confusion[i][j]`` counts label ``classes[i]`` predicted as
        ``classes[j]``; ``vs_control`` lists the IDs that flip right->wrong and wrong->right
        (None without control).
    """
    k = max([*predictions.labels, *predictions.preds]) + 1
    if class_names is not None:
        if len(class_names) < k:
            raise ValueError(
                f"class_names has {len(class_names)} names but classes go up to {k - 1}"
            )
        k = len(class_names)
    names = list(class_names) if class_names is not None else [str(i) for i in range(k)]
    confusion = _confusion(predictions, k=k)
    per_class = _per_class(confusion, names=names)
    f1s = [c["f1"] for c in per_class if c["support"]]
    n = len(predictions.ids)
    errors = _errors_by_confidence(predictions)
    return {
        "n": n,
        "accuracy": sum(predictions.correct) / n if n else None,
        "macro_f1": sum(f1s) / len(f1s) if f1s else None,
        "errors": len(errors),
        "classes": names,
        "per_class": per_class,
        "confusion": confusion,
        "most_confident_errors": errors[:top_k],
        "vs_control": None if control is None else _vs_control(predictions, control=control),
    }


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _id_list(xs: Sequence[str], *, max_ids: int) -> str:
    shown = ", ".join(f"`{x}`" for x in xs[:max_ids])
    more = f" and {len(xs) - max_ids} more" if len(xs) > max_ids else ""
    return (shown + more) if xs else "none"


def render_error_analysis_md(analysis: Mapping[str, Any], *, title: str, max_ids: int = 20) -> str:
    """A short markdown section for one run's error analysis."""
    a = analysis
    lines = [
        f"### {title}",
        "",
        f"{a['n']} predictions, {a['errors']} errors; accuracy {_pct(a['accuracy'])}, "
        f"macro F1 {_pct(a['macro_f1'])}.",
        "",
        "| class | support | precision | recall |",
        "|---|---:|---:|---:|",
    ]
    lines += [
        f"| {c['class']} | {c['support']} | {_pct(c['precision'])} | {_pct(c['recall'])} |"
        for c in a["per_class"]
    ]
    lines.append("")
    if a["most_confident_errors"]:
        shown = ", ".join(
            f"`{e['id']}` ({e['label']}->{e['prediction']}, {e['confidence']:.3f})"
            for e in a["most_confident_errors"]
        )
        lines.append(f"Most confident errors: {shown}.")
    else:
        lines.append("No errors on this split.")
    vc = a.get("vs_control")
    if vc is not None:
        lines += [
            "",
            f"Against the control ({vc['compared']} common IDs, net {vc['net_gain']:+d}): "
            f"right->wrong {len(vc['right_to_wrong'])}: "
            f"{_id_list(vc['right_to_wrong'], max_ids=max_ids)}; "
            f"wrong->right {len(vc['wrong_to_right'])}: "
            f"{_id_list(vc['wrong_to_right'], max_ids=max_ids)}.",
        ]
    return "\n".join(lines) + "\n"
