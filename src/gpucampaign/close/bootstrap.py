"""How sure a gain is: a paired bootstrap of a variant against the control, example by example.

Both runs predicted the same rows, so each resample draws rows (the same rows for both runs)
and recomputes the gain: what varies is which examples were in the split, not which run saw
them. Replicates (several seeds of one run) are averaged per example before resampling. The
rows are predictions (accuracy, macro F1 of a classifier) or per-example scores (any metric
that is a mean over examples: ``paired_mean_gain``).
Seeded with numpy's PCG64, so the same predictions give the same interval on every machine.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpucampaign.core.resample import BOOT_SAMPLES, BOOT_SEED, mean_interval

_CHUNK = 250  # resamples per batch: keeps the index matrix small on large splits


@dataclass(frozen=True)
class Gain:
    """A variant's gain over the control on one split, signed so that positive is better.

    ``ci95`` is the bootstrap's 2.5% and 97.5% percentiles; ``n`` the paired examples;
    ``replicates`` the runs (seeds) averaged on each side, the smaller of the two.
    """

    gain: float
    ci95: tuple[float, float]
    n: int
    replicates: int = 1

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``{gain, gain_ci95: [low, high], n, replicates}``."""
        return {
            "gain": self.gain,
            "gain_ci95": [self.ci95[0], self.ci95[1]],
            "n": self.n,
            "replicates": self.replicates,
        }


