"""How sure a gain is: a paired bootstrap of a variant against the control, example by example,
and seed by seed when the runs have replicates.

Both runs predicted the same rows, so each resample draws rows (the same rows for both runs)
and recomputes the gain: what varies is which examples were in the split, not which run saw
them. With replicates (``seeds: [...]``, several seeds of one run) the bootstrap is
hierarchical: each draw resamples the seeds (with replacement; the same seed positions on both
sides when both trained the same seeds, each side on its own otherwise), then the examples
(the same examples for the variant and the control, and for every drawn seed: all seeds were
evaluated on the same split, so which examples it holds is one draw shared by the seeds, not
one per seed), and averages. The gain's variance is then split into what comes from the seeds
and what from the examples, and the larger names what more evidence should be. With at least
two seeds a side (training noise measured), the interval is also never narrower than the
t-interval that adds both shares, ``gain +- sqrt(t(k-1)^2 * seed_var + 1.96^2 * example_var)``:
a bootstrap over three seeds underestimates their spread (it draws from three values), and the
Student t quantile at k-1 degrees of freedom is what a few seeds warrant. The rows are
predictions (accuracy, macro F1 of a classifier) or per-example scores (any metric that is a
mean over examples: ``paired_mean_gain``). Seeded with numpy's PCG64, so the same predictions
give the same interval on every machine.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpucampaign.core.resample import BOOT_SAMPLES, BOOT_SEED, RESAMPLE_CHUNK
from gpucampaign.core.tdist import t_quantile

#: What each source of variance, when it dominates, says more evidence should be.
DOMINATES = {
    "seeds": "seeds dominate: more seeds narrow it more than more examples",
    "examples": "examples dominate: more examples narrow it more than more seeds",
}


@dataclass(frozen=True)
class Gain:
    """A variant's gain over the control on one split, signed so that positive is better.

    ``ci95`` is the bootstrap's 2.5% and 97.5% percentiles; ``n`` the paired examples;
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
    rng: np.random.Generator, *, n: int, kc: int, kv: int, paired: bool, samples: int, seeds: bool
) -> Iterator[_Chunk]:
    """The bootstrap's draws, in chunks: ``(sc, sv, idx)``, the drawn seed positions of the
    control ``(m, kc)`` and of the variant ``(m, kv)`` (the same ones when ``paired``; every
    seed once when not ``seeds``: the examples alone vary), and the drawn examples ``(m, n)``,
    shared by both sides (paired by example) and by every drawn seed (one split)."""
    slots = max(kc, kv)
    chunk = max(1, RESAMPLE_CHUNK // slots)
    for start in range(0, samples, chunk):
        m = min(chunk, samples - start)
        if not seeds or slots == 1:
            sc = np.broadcast_to(np.arange(kc), (m, kc))
            sv = np.broadcast_to(np.arange(kv), (m, kv))
        else:
            sc = rng.integers(0, kc, size=(m, kc))
            sv = sc if paired else rng.integers(0, kv, size=(m, kv))
        yield sc, sv, rng.integers(0, n, size=(m, n))


def _mean_draws(xc: np.ndarray, xv: np.ndarray, *, paired: bool) -> Callable[[_Chunk], np.ndarray]:
    """The gain of each draw for a metric that is a mean over examples: per-example values
    ``(k, n)`` of each side, averaged over the drawn examples of each drawn seed."""
    # diff[sc[:, :, None], idx[:, None, :]] is (m, k, n): the chunk is cut by k to keep it small.
    diff = xv - xc if paired else None

    def draws(chunk: _Chunk) -> np.ndarray:
        sc, sv, idx = chunk
        if diff is not None:
            return diff[sc[:, :, None], idx[:, None, :]].mean(axis=2).mean(axis=1)
        v = xv[sv[:, :, None], idx[:, None, :]].mean(axis=2).mean(axis=1)
        c = xc[sc[:, :, None], idx[:, None, :]].mean(axis=2).mean(axis=1)
        return v - c

    return draws


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


def _bootstrap(
    *,
    n: int,
    gain: float,
    draws: Callable[[_Chunk], np.ndarray],
    per_seed: tuple[np.ndarray, np.ndarray],
    control: Sequence[Any],
    variant: Sequence[Any],
    paired: bool,
    samples: int,
    seed: int,
) -> Gain:
    """The interval from the resampled gains, and with replicates the split of its variance.

    ``per_seed``: each side's metric per seed on every common example (the seeds' share is
    the variance of those, or of their differences when paired, over k); the examples' share
    is the variance of a second pass that resamples the examples with every seed kept once.
    """
    kc, kv = len(control), len(variant)
    rng = np.random.default_rng(seed)

    def run(seeds: bool) -> np.ndarray:
        got = [
            draws(c)
            for c in _resamples(rng, n=n, kc=kc, kv=kv, paired=paired, samples=samples, seeds=seeds)
        ]
        return np.concatenate(got) if got else np.zeros(0)

    boot = run(True)
    low, high = np.percentile(boot, [2.5, 97.5])
    seed_var = example_var = None
    if max(kc, kv) > 1:
        example_var = round(float(np.var(run(False), ddof=1)), 15)
        c, v = per_seed
        if paired:
            parts = [np.var(v - c, ddof=1) / kc] if kc > 1 else []
        else:
            parts = [np.var(x, ddof=1) / len(x) for x in (c, v) if len(x) > 1]
        seed_var = round(float(sum(parts)), 15) if parts else None
    if min(kc, kv) >= 2 and seed_var is not None and example_var is not None:
        half = _t_half_width(seed_var=seed_var, example_var=example_var, dof=min(kc, kv) - 1)
        low, high = min(low, gain - half), max(high, gain + half)
    return Gain(
        gain=round(gain, 12),
        ci95=(round(float(low), 12), round(float(high), 12)),
        n=n,
        replicates=min(kc, kv),
        control_seeds=tuple(getattr(p, "seed", None) for p in control),
        variant_seeds=tuple(getattr(p, "seed", None) for p in variant),
        paired_seeds=paired,
        seed_var=seed_var,
        example_var=example_var,
    )


def _t_half_width(*, seed_var: float, example_var: float, dof: int) -> float:
    """The 95% half-width over seeds and examples: the seeds' share at Student's t with ``dof``
    degrees of freedom (a few seeds estimate their spread poorly), the examples' at the
    normal quantile."""
    q = t_quantile(0.975, dof=dof)
    return math.sqrt(q * q * seed_var + 1.959963984540054**2 * example_var)


def paired_gain(
    control: Sequence[Any],
    variant: Sequence[Any],
    *,
    metric: str,
    samples: int = BOOT_SAMPLES,
    seed: int = BOOT_SEED,
) -> Gain | None:
    """The variant's gain over the control with a 95% paired-bootstrap interval, over the
    examples and, when a side has replicates, over its seeds (hierarchical).

    Args:
        control: the control's ``error_analysis.Predictions``, one per replicate (seed).
        variant: the variant's, one per replicate.
        metric: ``accuracy`` or ``macro_f1`` (higher is better); any other metric has no
            per-example form in the predictions, so no interval (None).
        samples: bootstrap resamples.
        seed: the resampling seed.

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
    if metric == "accuracy":
        xc, xv = (pc == labels).astype(np.float64), (pv == labels).astype(np.float64)
        draws = _mean_draws(xc, xv, paired=paired)
        per_seed = (xc.mean(axis=1), xv.mean(axis=1))
        gain = float(xv.mean()) - float(xc.mean())
    else:
        k = int(max(labels.max(), pc.max(), pv.max())) + 1
        draws = _f1_draws(labels, pc, pv, k=k)
        per_seed = (
            np.asarray([_macro_f1(labels, p, k=k) for p in pc]),
            np.asarray([_macro_f1(labels, p, k=k) for p in pv]),
        )
        gain = float(per_seed[1].mean()) - float(per_seed[0].mean())
    return _bootstrap(
        n=n,
        gain=gain,
        draws=draws,
        per_seed=per_seed,
        control=control,
        variant=variant,
        paired=paired,
        samples=samples,
        seed=seed,
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
    per-example scores, with a 95% paired-bootstrap interval over the examples and, when a
    side has replicates, over its seeds (hierarchical).

    The gain is the raw difference ``variant - control`` (the caller signs it by direction):
    the mean over seeds of each side's mean over the common examples.

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
    return _bootstrap(
        n=len(ids),
        gain=gain,
        draws=_mean_draws(xc, xv, paired=paired),
        per_seed=(xc.mean(axis=1), xv.mean(axis=1)),
        control=control,
        variant=variant,
        paired=paired,
        samples=samples,
        seed=seed,
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
