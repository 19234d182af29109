"""Calibration of the verdict: how often it adopts a variant with no real gain, how often it
adopts one with the gain the plan says it can detect, with the interval's coverage.

Simulated, not trained: each campaign draws per-example scores on a val and a test split from
the model the verdict assumes (``core/gain_interval.py``), a score per seed and example
``y = mu + a[run, seed] + b[run, example] + e[run, seed, example]`` where the seed effect ``a``
is shared by the val and test splits (a lucky seed is lucky on both) and partly by runs trained
with the same seed (``shared``: what pairing by seed removes), and ``b`` is each run's
per-example effect (which examples the split holds). The verdict is then the close's own
``decide_verdict`` on those scores: selection on val, the interval on test, Holm over the
variants; nothing of it is re-implemented here. Everything is seeded: the rates are the same on
every machine. ``tests/close/test_calibration_sim.py`` runs a smaller derandomized version and
fails when a rate leaves its bound.

Settings (each on the paired path, the variants trained with the control's seeds, and the
unpaired path, each run with its own seeds):

* A/A: one variant with no real gain: adoption (one-sided 2.5%) and the 95% interval's
  coverage of the true gain (0) on test;
* power: one variant whose true gain is the plan's smallest detectable gain
  (``plan.evidence.detectable_gain_sd``) at the same seeds;
* family: three variants, none with a real gain: the share of campaigns adopting any;
* slow starters: the futility stop rule (``engine/futility.py``) on a variant that trails the
  control early and wins at its end: the share of campaigns that drop it, and how early a
  variant at chance is still stopped.

Real trainings are in ``tests/close/test_calibration.py`` (40 campaigns on digits, slow).

Usage: python bench/calibration.py [--campaigns 400] [--out bench/results/calibration.md]
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from gpucampaign.close.bootstrap import spread_of
from gpucampaign.close.looks import look_alpha, seeds_to_buy
from gpucampaign.close.scores import Scores
from gpucampaign.close.verdict import RunEvidence, decide_verdict
from gpucampaign.config import DecisionRule
from gpucampaign.core.gain_interval import clears
from gpucampaign.plan.evidence import detectable_gain_sd

#: Rounds of seeds beyond the plan (the spec's default ``decision_point.rounds``).
ROUNDS = 2
RULE = DecisionRule(metric="score", direction="maximize", threshold=-1e9, min_gain=0.0)
SPLITS = ("val", "test")


@functools.lru_cache(maxsize=8)
def _ids(split: str, n: int) -> tuple[str, ...]:
    return tuple(f"{split}{i}" for i in range(n))


@dataclass(frozen=True)
class World:
    """The simulated experiment: ``n`` examples a split, ``seeds`` a run, the seed-to-seed
    standard deviation of one run's mean score ``seed_sd`` (of which the share ``shared`` is
    common to runs of the same seed), the per-example spread of each run's effect
    ``example_sd`` and the interaction ``noise_sd``."""

    n: int = 200
    seeds: int = 3
    seed_sd: float = 0.02
    shared: float = 0.5
    example_sd: float = 0.05
    noise_sd: float = 0.05


def _run_scores(
    rng: np.random.Generator,
    world: World,
    *,
    gain: float,
    seeds: Sequence[int],
    shared: dict[int, float],
    difficulty: dict[str, np.ndarray],
) -> RunEvidence:
    """One run (all its seeds) on both splits."""
    return _evidence(
        _seed_scores(rng, world, gain=gain, seeds=seeds, shared=shared, difficulty=difficulty)
    )


def _seed_scores(
    rng: np.random.Generator,
    world: World,
    *,
    gain: float,
    seeds: Sequence[int],
    shared: dict[int, float],
    difficulty: dict[str, np.ndarray],
) -> list[dict[str, Scores]]:
    """One run's per-example scores on both splits, one entry per seed."""
    own_sd = world.seed_sd * math.sqrt(1 - world.shared)
    effect = {s: rng.normal(scale=world.example_sd, size=world.n) for s in SPLITS}
    out: list[dict[str, Scores]] = []
    for seed in seeds:
        a = gain + shared[seed] + rng.normal(scale=own_sd)
        row = {}
        for split in SPLITS:
            y = difficulty[split] + effect[split] + a
            y = y + rng.normal(scale=world.noise_sd, size=world.n)
            row[split] = Scores(_ids(split, world.n), {"score": tuple(y.tolist())}, seed=seed)
        out.append(row)
    return out


