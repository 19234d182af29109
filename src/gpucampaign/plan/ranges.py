"""A forecast's range (p10-p90) instead of a point, and how earlier campaigns widen or narrow it.

A range is the point forecast times the 10th and the 90th percentile of the ratio actual /
forecast. Without an earlier campaign to learn from, the ratio is taken to lie within a factor
``DEFAULT_SPREAD`` of one (said as uncalibrated); ``campaign plan --calibrate-from`` gives the
ratios its earlier campaigns observed for their re-forecast training steps, and their
percentiles replace it. Pure functions; the bench (``bench/forecast.py``) records what share
of actuals fall inside.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

#: The ratio actual / forecast assumed when no earlier campaign measured it: p10 and p90.
DEFAULT_SPREAD = (0.5, 2.0)
#: Fewer observed ratios than this and the percentiles are those of a wider spread: the
#: smallest and the largest seen, each pushed out by the default spread's square root.
MIN_RATIOS = 5


def spread_of(ratios: Iterable[float]) -> tuple[float, float]:
    """The 10th and 90th percentile of observed actual / forecast ratios (``DEFAULT_SPREAD``
    when none was observed; from a handful, the extremes widened)."""
    r = sorted(float(x) for x in ratios if np.isfinite(x) and x > 0)
    if not r:
        return DEFAULT_SPREAD
    if len(r) < MIN_RATIOS:
        lo, hi = DEFAULT_SPREAD
        return r[0] * float(np.sqrt(lo)), r[-1] * float(np.sqrt(hi))
    p10, p90 = np.quantile(np.asarray(r), [0.1, 0.9])
    return float(p10), float(p90)


def hours_range(hours: float, spread: tuple[float, float] = DEFAULT_SPREAD) -> tuple[float, float]:
    """The p10-p90 range of a point forecast of ``hours``."""
    return hours * spread[0], hours * spread[1]


def observed_ratios(report: Mapping[str, Any]) -> list[float]:
    """Actual / re-forecast of each training step a closed campaign observed (its
    ``report.json``): the errors a later campaign's ranges learn from."""
    steps = (report.get("forecast_vs_actual") or {}).get("steps") or []
    out = []
    for s in steps:
        refo, seen = s.get("reforecast_hours"), s.get("observed_hours")
        if s.get("run") and isinstance(refo, int | float) and isinstance(seen, int | float):
            if refo > 0 and seen > 0:
                out.append(seen / refo)
    return out