def _aligned(
    control: Sequence[Any], variant: Sequence[Any]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Labels, and the predictions of every replicate of both sides, on their common rows."""
    common = set(control[0].ids)
    for p in [*control[1:], *variant]:
        common &= set(p.ids)
    ids = [i for i in control[0].ids if i in common]

    def take(p: Any, field: str) -> np.ndarray:
        pos = {i: n for n, i in enumerate(p.ids)}
        values = getattr(p, field)
        return np.asarray([values[pos[i]] for i in ids])

    labels = take(control[0], "labels")
    return (
        labels,
        np.stack([take(p, "preds") for p in control]),
        np.stack([take(p, "preds") for p in variant]),
        np.asarray(ids),
    )


def _macro_f1(labels: np.ndarray, preds: np.ndarray, *, k: int) -> float:
    tp = np.bincount(labels[labels == preds], minlength=k)
    support = np.bincount(labels, minlength=k)
    predicted = np.bincount(preds, minlength=k)
    denom = support + predicted
    present = support > 0
    f1 = np.where(denom > 0, 2 * tp / np.maximum(denom, 1), 0.0)
    return float(f1[present].mean()) if present.any() else 0.0


def _score_rows(
    labels: np.ndarray, preds: np.ndarray, rows: np.ndarray, *, metric: str, k: int
) -> float:
    """The metric of one side (replicates averaged) on the rows ``rows``."""
    if metric == "accuracy":
        return float((preds[:, rows] == labels[rows]).mean())
    return float(np.mean([_macro_f1(labels[rows], p[rows], k=k) for p in preds]))


def paired_gain(
    control: Sequence[Any],
    variant: Sequence[Any],
    *,
    metric: str,
    samples: int = BOOT_SAMPLES,
    seed: int = BOOT_SEED,
) -> Gain | None:
    """The variant's gain over the control with a 95% paired-bootstrap interval.

    Args:
        control: the control's ``predictions.Predictions``, one per replicate (seed).
        variant: the variant's, one per replicate.
        metric: ``accuracy`` or ``macro_f1`` (higher is better); any other metric has no
            per-example form in the predictions, so no interval (None).
        samples: bootstrap resamples.
        seed: the resampling seed.

    Returns:
        The gain, or None when a side has no predictions, they share no row, or the metric
        cannot be computed from predictions.
    """
    if metric not in ("accuracy", "macro_f1") or not control or not variant:
        return None
    labels, pc, pv, ids = _aligned(control, variant)
    n = len(ids)
    if n == 0:
        return None
    k = int(max(labels.max(), pc.max(), pv.max())) + 1
    every = np.arange(n)
    gain = _score_rows(labels, pv, every, metric=metric, k=k) - _score_rows(
        labels, pc, every, metric=metric, k=k
    )
    rng = np.random.default_rng(seed)
    draws: list[float] = []
    if metric == "accuracy":
        # Per-example difference of the mean correctness: the resampled mean is the gain.
        diff = (pv == labels).mean(axis=0) - (pc == labels).mean(axis=0)
        for start in range(0, samples, _CHUNK):
            idx = rng.integers(0, n, size=(min(_CHUNK, samples - start), n))
            draws += diff[idx].mean(axis=1).tolist()
    else:
        for _ in range(samples):
            rows = rng.integers(0, n, size=n)
            draws.append(
                _score_rows(labels, pv, rows, metric=metric, k=k)
                - _score_rows(labels, pc, rows, metric=metric, k=k)
            )
    low, high = np.percentile(np.asarray(draws), [2.5, 97.5])
    return Gain(
        gain=round(gain, 12),
        ci95=(round(float(low), 12), round(float(high), 12)),
        n=n,
        replicates=min(len(control), len(variant)),
    )


def paired_mean_gain(
    control: Sequence[Any],
    variant: Sequence[Any],
    *,
    metric: str,
    samples: int = BOOT_SAMPLES,
    seed: int = BOOT_SEED,
) -> Gain | None:
    """The variant's gain over the control in a metric that is a mean over examples, from
    per-example scores, with a 95% paired-bootstrap interval.

    The gain is the raw difference ``variant - control`` (the caller signs it by direction):
    the mean over the common examples of each example's difference, replicates averaged.

    Args:
        control: the control's ``scores.Scores``, one per replicate (seed).
        variant: the variant's, one per replicate.
        metric: the column of the scores to compare.
        samples: bootstrap resamples.
        seed: the resampling seed.

    Returns:
        The gain, or None when a side has no scores of ``metric``, they share no example, or
        a value is not finite.
    """
    sides = [*control, *variant]
    if not control or not variant or any(metric not in s.values for s in sides):
        return None
    common = set(control[0].ids)
    for s in sides[1:]:
        common &= set(s.ids)
    ids = [i for i in control[0].ids if i in common]
    if not ids:
        return None

    def side(reps: Sequence[Any]) -> np.ndarray:
        rows = []
        for s in reps:
            pos = {i: n for n, i in enumerate(s.ids)}
            values = s.values[metric]
            rows.append([values[pos[i]] for i in ids])
        return np.asarray(rows, dtype=np.float64).mean(axis=0)

    diff = side(variant) - side(control)
    if not np.isfinite(diff).all():
        return None
    n = len(ids)
    low, high = mean_interval(diff, samples=samples, seed=seed)
    return Gain(
        gain=round(float(diff.mean()), 12),
        ci95=(round(low, 12), round(high, 12)),
        n=n,
        replicates=min(len(control), len(variant)),
    )


def to_resolve(g: Gain, *, min_gain: float) -> dict[str, Any]:
    """How much more evidence would move the interval off ``min_gain``.

    The interval's half-width shrinks as one over the square root of the evidence, so the
    evidence must grow by ``(half-width / |gain - min_gain|)^2``: that many times the examples
    of the split, or that many times the seeds of each run. The seed figure assumes the width
    comes from run-to-run noise; when it comes from which examples were drawn, only more
    examples narrow it, so the examples figure is the one to trust.

    Returns:
        ``{factor, more_examples, more_seeds}``; None values when the gain equals ``min_gain``
        (no amount of evidence separates them).
    """
    half = (g.ci95[1] - g.ci95[0]) / 2
    dist = abs(g.gain - min_gain)
    if dist <= 1e-12 or half <= 0:
        return {"factor": None, "more_examples": None, "more_seeds": None}
    factor = (half / dist) ** 2
    return {
        "factor": round(factor, 4),
        "more_examples": max(1, math.ceil(g.n * factor) - g.n),
        "more_seeds": max(1, math.ceil(g.replicates * factor) - g.replicates),
    }


def metric_value(predictions: Sequence[Any], *, metric: str) -> float | None:
    """``accuracy`` or ``macro_f1`` of predictions (replicates averaged); None for another
    metric, which predictions alone cannot give."""
    if metric not in ("accuracy", "macro_f1") or not predictions:
        return None
    values = []
    for p in predictions:
        labels, preds = np.asarray(p.labels), np.asarray(p.preds)
        k = int(max(labels.max(), preds.max())) + 1
        values.append(
            _score_rows(labels, preds[None, :], np.arange(len(labels)), metric=metric, k=k)
        )
    return round(float(np.mean(values)), 12)