def _evidence(per_seed: Sequence[dict[str, Scores]]) -> RunEvidence:
    """A run's evidence from its seeds' scores."""
    scores = {s: [x[s] for x in per_seed] for s in SPLITS}
    values = {s: float(np.mean([np.mean(x.values["score"]) for x in scores[s]])) for s in SPLITS}
    return RunEvidence(values=values, scores=scores, train_s=1.0)


#: Seeds drawn per run in a campaign with rounds: a round takes the next ones of the pool.
POOL = 24


def sequential(
    seed: int, world: World, *, gain: float, paired: bool, rounds: int
) -> tuple[str, str | None, int, int]:
    """One simulated campaign that buys rounds of seeds as the flow does: ``world.seeds`` a
    side planned, then while the verdict is inconclusive and names the seeds that would settle
    it (``close.looks.seeds_to_buy``), those seeds more of the control and the variant, and the
    verdict decided again at the error that look may spend (``close.looks.look_alpha``), up to
    ``rounds`` rounds (the lot's price is taken to fit).

    Returns:
        ``(kind, run, looks, seeds)``: the last verdict, the rounds bought, the seeds a side.
    """
    rng = np.random.default_rng(seed)
    shared_sd = world.seed_sd * math.sqrt(world.shared)
    shared = {s: float(rng.normal(scale=shared_sd)) for s in range(2 * POOL)}
    difficulty = {s: rng.normal(size=world.n) for s in SPLITS}
    draw = functools.partial(_seed_scores, rng, world, shared=shared, difficulty=difficulty)
    control = draw(gain=0.0, seeds=range(POOL))
    variant = draw(gain=gain, seeds=range(POOL) if paired else range(POOL, 2 * POOL))
    k, look = world.seeds, 0
    while True:
        v = decide_verdict(
            RULE,
            control=_evidence(control[:k]),
            variants={"v0": _evidence(variant[:k])},
            look=look,
            alpha=look_alpha(look),
        )
        more = seeds_to_buy(v, have=k) if look < rounds else None
        if not more or k >= POOL:
            return v.kind, v.run, look, k
        k, look = min(POOL, k + more), look + 1


def campaign(
    seed: int, world: World, *, gains: Sequence[float], paired: bool
) -> tuple[str, str | None, dict[str, dict[str, object]]]:
    """One simulated campaign: the control and one variant per true gain in ``gains``.

    Returns:
        ``(kind, run, variants)``: the verdict's kind, its run and its per-variant table.
    """
    rng = np.random.default_rng(seed)
    k = world.seeds
    all_seeds = range(k * (len(gains) + 1))
    # The part of a seed's effect shared by every run trained with that seed. The interaction
    # is scaled so that one run's mean over the split has the stated seed SD in total.
    shared_sd = world.seed_sd * math.sqrt(world.shared)
    shared = {s: float(rng.normal(scale=shared_sd)) for s in all_seeds}
    difficulty = {s: rng.normal(size=world.n) for s in SPLITS}
    control = _run_scores(
        rng, world, gain=0.0, seeds=range(k), shared=shared, difficulty=difficulty
    )
    variants = {}
    for j, g in enumerate(gains):
        seeds = range(k) if paired else range(k * (j + 1), k * (j + 2))
        variants[f"v{j}"] = _run_scores(
            rng, world, gain=g, seeds=seeds, shared=shared, difficulty=difficulty
        )
    v = decide_verdict(RULE, control=control, variants=variants)
    return v.kind, v.run, {name: row["test"] for name, row in v.variants.items()}


@dataclass(frozen=True)
class Rate:
    """``hits`` of ``n`` campaigns, with its 95% Wilson interval."""

    hits: int
    n: int

    @property
    def rate(self) -> float:
        """The share."""
        return self.hits / self.n

    def interval(self) -> tuple[float, float]:
        """The 95% Wilson score interval of the rate."""
        z, p, n = 1.959963984540054, self.rate, self.n
        mid = (p + z * z / (2 * n)) / (1 + z * z / n)
        half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
        return max(0.0, mid - half), min(1.0, mid + half)


