"""The evidence the decision rule needs, as the plan states it: the seeds of each compared run,
the GPU time they take, whether they fit the lot, and the smallest gain they can detect.

A verdict adopts a variant only when training noise is measured: at least two seeds on each
side (``close.verdict``). With one seed a side the plan proposes ``PROPOSED_SEEDS`` per compared
run, priced from the forecast hours of each run's own step (the re-forecast after the pilot
prices them from the pilot's measured step times). The smallest detectable gain is stated in
units of the seed-to-seed standard deviation of the metric, which no plan knows before seeds
are trained: exactly 80% power (a noncentral t, not the normal approximation) for the test the
verdict runs when the seeds dominate the gain's variance: the 95% t-interval over k paired seeds
a side, k - 1 degrees of freedom, its lower end above 0, Holm-corrected over the variants (the
variant with the real gain is taken to be the first Holm tests, at 2.5% / m).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

from gpucampaign.config import CampaignSpec
from gpucampaign.core.tdist import t_power, t_quantile
from gpucampaign.plan.schedule import ScheduledStep, round_hours

#: Seeds per compared run the plan proposes when the spec gives fewer than two: the fewest at
#: which a t-interval over seeds is usable (two seeds give t(1) = 12.7, three t(2) = 4.3).
PROPOSED_SEEDS = 3
#: The fewest seeds a side at which the verdict counts training noise as measured.
MEASURED_SEEDS = 2
#: The verdict's one-sided error (the 95% interval's lower end) and the power the plan states.
ALPHA = 0.025
POWER = 0.80


@functools.lru_cache(maxsize=256)
def detectable_gain_sd(seeds: int, *, variants: int = 1) -> float | None:
    """The smallest gain detectable with ``seeds`` paired seeds a side, in seed-to-seed
    standard deviations of one run's metric: the gain the verdict's test adopts with exactly
    80% power (one-sided at 2.5% / ``variants``, the 95% interval's lower end with Holm's
    first step, ``seeds - 1`` degrees of freedom); None under two seeds (no spread measured,
    nothing detectable)."""
    if seeds < MEASURED_SEEDS:
        return None
    dof = seeds - 1
    critical = t_quantile(1 - ALPHA / max(1, variants), dof=dof)
    lo, hi = 0.0, 200.0  # the noncentrality (in standard errors) with 80% power
    while hi - lo > 1e-6:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_power(mid, dof=dof, critical=critical) < POWER else (lo, mid)
    # The per-seed difference of two runs has twice one run's variance: the standard error
    # of the mean gain over k paired seeds is sqrt(2 / k) seed SDs.
    return math.ceil(hi * math.sqrt(2 / seeds) * 1000 - 1e-9) / 1000  # up: never under 80%


def seed_evidence(
    spec: CampaignSpec, *, steps: Sequence[ScheduledStep], spare_gpu_hours: float
) -> dict[str, Any] | None:
    """What the plan says of the rule's evidence; None without a decision rule.

    ``runs``: per compared run (control and variants), its ``seeds`` and the GPU ``hours`` of
    one seed (its own step's, forecast or re-forecast); ``seeds`` the fewest seeds a side;
    ``measured`` whether training noise will be measured; without it ``proposed`` seeds per
    run, the ``extra_gpu_hours`` they take and whether they ``fit`` the ``spare_gpu_hours``
    of the lot; ``detectable_gain_sd`` at the seeds that will be trained (proposed or given).
    """
    if spec.decision_rule is None:
        return None
    hours_of: dict[str, float] = {}
    for s in steps:
        if s.run is not None and s.resource == "gpu":
            hours_of[s.run] = hours_of.get(s.run, 0.0) + s.hours
    seeds = {base: max(1, len(spec.seeds_of(base))) for base in spec.base_names()}
    fewest = min(seeds.values())
    variants = max(1, len(spec.variants))
    out: dict[str, Any] = {
        "runs": {n: {"seeds": k, "hours": _h(hours_of.get(n))} for n, k in seeds.items()},
        "seeds": fewest,
        "measured": fewest >= MEASURED_SEEDS,
        "spare_gpu_hours": round_hours(max(0.0, spare_gpu_hours)),
    }
    if out["measured"]:
        return {**out, "detectable_gain_sd": detectable_gain_sd(fewest, variants=variants)}
    short = [n for n, k in seeds.items() if k < PROPOSED_SEEDS]
    unpriced = [n for n in short if n not in hours_of]
    total = sum((PROPOSED_SEEDS - seeds[n]) * hours_of[n] for n in short if n in hours_of)
    return {
        **out,
        "proposed": PROPOSED_SEEDS,
        "extra_gpu_hours": _h(total),
        "unpriced": unpriced,
        "fits": not unpriced and total <= spare_gpu_hours + 1e-9,
        "detectable_gain_sd": detectable_gain_sd(PROPOSED_SEEDS, variants=variants),
    }


def _h(x: float | None) -> float | None:
    return None if x is None else round_hours(x)


def evidence_lines(ev: dict[str, Any] | None) -> list[str]:
    """The plan's evidence lines, in words."""
    if not ev:
        return []
    runs = ", ".join(
        f"{n} {r['seeds']} seed(s)"
        + ("" if r["hours"] is None else f" ({r['hours']:g} GPU h a seed)")
        for n, r in ev["runs"].items()
    )
    lines = [f"evidence: seeds per compared run: {runs}"]
    if ev["measured"]:
        lines.append(
            f"evidence: training noise is measured ({ev['seeds']} seeds a side); the smallest "
            f"gain it can detect is about {ev['detectable_gain_sd']:g} x the seed-to-seed "
            "standard deviation of the metric (80% power, 95% interval)"
        )
        return lines
    fit = "fits" if ev["fits"] else "does NOT fit"
    unpriced = (
        f" (not priced: {', '.join(ev['unpriced'])} has no GPU step)" if ev["unpriced"] else ""
    )
    lines.append(
        f"evidence: one seed a side cannot measure training noise, so the verdict cannot adopt "
        f"a variant; give each compared run seeds: [...] with {ev['proposed']} seeds: "
        f"{ev['extra_gpu_hours']:g} more GPU h{unpriced}, which {fit} the "
        f"{ev['spare_gpu_hours']:g} spare GPU h of the lot; the smallest gain it can then "
        f"detect is about {ev['detectable_gain_sd']:g} x the seed-to-seed standard deviation "
        "of the metric (80% power, 95% interval)"
    )
    return lines
