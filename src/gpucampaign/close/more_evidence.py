"""What would settle an inconclusive verdict: more examples or more seeds (whichever source of
variance dominates first), what the seeds cost, or the per-example scores a gain without an
interval lacks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpucampaign.close.bootstrap import DOMINATES, Gain, to_resolve
from gpucampaign.config import DecisionRule
from gpucampaign.core.text import say_hours, say_number
from gpucampaign.plan.evidence import PROPOSED_SEEDS

#: Why an interval over one seed a side cannot decide, as the verdict says it.
NOISE_NOT_MEASURED = (
    "training noise is not measured (one seed a side: the interval covers which examples the "
    "split holds, not what another training seed would give)"
)


def missing_interval(rule: DecisionRule, entry: Mapping[str, Any]) -> dict[str, Any]:
    """What a gain without an interval lacks, and what to add to get one."""
    why = (
        f"no per-example {rule.metric} on {rule.report_split}: "
        f"{entry.get('no_interval') or 'no run has per-example rows'}"
    )
    return {
        "more_examples": None,
        "more_seeds": None,
        "seed_hours": None,
        "missing": "per-example scores",
        "why": why,
        "text": (
            f"Missing: {why}. To get an interval, add to the recipe a score(model, batch) that "
            f"returns {{'{rule.metric}': one value per example}} (see the README's recipe "
            "section) and run the campaign again (the edited recipe gives new run IDs)."
        ),
    }


def seeds_to_measure_noise(
    rule: DecisionRule,
    chosen: str,
    *,
    entry: Mapping[str, Any],
    seconds: Mapping[str, float | None],
    lot: Mapping[str, float] | None,
) -> dict[str, Any]:
    """What settles a comparison of one seed a side: seeds of both runs, up to the
    ``PROPOSED_SEEDS`` the plan proposes, priced from their measured training time; never more
    examples alone (they cannot measure training noise)."""
    seeds = entry.get("seeds") or {}
    have = min(len(seeds.get("control") or [0]), len(seeds.get("variant") or [0]))
    more = max(1, PROPOSED_SEEDS - have)
    priced, cost = _price(
        more, control=seconds.get("control"), variant=seconds.get(chosen), lot=lot
    )
    text = (
        f"Training noise is not measured: with one seed a side the interval covers which "
        "examples the split holds, not what another training seed would give, so more "
        f"examples alone cannot settle it. To settle it: {seeds_to_write(chosen, entry, more)}, "
        f"{more} more seed(s) of both{cost}."
    )
    settle = f"{more} more seed(s) of both 'control' and '{chosen}'{cost} would settle it"
    return {
        "factor": None,
        "more_examples": None,
        "more_seeds": more,
        "dominates": None,
        "training_noise": "not measured",
        **priced,
        "text": text,
        "settle": settle,
    }


def seeds_to_write(chosen: str, entry: Mapping[str, Any], more: int) -> str:
    """The exact ``seeds:`` to write on the control and the chosen variant for ``more`` more
    seeds of both (the next numbers above the highest either has, the same on both sides: the
    runs stay paired by seed), and where to run it."""
    seeds = entry.get("seeds") or {}
    again = (
        "in the spec and run it again into the same --out (the finished runs are reused, only "
        "the new seeds train)"
    )
    if not seeds:  # one seed a side: its number is the spec's, not the verdict's
        return (
            f"write seeds: [s, s + 1, ..., s + {more}] on 'control' and on '{chosen}' (s: the "
            f"run's own seed, first; the same seeds on both keep them paired) {again}"
        )
    have = {"control": list(seeds.get("control") or []), chosen: list(seeds.get("variant") or [])}
    top = max(k for s in have.values() for k in s)
    new = list(range(top + 1, top + 1 + more))
    said = " and ".join(f"seeds: {[*s, *new]} on '{b}'" for b, s in have.items())
    return f"write {said} {again}"


def _price(
    more: int | None,
    *,
    control: float | None,
    variant: float | None,
    lot: Mapping[str, float] | None,
) -> tuple[dict[str, Any], str]:
    """What ``more`` seeds of both runs cost, from one seed's measured training time of each:
    the numbers, and the clause that says them."""
    priced: dict[str, Any] = {"seed_s": None, "gpu_hours": None, "usd": None, "lot_share": None}
    if control is None or variant is None or more is None:
        return priced, " (their training time was not measured)"
    per_seed = control + variant
    gpu_h = more * per_seed / 3600
    priced.update(seed_s=round(per_seed, 9), gpu_hours=round(gpu_h, 12))
    cost = (
        f": {more} x ({control:.3g} s + {variant:.3g} s of measured training) = "
        f"{say_hours(gpu_h)} of GPU time"
    )
    if lot and lot.get("gpu_hours"):
        usd = gpu_h * lot["usd"] / lot["gpu_hours"]
        share = usd / lot["usd"] if lot["usd"] else 0.0
        priced.update(usd=round(usd, 12), lot_share=round(share, 12))
        money = f"{usd:.2f} USD" if usd >= 0.005 else "under 0.01 USD"
        cost += (
            f", {money} at the lot's price ({say_number(100 * share, digits=2)}% of the "
            f"{lot['usd']:.2f} USD for {lot['gpu_hours']:g} GPU hours)"
        )
    return priced, cost


def to_settle(
    rule: DecisionRule,
    chosen: str,
    *,
    entry: Mapping[str, Any],
    seconds: Mapping[str, float | None],
    lot: Mapping[str, float] | None,
) -> dict[str, Any]:
    """How many more examples or seeds would settle an inconclusive verdict, and what the
    seeds cost (with one seed a side, only seeds: ``seeds_to_measure_noise``): priced from
    the runs' measured training time (``seconds`` per seed), as GPU time and as the share of
    the rented lot's price it takes (``lot``: ``usd``, ``gpu_hours``).
    """
    if entry.get("n") is None:
        return missing_interval(rule, entry)
    if entry.get("training_noise") != "measured":
        return seeds_to_measure_noise(rule, chosen, entry=entry, seconds=seconds, lot=lot)
    seeds = entry.get("seeds") or {}
    g = Gain(
        gain=entry["gain"],
        ci95=tuple(entry["gain_ci95"]),
        n=entry["n"],
        replicates=entry["replicates"] or 1,
        control_seeds=tuple(seeds.get("control", ())),
        variant_seeds=tuple(seeds.get("variant", ())),
        seed_var=entry.get("seed_var"),
        example_var=entry.get("example_var"),
    )
    need = to_resolve(g, min_gain=max(rule.min_gain, 1e-12))
    none = {"seed_s": None, "gpu_hours": None, "usd": None, "lot_share": None}
    if need["factor"] is None:
        return {
            **need,
            **none,
            "text": "The gain equals the min gain: no amount of evidence separates them.",
        }
    priced, cost = _price(
        need["more_seeds"], control=seconds.get("control"), variant=seconds.get(chosen), lot=lot
    )
    if need["dominates"] is not None:
        return {**need, **priced, **_by_source(rule, chosen, need=need, entry=entry, cost=cost)}
    text = (
        f"To resolve it: about {need['more_examples']} more {rule.report_split} examples "
        f"({need['factor']:.2f} x the {g.n} there; labelling them is a human step), or "
        f"{need['more_seeds']} more seed(s) of both 'control' and '{chosen}'{cost}."
    )
    return {**need, **priced, "text": text}


def _by_source(
    rule: DecisionRule, chosen: str, *, need: Mapping[str, Any], entry: Mapping[str, Any], cost: str
) -> dict[str, str]:
    """With replicates: which source of variance dominates, and the evidence of that kind
    first (``text``; ``settle``, the answer's clause)."""
    rep, dom = rule.report_split, need["dominates"]
    share = entry.get("seed_share")
    said = DOMINATES[dom]
    head = (
        said[0].upper()
        + said[1:]
        + (
            f" ({say_number(100 * share, digits=2)}% of the gain's variance comes from the seeds)"
            if share is not None
            else ""
        )
    )
    seeds = (
        f"{need['more_seeds']} more seed(s) of both 'control' and '{chosen}'{cost} ("
        f"{seeds_to_write(chosen, entry, need['more_seeds'])})"
        if need["more_seeds"] is not None
        else "more seeds alone cannot settle it (the examples' share of the variance is "
        "already above what the interval may keep)"
    )
    examples = (
        f"about {need['more_examples']} more {rep} examples (labelling them is a human step)"
        if need["more_examples"] is not None
        else f"more {rep} examples alone cannot settle it (the seeds' share of the variance "
        "is already above what the interval may keep)"
    )
    first, second = (seeds, examples) if dom == "seeds" else (examples, seeds)
    fits = need["more_seeds" if dom == "seeds" else "more_examples"] is not None
    return {
        "text": f"{head}. To resolve it: {first}; or {second}.",
        "settle": f"{said}; {first}" + (" would settle it" if fits else ""),
    }