def aa(world: World, *, campaigns: int, paired: bool, start: int = 0) -> tuple[Rate, Rate]:
    """A/A: ``(adopted, covered)`` over ``campaigns`` with one variant of no real gain."""
    adopted = covered = 0
    for c in range(campaigns):
        kind, _, table = campaign(start + c, world, gains=[0.0], paired=paired)
        adopted += kind == "adopt"
        low, high = table["v0"]["gain_ci95"]  # type: ignore[misc]
        covered += low <= 0.0 <= high
    return Rate(adopted, campaigns), Rate(covered, campaigns)


def tables(
    rng: np.random.Generator, world: World, *, gain: float, paired: bool
) -> tuple[np.ndarray, np.ndarray]:
    """One split's per-example scores ``(k, n)`` of the control and of a variant whose true
    gain is ``gain``, from the same model as ``campaign`` (arrays: the interval alone)."""
    k, n = world.seeds, world.n
    shared_sd = world.seed_sd * math.sqrt(world.shared)
    own_sd = world.seed_sd * math.sqrt(1 - world.shared)
    difficulty = rng.normal(size=n)
    common = rng.normal(scale=shared_sd, size=(k, 1))

    def run(g: float, seeds_shared: np.ndarray) -> np.ndarray:
        a = g + seeds_shared + rng.normal(scale=own_sd, size=(k, 1))
        effect = rng.normal(scale=world.example_sd, size=(1, n))
        return difficulty + effect + a + rng.normal(scale=world.noise_sd, size=(k, n))

    other = common if paired else rng.normal(scale=shared_sd, size=(k, 1))
    return run(0.0, common), run(gain, other)


def interval_rates(
    world: World, *, gain: float, paired: bool, reps: int, seed: int = 0
) -> tuple[Rate, Rate]:
    """``(adopted, covered)``: how often the verdict's one-sided test (the 95% interval's
    lower end above 0) adopts, and how often its 95% interval covers ``gain``, over ``reps``
    draws of ``tables``: the interval the verdict computes (``spread_of``), without the
    rest of the verdict (fast: thousands a second)."""
    rng = np.random.default_rng(seed)
    adopted = covered = 0
    for _ in range(reps):
        xc, xv = tables(rng, world, gain=gain, paired=paired)
        spread = spread_of(xc, xv, paired=paired)
        g = float(xv.mean() - xc.mean())
        half = spread.half_width()
        adopted += clears(g, bar=0.0, spread=spread, alpha=0.025)
        covered += g - half <= gain <= g + half
    return Rate(adopted, reps), Rate(covered, reps)


def run_sd(world: World) -> float:
    """The seed-to-seed standard deviation of one run's mean score over the split: its seed
    effect and its share of the interaction (the plan's unit)."""
    return math.sqrt(world.seed_sd**2 + world.noise_sd**2 / world.n)


def plan_gain(world: World, *, variants: int = 1) -> float:
    """The plan's smallest detectable gain in the score's units (one run's seed SD times the
    plan's figure in seed SDs)."""
    sd = detectable_gain_sd(world.seeds, variants=variants)
    assert sd is not None
    return sd * run_sd(world)


def power(world: World, *, campaigns: int, paired: bool, start: int = 0) -> Rate:
    """Adoption of one variant whose true gain is the plan's detectable gain."""
    gain = plan_gain(world)
    hits = 0
    for c in range(campaigns):
        kind, run, _ = campaign(start + c, world, gains=[gain], paired=paired)
        hits += (kind, run) == ("adopt", "v0")
    return Rate(hits, campaigns)


def family(world: World, *, campaigns: int, paired: bool, start: int = 0) -> Rate:
    """Three variants, none with a real gain: campaigns adopting any."""
    hits = 0
    for c in range(campaigns):
        kind, _, _ = campaign(start + c, world, gains=[0.0, 0.0, 0.0], paired=paired)
        hits += kind == "adopt"
    return Rate(hits, campaigns)


#: The simulated worlds: the plan's assumption (the seeds dominate, each run's seed noise its
#: own), and one where runs of the same seed share half their seed effect and the examples
#: matter.
WORLDS = {
    "seeds dominate": {"shared": 0.0, "example_sd": 0.01},
    "mixed": {"shared": 0.5, "example_sd": 0.05},
}


#: Examples of the simulated val split the futility rule reads.
SLOW_EXAMPLES = 200


