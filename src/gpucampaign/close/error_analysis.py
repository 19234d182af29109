"""Error analysis of one run's predictions: per-class scores, the confusion matrix, the most
confident errors and the IDs that flip against the control; for a recipe's regression rows, the
residuals' distribution and the worst examples by ID; and its markdown section.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


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
    if a.get("task") == "regression":
        return _render_regression_md(a, title=title)
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
            f"`{e['id']}` ({e['label']}->{e['prediction']}"
            + ("" if e["confidence"] is None else f", {e['confidence']:.3f}")
            + ")"
            for e in a["most_confident_errors"]
        )
        lead = "Most confident errors" if a.get("confidence", True) else "Errors, by ID"
        lines.append(f"{lead}: {shown}.")
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


# --- a recipe's prediction rows -------------------------------------------------------------
#: The columns of a recipe's prediction rows read as the true value and the prediction.
LABEL_KEYS = ("label", "target", "y")
PREDICTION_KEYS = ("prediction", "pred", "y_pred")
#: The residual's quantiles kept, as written in the JSON.
QUANTILES = ("0", "0.05", "0.25", "0.5", "0.75", "0.95", "1")


def _key(rows: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> str | None:
    return next((k for k in keys if rows and all(k in r for r in rows)), None)


def _as_number(v: Any) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if np.isfinite(x) else None


def _is_class(v: Any) -> bool:
    """A class label: an integer (or a number that is one), a bool, or a non-numeric string."""
    x = _as_number(v)
    return x is None and isinstance(v, str) or (x is not None and float(x).is_integer())


def rows_analysis(
    rows: Sequence[Mapping[str, Any]], *, split: str, top_k: int = 10
) -> dict[str, Any]:
    """``error_analysis.json`` of a recipe run, from its prediction rows (keyed by ``id``).

    Rows with a true value (``label``, ``target`` or ``y``) and a ``prediction`` (or ``pred``)
    are analysed: class labels (integers or names) as a classifier's (per-class precision and
    recall, the confusion matrix, the most confident errors when rows carry ``confidence``),
    numbers as a regressor's (the residual ``prediction - label``: its mean, spread, quantiles
    and histogram, and the ``top_k`` worst examples by ID). Other rows: their columns only.
    """
    columns = list(dict.fromkeys(k for r in rows for k in r))
    out: dict[str, Any] = {"kind": "recipe", "split": split, "rows": len(rows), "columns": columns}
    label, pred = _key(rows, LABEL_KEYS), _key(rows, PREDICTION_KEYS)
    if label is None or pred is None or not rows:
        return {**out, "task": None}
    truth, guess = [r[label] for r in rows], [r[pred] for r in rows]
    ids = [str(r.get("id", n)) for n, r in enumerate(rows)]
    if all(_is_class(v) for v in truth + guess):
        return {**out, **_classifier(rows, ids=ids, truth=truth, guess=guess, top_k=top_k)}
    nums = [_as_number(v) for v in truth + guess]
    if all(x is not None for x in nums):
        y = np.array(nums[: len(rows)], dtype=float)
        p = np.array(nums[len(rows) :], dtype=float)
        return {**out, **_regressor(ids, y=y, p=p, top_k=top_k)}
    return {**out, "task": None}


def _class_key(v: Any) -> tuple[int, float, str]:
    x = _as_number(v)
    return (0, x, "") if x is not None else (1, 0.0, str(v))


def _name(v: Any) -> str:
    x = _as_number(v)
    return str(int(x)) if x is not None else str(v)


def _classifier(
    rows: Sequence[Mapping[str, Any]],
    *,
    ids: list[str],
    truth: list[Any],
    guess: list[Any],
    top_k: int,
) -> dict[str, Any]:
    names = sorted({_name(v) for v in truth + guess}, key=_class_key)
    index = {n: i for i, n in enumerate(names)}
    has_conf = all(_as_number(r.get("confidence")) is not None for r in rows)
    predictions = Predictions(
        ids=tuple(ids),
        labels=tuple(index[_name(v)] for v in truth),
        preds=tuple(index[_name(v)] for v in guess),
        confidence=tuple(float(r["confidence"]) if has_conf else 0.0 for r in rows),
    )
    found = error_analysis(predictions, class_names=names, top_k=top_k)
    for e in found["most_confident_errors"]:
        e["label"], e["prediction"] = names[e["label"]], names[e["prediction"]]
        if not has_conf:
            e["confidence"] = None
    return {"task": "classification", **found, "confidence": has_conf}


def _regressor(ids: list[str], *, y: np.ndarray, p: np.ndarray, top_k: int) -> dict[str, Any]:
    r = p - y
    counts, edges = np.histogram(r, bins=min(10, max(1, len(r))))
    worst = sorted(range(len(r)), key=lambda n: (-abs(float(r[n])), ids[n]))[:top_k]
    return {
        "task": "regression",
        "n": len(r),
        "residual": {
            "mean": float(r.mean()),
            "std": float(r.std()),
            "mae": float(np.abs(r).mean()),
            "rmse": float(np.sqrt((r**2).mean())),
            "quantiles": {q: float(np.quantile(r, float(q))) for q in QUANTILES},
            "histogram": {"edges": [float(e) for e in edges], "counts": [int(c) for c in counts]},
        },
        "worst": [
            {"id": ids[n], "label": float(y[n]), "prediction": float(p[n]), "residual": float(r[n])}
            for n in worst
        ],
    }


def _render_regression_md(a: Mapping[str, Any], *, title: str) -> str:
    res = a["residual"]
    q = res["quantiles"]
    worst = ", ".join(f"`{w['id']}` ({w['residual']:+.4g})" for w in a["worst"])
    lines = [
        f"### {title}",
        "",
        f"{a['n']} predictions; residual (prediction - label) mean {res['mean']:+.4g}, "
        f"std {res['std']:.4g}, MAE {res['mae']:.4g}, RMSE {res['rmse']:.4g}.",
        "",
        "| quantile | 0 | 0.05 | 0.25 | 0.5 | 0.75 | 0.95 | 1 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        "| residual | " + " | ".join(f"{q[k]:+.4g}" for k in QUANTILES) + " |",
        "",
        f"Worst examples: {worst or 'none'}.",
    ]
    return "\n".join(lines) + "\n"
