"""The verdict's interval: a t-interval over the variance components of seeds and examples,
and Holm's correction when several variants are judged together.

The model (``docs/stop-rules-and-evidence.md`` states it for the user). Each run scores every
example of one split, the same examples for every run and seed: ``y[r, s, i] = mu_r + a[r, s]
+ b[r, i] + e[r, s, i]``, where ``a`` is what the training seed ``s`` does to the whole run
(variance ``sigma_a^2``), ``b`` which examples the split holds (an example easier for one run
than the other), and ``e`` the seed-by-example interaction. The gain is the mean over seeds and
examples of the variant minus the control, and its variance has three parts, each counted
once: ``sigma_a^2 / k`` (the seeds), ``sigma_b^2 / n`` (the examples) and ``sigma_e^2 / (k n)``
(their interaction). The seeds' mean square estimates ``sigma_a^2 / k + sigma_e^2 / (k n)``
(the seeds' share, with the interaction); the examples' share is the examples' mean square less
the interaction's (an unbiased estimate, floored at 0).

Each share has its own degrees of freedom: the seeds' ``k - 1`` when paired by seed, Welch's
(Satterthwaite over the two runs' seed variances) when each run has its own seeds; the
examples' ``n - 1``. The half-width is ``sqrt(t(seeds)^2 * seed_var + t(examples)^2 *
example_var)``: exact when either share dominates, a little wide between (one pooled
Satterthwaite degree of freedom over both shares was measured too narrow there: 3.4% per side
instead of 2.5% at 3 seeds).

Paired by seed (both runs trained the same seeds) the differences are analysed seed by seed;
otherwise each run's seeds are their own sample, and a run with one seed borrows the other's
seed variance (the same training noise on both sides: an assumption, said in the docs). With
one seed a side the training noise is not measured: the interval is the paired t-interval over
the examples.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from gpucampaign.core.tdist import t_quantile

#: The two-sided level of every interval the verdict shows.
LEVEL = 0.95
#: Degrees of freedom above this are taken as this (t at 1000 is within 0.1% of the normal).
MAX_DOF = 1000


@dataclass(frozen=True)
class Spread:
    """A gain's variance by source: ``seed_var`` (the seeds with their interaction share;
    None with one seed a side) at ``seed_dof`` degrees of freedom, and ``example_var`` (the
    examples) at ``example_dof``."""

    seed_var: float | None
    example_var: float
    example_dof: float
    seed_dof: float | None = None

    @property
    def var(self) -> float:
        """The gain's variance: each source once."""
        return (self.seed_var or 0.0) + self.example_var

    @property
    def dof(self) -> float:
        """The degrees of freedom said with the interval: the seeds' when measured."""
        return self.seed_dof if self.seed_dof is not None else self.example_dof

    def half_width(self, *, level: float = LEVEL) -> float:
        """The half-width of the two-sided interval at ``level``."""
        q_ex = t_critical(level=level, dof=self.example_dof)
        out = q_ex * q_ex * max(self.example_var, 0.0)
        if self.seed_var is not None and self.seed_dof is not None:
            q = t_critical(level=level, dof=self.seed_dof)
            out += q * q * max(self.seed_var, 0.0)
        return math.sqrt(out)


@functools.lru_cache(maxsize=4096)
def _t_critical(level: float, dof: int) -> float:
    return t_quantile(0.5 + level / 2, dof=dof)


def t_critical(*, level: float, dof: float) -> float:
    """The two-sided ``level`` quantile of Student's t at ``dof`` rounded down (capped)."""
    return _t_critical(level, max(1, min(MAX_DOF, math.floor(dof))))


def _welch(terms: list[tuple[float, float]]) -> float:
    """Satterthwaite's degrees of freedom of a sum of variance terms ``(value, dof)``."""
    total = sum(v for v, _ in terms)
    denom = sum(v * v / d for v, d in terms if d > 0)
    if total <= 0 or denom <= 0:
        return float(min((d for _, d in terms), default=1.0))
    return max(1.0, total * total / denom)


def _two_way(x: np.ndarray) -> tuple[float, float, float]:
    """``(seed mean square / k n, example mean square / k n, interaction mean square / k n)``
    of a ``(k, n)`` table of per-example values of ``k`` seeds: each the variance its source
    adds to the table's grand mean, with the interaction in both of the first two."""
    k, n = x.shape
    by_seed, by_example = x.mean(axis=1), x.mean(axis=0)
    seed = float(np.var(by_seed, ddof=1)) / k if k > 1 else 0.0
    example = float(np.var(by_example, ddof=1)) / n if n > 1 else 0.0
    if k < 2 or n < 2:
        return seed, example, 0.0
    resid = x - by_seed[:, None] - by_example[None, :] + x.mean()
    inter = float((resid * resid).sum()) / ((k - 1) * (n - 1)) / (k * n)
    return seed, example, inter


