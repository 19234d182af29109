"""How sure a gain is: a variant against the control, paired example by example, and seed by
seed when both runs trained the same seeds.

Both runs predicted the same rows, so the gain is analysed per example (the same examples for
both runs and for every seed): what varies is which examples the split holds and which seeds
trained the runs, each counted once (``gain_interval.py`` states the model: a t-interval over
the variance components, Welch's degrees of freedom, no second interval). For a metric that is
a mean over examples (accuracy, any per-example score: ``paired_mean_gain``) every part is
computed in closed form. Macro F1 is not a mean over examples: its examples' share is the
variance of a paired bootstrap of the examples (every seed kept once; numpy's PCG64, seeded,
so the same predictions give the same interval on every machine), its seeds' share that of
the per-seed F1s. The gain's variance is split into the seeds' and the examples' shares, and
the larger names what more evidence should be.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from gpucampaign.core.gain_interval import LEVEL, Spread, paired_spread, unpaired_spread
from gpucampaign.core.resample import BOOT_SAMPLES, BOOT_SEED, RESAMPLE_CHUNK

#: What each source of variance, when it dominates, says more evidence should be.
DOMINATES = {
    "seeds": "seeds dominate: more seeds narrow it more than more examples",
    "examples": "examples dominate: more examples narrow it more than more seeds",
}


@dataclass(frozen=True)
class Gain:
    """A variant's gain over the control on one split, signed so that positive is better.

    ``ci95`` is the 95% t-interval over the gain's variance components (``dof`` its
    Welch-Satterthwaite degrees of freedom, ``se`` its standard error); ``n`` the paired examples;
    ``replicates`` the runs (seeds) of each side, the smaller of the two. With replicates,
    ``control_seeds`` and ``variant_seeds`` name them (None where not known), ``paired_seeds``
    says whether they were paired by seed, and the gain's variance is split into
    ``seed_var`` (the between-seed variance of the per-seed gains over k; None with one seed a
    side) and ``example_var`` (the variance of the gain when only the examples are resampled,
    every seed kept once: the seeds' mean per example, resampled).
    """

    gain: float
    ci95: tuple[float, float]
    n: int
    replicates: int = 1
    control_seeds: tuple[int | None, ...] = ()
    variant_seeds: tuple[int | None, ...] = ()
    paired_seeds: bool = True
    seed_var: float | None = None
    example_var: float | None = None
    dof: float | None = None
    se: float | None = None
    seed_dof: float | None = None
    example_dof: float | None = None

    @property
    def seeded(self) -> bool:
        """Whether a side has replicates: then the interval is over seeds and examples."""
        return max(len(self.control_seeds), len(self.variant_seeds)) > 1

    @property
    def noise_measured(self) -> bool:
        """Whether training noise is in the interval: at least two seeds on each side (with
        one seed a side, the interval covers which examples the split holds, not another
        training seed)."""
        return min(len(self.control_seeds), len(self.variant_seeds)) >= 2

    @property
    def dominates(self) -> str | None:
        """``seeds`` or ``examples``: the larger share of the gain's variance; None without
        replicates or without a measure of the seeds' share."""
        if not self.seeded or self.seed_var is None or self.example_var is None:
            return None
        return "seeds" if self.seed_var > self.example_var else "examples"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``{gain, gain_ci95: [low, high], n, replicates}``, and with replicates
        ``seeds`` (``{control, variant, paired}``), ``seed_var``, ``example_var``,
        ``seed_share`` and ``dominates``."""
        out: dict[str, Any] = {
            "gain": self.gain,
            "gain_ci95": [self.ci95[0], self.ci95[1]],
            "n": self.n,
            "replicates": self.replicates,
            "training_noise": "measured" if self.noise_measured else "not measured",
        }
        if self.se is not None:
            out.update(
                se=self.se, dof=self.dof, seed_dof=self.seed_dof, example_dof=self.example_dof
            )
        if self.seeded:
            total = (self.seed_var or 0.0) + (self.example_var or 0.0)
            out.update(
                seeds={
                    "control": list(self.control_seeds),
                    "variant": list(self.variant_seeds),
                    "paired": self.paired_seeds,
                },
                seed_var=self.seed_var,
                example_var=self.example_var,
                seed_share=None
                if self.seed_var is None or total <= 0
                else round(self.seed_var / total, 6),
                dominates=self.dominates,
            )
        return out


def _common_ids(sides: Sequence[Any]) -> list[str]:
    """The example IDs every replicate of both sides has, in the first one's order."""
    common = set(sides[0].ids)
    for s in sides[1:]:
        common &= set(s.ids)
    return [i for i in sides[0].ids if i in common]


def _take(p: Any, values: Sequence[Any], ids: Sequence[str]) -> list[Any]:
    if len(p.ids) == len(ids) and list(p.ids) == list(ids):  # the usual case: one order
        return list(values)
    pos = {i: n for n, i in enumerate(p.ids)}
    return [values[pos[i]] for i in ids]


def _seed_order(
    control: Sequence[Any], variant: Sequence[Any]
) -> tuple[list[Any], list[Any], bool]:
    """Both sides' replicates, and whether they pair seed by seed: when both trained the same
    seeds (then sorted by seed, position k on one side is the same seed on the other), or
    when neither names its seeds and both have as many (paired by position)."""
    cs = [getattr(p, "seed", None) for p in control]
    vs = [getattr(p, "seed", None) for p in variant]
    if len(cs) == len(vs) == 1:
        return list(control), list(variant), True  # no seed to draw: the examples pair
    if len(cs) != len(vs):
        return list(control), list(variant), False
    known_c = [int(c) for c in cs if c is not None]
    known_v = [int(v) for v in vs if v is not None]
    if len(known_c) == len(cs) and len(known_v) == len(vs):
        if sorted(known_c) != sorted(known_v) or len(set(known_c)) != len(known_c):
            return list(control), list(variant), False
        by = sorted(range(len(cs)), key=lambda k: known_c[k])
        vby = sorted(range(len(vs)), key=lambda k: known_v[k])
        return [control[k] for k in by], [variant[k] for k in vby], True
    return list(control), list(variant), all(c is None for c in cs + vs)


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


_Chunk = tuple[np.ndarray, np.ndarray, np.ndarray]


def _resamples(
    rng: np.random.Generator, *, n: int, kc: int, kv: int, samples: int
) -> Iterator[_Chunk]:
    """The bootstrap's draws of the examples, in chunks: ``(sc, sv, idx)``, every seed of the
    control ``(m, kc)`` and of the variant ``(m, kv)`` kept once, and the drawn examples
    ``(m, n)``, shared by both sides (paired by example) and by every seed (one split)."""
    chunk = max(1, RESAMPLE_CHUNK // max(kc, kv))
    for start in range(0, samples, chunk):
        m = min(chunk, samples - start)
        sc = np.broadcast_to(np.arange(kc), (m, kc))
        sv = np.broadcast_to(np.arange(kv), (m, kv))
        yield sc, sv, rng.integers(0, n, size=(m, n))


def _f1_draws(
    labels: np.ndarray, pc: np.ndarray, pv: np.ndarray, *, k: int
) -> Callable[[_Chunk], np.ndarray]:
    """The gain in macro F1 of each draw: F1 is not a mean over examples, so each drawn seed's
    F1 is computed on its drawn rows."""

    def side(preds: np.ndarray, seeds: np.ndarray, rows: np.ndarray) -> float:
        return float(np.mean([_macro_f1(labels[rows], preds[s][rows], k=k) for s in seeds]))

    def draws(chunk: _Chunk) -> np.ndarray:
        sc, sv, idx = chunk
        return np.asarray(
            [side(pv, sv[d], idx[d]) - side(pc, sc[d], idx[d]) for d in range(idx.shape[0])]
        )

    return draws


def _example_var_f1(
    *, n: int, draws: Callable[[_Chunk], np.ndarray], kc: int, kv: int, samples: int, seed: int
) -> float:
    """Macro F1's examples' share: the variance of the gain over a paired bootstrap of the
    examples, every seed kept once."""
    rng = np.random.default_rng(seed)
    got = [draws(c) for c in _resamples(rng, n=n, kc=kc, kv=kv, samples=samples)]
    return float(np.var(np.concatenate(got), ddof=1)) if got else 0.0


def _gain(
    *,
    n: int,
    gain: float,
    spread: Spread,
    control: Sequence[Any],
    variant: Sequence[Any],
    paired: bool,
) -> Gain:
    """The gain with its interval at ``LEVEL`` from its ``spread``."""
    half = spread.half_width(level=LEVEL)
    return Gain(
        gain=round(gain, 12),
        ci95=(round(gain - half, 12), round(gain + half, 12)),
        n=n,
        replicates=min(len(control), len(variant)),
        control_seeds=tuple(getattr(p, "seed", None) for p in control),
        variant_seeds=tuple(getattr(p, "seed", None) for p in variant),
        paired_seeds=paired,
        seed_var=None if spread.seed_var is None else round(spread.seed_var, 15),
        example_var=round(spread.example_var, 15),
        dof=round(spread.dof, 3),
        seed_dof=None if spread.seed_dof is None else round(spread.seed_dof, 3),
        example_dof=spread.example_dof,
        se=round(math.sqrt(max(spread.var, 0.0)), 15),
    )


def spread_of(xc: np.ndarray, xv: np.ndarray, *, paired: bool) -> Spread:
    """The spread of the gain in a metric that is a mean over examples: per-example values
    ``(k, n)`` of each side, paired by seed (row by row) when ``paired``."""
    return paired_spread(xv - xc) if paired else unpaired_spread(xc, xv)


def _f1_spread(
    per_seed: tuple[np.ndarray, np.ndarray], *, example_var: float, n: int, paired: bool
) -> Spread:
    """Macro F1's spread: the per-seed F1s' variance (paired by seed, or Welch) and the
    examples' bootstrap variance (with the interaction in it: a little wide)."""
    c, v = per_seed
    seeds = paired_spread((v - c)[:, None]) if paired else unpaired_spread(c[:, None], v[:, None])
    return replace(seeds, example_var=example_var, example_dof=max(1, n - 1))


def paired_gain(
    control: Sequence[Any],
    variant: Sequence[Any],
    *,
    metric: str,
    samples: int = BOOT_SAMPLES,
    seed: int = BOOT_SEED,
) -> Gain | None:
    """The variant's gain over the control with its 95% interval over the examples and, when a
    side has replicates, over its seeds (``gain_interval.py``).

    Args:
        control: the control's ``error_analysis.Predictions``, one per replicate (seed).
        variant: the variant's, one per replicate.
        metric: ``accuracy`` or ``macro_f1`` (higher is better); any other metric has no
            per-example form in the predictions, so no interval (None).
        samples: bootstrap resamples of macro F1's examples' share.
        seed: their seed.

    Returns:
        The gain (the mean over seeds of each side's metric, variant minus control), or None
        when a side has no predictions, they share no row, or the metric cannot be computed
        from predictions.
    """
    if metric not in ("accuracy", "macro_f1") or not control or not variant:
        return None
    control, variant, paired = _seed_order(control, variant)
    ids = _common_ids([*control, *variant])
    n = len(ids)
    if n == 0:
        return None
    labels = np.asarray(_take(control[0], control[0].labels, ids))
    pc = np.stack([np.asarray(_take(p, p.preds, ids)) for p in control])
    pv = np.stack([np.asarray(_take(p, p.preds, ids)) for p in variant])
    sides: dict[str, Any] = {"n": n, "control": control, "variant": variant, "paired": paired}
    if metric == "accuracy":
        xc, xv = (pc == labels).astype(np.float64), (pv == labels).astype(np.float64)
        gain = float(xv.mean()) - float(xc.mean())
        return _gain(gain=gain, spread=spread_of(xc, xv, paired=paired), **sides)
    k = int(max(labels.max(), pc.max(), pv.max())) + 1
    per_seed = (
        np.asarray([_macro_f1(labels, p, k=k) for p in pc]),
        np.asarray([_macro_f1(labels, p, k=k) for p in pv]),
    )
    example_var = _example_var_f1(
        n=n,
        draws=_f1_draws(labels, pc, pv, k=k),
        kc=len(control),
        kv=len(variant),
        samples=samples,
        seed=seed,
    )
    gain = float(per_seed[1].mean()) - float(per_seed[0].mean())
    spread = _f1_spread(per_seed, example_var=example_var, n=n, paired=paired)
    return _gain(gain=gain, spread=spread, **sides)


def paired_mean_gain(control: Sequence[Any], variant: Sequence[Any], *, metric: str) -> Gain | None:
    """The variant's gain over the control in a metric that is a mean over examples, from
    per-example scores, with its 95% interval over the examples and, when a side has
    replicates, over its seeds (``gain_interval.py``: closed form, no resampling).

    The gain is the raw difference ``variant - control`` (the caller signs it by direction):
    the mean over seeds of each side's mean over the common examples.

    Args:
        control: the control's ``scores.Scores``, one per replicate (seed).
        variant: the variant's, one per replicate.
        metric: the column of the scores to compare.

    Returns:
        The gain, or None when a side has no scores of ``metric``, they share no example, or
        a value is not finite.
    """
    sides = [*control, *variant]
    if not control or not variant or any(metric not in s.values for s in sides):
        return None
    control, variant, paired = _seed_order(control, variant)
    ids = _common_ids([*control, *variant])
    if not ids:
        return None
    xc, xv = (
        np.asarray([_take(s, s.values[metric], ids) for s in reps], dtype=np.float64)
        for reps in (control, variant)
    )
    if not (np.isfinite(xc).all() and np.isfinite(xv).all()):
        return None
    gain = float((xv - xc).mean()) if paired else float(xv.mean() - xc.mean())
    return _gain(
        n=len(ids),
        gain=gain,
        spread=spread_of(xc, xv, paired=paired),
        control=control,
        variant=variant,
        paired=paired,
    )


def to_resolve(g: Gain, *, min_gain: float) -> dict[str, Any]:
    """How much more evidence would move the interval off ``min_gain``.

    The interval's half-width shrinks as one over the square root of the evidence, so its
    variance must shrink by ``factor = (half-width / |gain - min_gain|)^2``. Without
    replicates that is ``factor`` times the examples of the split, or of the seeds of each
    run; the seed figure assumes the width comes from run-to-run noise, so the examples
    figure is the one to trust. With replicates the variance is split: more seeds shrink only
    the seeds' share (``g.seed_var``), more examples only the examples' share
    (``g.example_var``); each figure is what it takes with the other kept, None when the
    other share alone is above the target (that kind of evidence cannot settle it), and
    ``dominates`` names the larger share.

    Returns:
        ``{factor, more_examples, more_seeds, dominates}``; None values when the gain equals
        ``min_gain`` (no amount of evidence separates them).
    """
    half = (g.ci95[1] - g.ci95[0]) / 2
    dist = abs(g.gain - min_gain)
    if dist <= 1e-12 or half <= 0:
        return {"factor": None, "more_examples": None, "more_seeds": None, "dominates": g.dominates}
    factor = (half / dist) ** 2
    more_examples = max(1, math.ceil(g.n * factor) - g.n)
    more_seeds = max(1, math.ceil(g.replicates * factor) - g.replicates)
    if g.dominates is not None:
        assert g.seed_var is not None and g.example_var is not None
        target = (g.seed_var + g.example_var) / factor
        return {
            "factor": round(factor, 4),
            "more_examples": _more(g.n, share=g.example_var, room=target - g.seed_var),
            "more_seeds": _more(g.replicates, share=g.seed_var, room=target - g.example_var),
            "dominates": g.dominates,
        }
    return {
        "factor": round(factor, 4),
        "more_examples": more_examples,
        "more_seeds": more_seeds,
        "dominates": None,
    }


def _more(count: int, *, share: float, room: float) -> int | None:
    """How many more of a kind of evidence bring its ``share`` of the variance (which shrinks
    as one over the count) under ``room``; None when there is no room."""
    if room <= 0:
        return None
    return max(1, math.ceil(count * share / room) - count)


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