def control_curve(share: float) -> float:
    """The control's accuracy at ``share`` of its steps: a fast learner, 0.85 at its end."""
    return 0.5 + 0.35 * (1 - math.exp(-8 * share))


def slow_starter(share: float) -> float:
    """A slow starter (a lower learning rate): ~0.09 behind the control at a quarter of its
    steps, ahead at its end (0.88 against 0.85): the true best variant."""
    return 0.5 + 0.40 * (1 - math.exp(-3 * share))


def futility_stops(
    acc_v: Callable[[float], float], *, campaigns: int = 200, plain: bool = False
) -> list[float | None]:
    """Per simulated campaign, the share of its steps at which the futility check stops a
    variant whose accuracy follows ``acc_v(share)`` against ``control_curve``, on
    ``SLOW_EXAMPLES`` examples, checked every 5% of the run from the grace (25%) on; None when
    it runs to its end. An example is right while its own draw is under the run's accuracy, so
    the same examples stay right as a run learns. ``plain``: the rule before error spending,
    the 95% interval's upper end under 0 at any look."""
    from gpucampaign.engine.futility import EvalScores, futility_check

    ids = tuple(f"r{i:03d}" for i in range(SLOW_EXAMPLES))
    out: list[float | None] = []
    for c in range(campaigns):
        rng = np.random.default_rng(c)
        u_c, u_v = rng.random(SLOW_EXAMPLES), rng.random(SLOW_EXAMPLES)
        stop = None
        for look in range(25, 100, 5):
            share = look / 100
            control = EvalScores(
                step=10,
                planned=40,
                metric="accuracy",
                split="val",
                ids=ids,
                values=(u_c < control_curve(share)) * 1.0,
            )
            check = futility_check(
                control,
                ids=ids,
                values=(u_v < acc_v(share)) * 1.0,
                step=round(share * 400),
                planned=400,
                direction="maximize",
                min_gain=0.0,
            )
            if check is not None and (check.ci95[1] < 0 if plain else check.futile):
                stop = share
                break
        out.append(stop)
    return out


def _slow_rows(n: int) -> list[str]:
    """The futility rule on slow starters: the winner dropped (error spent over the looks, and
    the plain interval before it), and a variant at chance stopped by 35% of its steps."""
    spent = futility_stops(slow_starter, campaigns=n)
    plain = futility_stops(slow_starter, campaigns=n, plain=True)
    chance = futility_stops(lambda share: 0.5, campaigns=n)
    dropped = Rate(sum(s is not None for s in spent), n)
    dropped_plain = Rate(sum(s is not None for s in plain), n)
    early = Rate(sum(s is not None and s <= 0.35 for s in chance), n)
    world = "slow starters"
    return [
        _row(world, "true winner dropped by the futility rule", "-", 1, dropped, "<= 0.05"),
        _row(world, "same, at the plain 95% interval (before)", "-", 1, dropped_plain, "-"),
        _row(world, "variant at chance stopped by 35% of its steps", "-", 1, early, ">= 0.95"),
    ]


def _row(world: str, what: str, path: str, seeds: int, r: Rate, bound: str) -> str:
    lo, hi = r.interval()
    return (
        f"| {world} | {what} | {path} | {seeds} | {r.n} | {r.hits} | {r.rate:.3f} | "
        f"[{lo:.3f}, {hi:.3f}] | {bound} |"
    )


def _rows(name: str, world: World, *, n: int, paired: bool) -> list[str]:
    path, k = ("paired" if paired else "unpaired"), world.seeds
    adopted, covered = aa(world, campaigns=n, paired=paired, start=10_000)
    gain = f"power at the plan's gain ({plan_gain(world):.4f})"
    return [
        _row(name, "A/A adoption", path, k, adopted, "<= 0.05"),
        _row(name, "A/A coverage of the 95% CI", path, k, covered, "0.90-0.99"),
        _row(
            name, gain, path, k, power(world, campaigns=n, paired=paired, start=20_000), ">= 0.80"
        ),
        _row(
            name,
            "any of 3 null variants adopted",
            path,
            k,
            family(world, campaigns=n, paired=paired, start=30_000),
            "<= 0.05",
        ),
    ]