def paired_spread(d: np.ndarray) -> Spread:
    """The spread of the mean of ``d`` ``(k, n)``: per-example differences, variant minus
    control, of ``k`` seeds shared by both runs (one row per seed)."""
    k, n = d.shape
    seed, example, inter = _two_way(d)
    if k < 2:
        return Spread(seed_var=None, example_var=example, example_dof=max(1, n - 1))
    ex = max(0.0, example - inter)
    return Spread(seed_var=seed, example_var=ex, example_dof=max(1, n - 1), seed_dof=k - 1.0)


def unpaired_spread(xc: np.ndarray, xv: np.ndarray) -> Spread:
    """The spread of ``mean(xv) - mean(xc)``: each side's per-example values ``(k, n)`` of
    its own seeds, the examples the same on both sides (paired by example)."""
    kc, kv = xc.shape[0], xv.shape[0]
    n = xc.shape[1]
    c_seed, _, c_inter = _two_way(xc)
    v_seed, _, v_inter = _two_way(xv)
    d = xv.mean(axis=0) - xc.mean(axis=0)
    example = float(np.var(d, ddof=1)) / n if n > 1 else 0.0
    if kc < 2 and kv < 2:
        return Spread(seed_var=None, example_var=example, example_dof=max(1, n - 1))
    if kc < 2 or kv < 2:
        # One side has one seed: it is taken to share the other's training noise, so both
        # seed terms (and interaction terms) come from the other side's one estimate.
        k, seed1, inter1 = (
            (kv, v_seed * kv, v_inter * kv) if kc < 2 else (kc, c_seed * kc, c_inter * kc)
        )
        scale = 1.0 + 1.0 / k
        seed, inter, dof = seed1 * scale, inter1 * scale, k - 1.0
    else:
        seed, inter = c_seed + v_seed, c_inter + v_inter
        dof = _welch([(c_seed, kc - 1.0), (v_seed, kv - 1.0)])
    ex = max(0.0, example - inter)
    return Spread(seed_var=seed, example_var=ex, example_dof=max(1, n - 1), seed_dof=dof)


def spread_from(entry: Mapping[str, object]) -> Spread | None:
    """The spread of a verdict's table entry (``Gain.to_dict``); None without one."""
    ex, ex_dof = entry.get("example_var"), entry.get("example_dof")
    if not isinstance(ex, int | float) or not isinstance(ex_dof, int | float):
        return None
    seed, seed_dof = entry.get("seed_var"), entry.get("seed_dof")
    return Spread(
        seed_var=float(seed) if isinstance(seed, int | float) else None,
        example_var=float(ex),
        example_dof=float(ex_dof),
        seed_dof=float(seed_dof) if isinstance(seed_dof, int | float) else None,
    )


def clears(gain: float, *, bar: float, spread: Spread, alpha: float) -> bool:
    """Whether the one-sided test at ``alpha`` shows ``gain`` at least ``bar`` and above 0
    (signed so that positive is better): the lower end of the two-sided ``1 - 2 alpha``
    interval clears both, as the verdict's adoption asks of the 95% interval."""
    low = gain - spread.half_width(level=1 - 2 * alpha)
    return low >= bar and low > 0


def holm(gains: Mapping[str, tuple[float, Spread]], *, bar: float, alpha: float) -> dict[str, bool]:
    """Holm's step-down over a family of one-sided tests ``gain >= bar, > 0`` (``clears``):
    ``{name: adopted}``, the chance of adopting any variant without a real gain at most
    ``alpha`` whatever the tests' dependence. Run on the levels, not on p-values: with ``r``
    variants adopted so far, every other one whose test clears at ``alpha / (m - r)`` is
    adopted, until none does."""
    out = dict.fromkeys(gains, False)
    m = len(gains)
    while True:
        r = sum(out.values())
        if r == m:
            return out
        new = [
            name
            for name, (g, spread) in gains.items()
            if not out[name] and clears(g, bar=bar, spread=spread, alpha=alpha / (m - r))
        ]
        if not new:
            return out
        out.update(dict.fromkeys(new, True))