def _round_rows(name: str, world: World, *, n: int, paired: bool, rounds: int) -> list[str]:
    """A campaign that buys up to ``rounds`` rounds of seeds: A/A adoption over every look,
    and the power at the plan's gain for its planned seeds (3 a side when it plans one)."""
    path, k = ("paired" if paired else "unpaired"), world.seeds
    aa_runs = [
        sequential(40_000 + c, world, gain=0.0, paired=paired, rounds=rounds) for c in range(n)
    ]
    gain = plan_gain(replace(world, seeds=max(3, k)))
    pw = [sequential(50_000 + c, world, gain=gain, paired=paired, rounds=rounds) for c in range(n)]
    bought = Rate(sum(r[2] > 0 for r in aa_runs), n)
    what = f"with up to {rounds} rounds"
    return [
        _row(name, f"A/A adoption over every look, {what}", path, k, _adopted(aa_runs), "<= 0.05"),
        _row(name, f"A/A campaigns that bought a round, {what}", path, k, bought, "-"),
        _row(
            name, f"power at the plan's gain ({gain:.4f}), {what}", path, k, _adopted(pw), ">= 0.80"
        ),
    ]


def _adopted(runs: Sequence[tuple[str, str | None, int, int]]) -> Rate:
    return Rate(sum((kind, run) == ("adopt", "v0") for kind, run, _, _ in runs), len(runs))


def main(argv: list[str] | None = None) -> int:
    """Run the settings and write the markdown table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--campaigns", type=int, default=300, help="campaigns per setting")
    p.add_argument("--out", default="bench/results/calibration.md")
    args = p.parse_args(argv)
    n = args.campaigns
    rows = []
    for name, params in WORLDS.items():
        for seeds in (3, 5):
            for paired in (True, False):
                rows += _rows(name, World(seeds=seeds, **params), n=n, paired=paired)
            print(f"{name}, {seeds} seeds done", file=sys.stderr)
        for seeds in (1, 3):
            for paired in (True, False):
                world = World(seeds=seeds, **params)
                rows += _round_rows(name, world, n=n, paired=paired, rounds=ROUNDS)
            print(f"{name}, {seeds} seeds with rounds done", file=sys.stderr)
    rows += _slow_rows(n)
    w = World()
    text = "\n".join(
        [
            "# Calibration of the verdict (simulated campaigns)",
            "",
            f"Written by `python bench/calibration.py --campaigns {n}`: {n} simulated campaigns "
            f"per row ({len(rows) * n} in all), decided by the close's own `decide_verdict` "
            "(selection on val, the t-interval on test, Holm over the variants). Simulated, "
            "not trained: per-example scores drawn from the variance-components model "
            f"(`core/gain_interval.py`; {w.n} examples a split, seed SD {w.seed_sd} of one "
            f"run's mean, interaction SD {w.noise_sd}). *seeds dominate*: each run's seed "
            "noise its own, per-example effect SD 0.01 (the plan's assumption: the power there "
            "is the plan's 80%); *mixed*: runs of one seed share half their seed effect "
            "(pairing by seed removes it) and per-example effect SD 0.05. *paired*: the "
            "variants trained with the control's seeds; *unpaired*: with their own. The power "
            "rows' gain is the plan's `detectable_gain_sd` times one run's seed SD. Real tiny "
            "trainings: `tests/close/test_calibration.py` (digits, 20 campaigns a setting). "
            "Each rate with its 95% Wilson interval. The rows *with up to 2 rounds* are "
            "campaigns that buy rounds of seeds beyond their plan as the flow does "
            "(`close/rounds.py`: while the verdict is inconclusive and names the seeds that "
            "would settle it, those seeds more of the control and the chosen variant, decided "
            "again at 2.5% / 2^j one-sided after the j-th round, `close/looks.py`); their A/A row "
            "counts an adoption at any look; their power row's gain is the plan's at 3 seeds a "
            "side (the seeds the plan proposes when it is given one). *slow starters*: the "
            "futility stop rule's own `futility_check` on a variant 0.09 behind the control at "
            "a quarter of its steps and 0.03 ahead at its end, checked every 5% of the run "
            "from the grace (25%) on, 200 val examples.",
            "",
            "| world | setting | path | seeds a side | campaigns | hits | rate | 95% CI | bound |",
            "|---|---|---|---|---|---|---|---|---|",
            *rows,
            "",
        ]
    )
    Path(args.out).write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
