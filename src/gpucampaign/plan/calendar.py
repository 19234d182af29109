"""The calendar planner: steps -> lanes -> span, window fit, options.

Pure functions, no Prefect. The planner places every step of the spec's calendar on a lane:

* a GPU step takes one GPU lane; there is one lane per GPU of the committed lots (a B200
  lot gives two, ``count: 2`` gives two). Two GPU steps never share a lane at the same time,
  whatever the table says;
* a human step takes one of the ``people`` human lanes;
* a ``cpu`` or ``none`` machine step needs no scarce lane and may overlap GPU work; it is
  drawn on a ``host`` lane only so that the chart stays readable.

Scheduling is deterministic list scheduling: a step is ready when every step it waits for
has ended; ready steps start as soon as a lane of their kind is free, by tier (essential,
then useful, then exploratory), then the longest remaining chain, then table order. No lane
idles while a ready step waits for it, so the span never exceeds the sum of the hours.

The span runs from the first start (hour 0) to the last end. ``uncommitted = window - span``
only checks the calendar: none of these hours is a duration promised by the provider.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from gpucampaign.config import CampaignSpec
from gpucampaign.core.gcpause import without_gc_pauses
from gpucampaign.plan.evidence import evidence_lines, seed_evidence
from gpucampaign.plan.machines import Machine, lane_machine, lot_machines
from gpucampaign.plan.options import Option, options_for
from gpucampaign.plan.planner import Context, reduce_drops
from gpucampaign.plan.rental import RETRIEVAL_WORDS, Rental, deadline_warnings, rental_of
from gpucampaign.plan.schedule import EPS, TIER_RANK, ScheduledStep, round_hours, say_hours
from gpucampaign.plan.tariffs import Catalog, ResolvedPackage, format_usd, usd

__all__ = [
    "TIER_RANK",
    "Option",
    "Plan",
    "ScheduledStep",
    "VariantFactors",
    "ablation_of",
    "plan",
    "reduce_to_fit",
    "render_markdown",
]

# What an end-to-end calendar with GPU work must contain. Matched as lower-case substrings of
# each step's name and description.
_REQUIRED_PARTS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("loading", ("load", "download", "ingest", "fetch", "audit"), "loading the inputs"),
    ("validation", ("valid", "eval", "score", "benchmark"), "validation/evaluation"),
    (
        "output writing",
        ("output", "predict", "export", "artifact", "manifest", "report"),
        "writing the output files",
    ),
    ("checkpoint write", ("save", "checkpoint write", "write checkpoint"), "an early save"),
    (
        "checkpoint transfer",
        ("transfer", "upload", "sync", "backup", "copy"),
        "moving checkpoints to storage",
    ),
    ("checkpoint restore", ("restore", "reload", "resume", "restart"), "a reload in a new process"),
    ("results retrieval", RETRIEVAL_WORDS, "getting the files back before the lot ends"),
)


_RETRIEVAL = re.compile("|".join(map(re.escape, RETRIEVAL_WORDS)))


# --- results -----------------------------------------------------------------------------


@dataclass(frozen=True)
class VariantFactors:
    """Which factors a variant changes from the control."""

    variant: str
    tier: str
    combined: bool
    changes: tuple[tuple[str, Any, Any], ...]  # (factor, control value, variant value)

    @property
    def factors(self) -> tuple[str, ...]:
        """Names of the changed factors."""
        return tuple(c[0] for c in self.changes)

    def to_dict(self) -> dict[str, Any]:
        """The ``ablation[]`` entry of ``campaign plan --json``."""
        return {
            "variant": self.variant,
            "tier": self.tier,
            "combined": self.combined,
            "factors": list(self.factors),
            "changes": {f: {"control": c, "variant": v} for f, c, v in self.changes},
        }


@dataclass(frozen=True)
class Plan:
    """A scheduled calendar and what it costs. Frozen: the campaign keeps it as written."""

    name: str
    window_hours: float
    span_hours: float
    machine_hours: float
    gpu_hours: float
    human_hours: float
    total_price_usd: Decimal
    gpu_lanes: int
    human_lanes: int
    steps: tuple[ScheduledStep, ...]
    packages: tuple[ResolvedPackage, ...]
    options: tuple[Option, ...] = ()
    warnings: tuple[str, ...] = ()
    ablation: tuple[VariantFactors, ...] = ()
    dropped: tuple[str, ...] = ()
    hours_override: tuple[tuple[str, float], ...] = field(default=())
    rental: Rental | None = None
    evidence: dict[str, Any] | None = None  # plan.evidence.seed_evidence: what the rule needs
    machines: tuple[Machine, ...] = ()  # one per lot, each with its GPU lanes

    def machine(self, step: ScheduledStep) -> str:
        """The machine and GPU a step runs on, ``lot 2 / gpu0`` (``""`` off the GPUs)."""
        return lane_machine(self.machines, step.lane)

    @property
    def fits(self) -> bool:
        """True when the span fits inside the window."""
        return self.span_hours <= self.window_hours + EPS

    @property
    def uncommitted_hours(self) -> float:
        """Window hours no step uses (0 when the calendar overruns)."""
        return max(0.0, self.window_hours - self.span_hours)

    @property
    def overrun_hours(self) -> float:
        """Hours the span exceeds the window by (0 when it fits)."""
        return max(0.0, self.span_hours - self.window_hours)

    def step(self, name: str) -> ScheduledStep:
        """The scheduled step of that name (KeyError when absent or dropped)."""
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        """The object ``campaign plan --json`` prints (and ``plan.json`` stores)."""
        return {
            "name": self.name,
            "span_hours": round_hours(self.span_hours),
            "window_hours": round_hours(self.window_hours),
            "uncommitted_hours": round_hours(self.uncommitted_hours),
            "overrun_hours": round_hours(self.overrun_hours),
            "fits": self.fits,
            "machine_hours": round_hours(self.machine_hours),
            "gpu_hours": round_hours(self.gpu_hours),
            "human_hours": round_hours(self.human_hours),
            "total_price_usd": usd(self.total_price_usd),
            "gpu_lanes": self.gpu_lanes,
            "human_lanes": self.human_lanes,
            "steps": [{**s.to_dict(), "machine": self.machine(s)} for s in self.steps],
            "machines": [m.to_dict() for m in self.machines],
            "packages": [p.to_dict() for p in self.packages],
            "options": [o.to_dict() for o in self.options],
            "warnings": list(self.warnings),
            "ablation": [a.to_dict() for a in self.ablation],
            "dropped": list(self.dropped),
            "hours_override": {k: round_hours(v) for k, v in self.hours_override},
            "starts_at": self.rental.to_dict()["starts_at"] if self.rental else None,
            "ends_at": self.rental.to_dict()["ends_at"] if self.rental else None,
            "rental": self.rental.to_dict() if self.rental else None,
            "evidence": self.evidence,
        }


# --- public API --------------------------------------------------------------------------


@without_gc_pauses()
def plan(
    spec: CampaignSpec,
    *,
    catalog: Catalog | None = None,
    base_dir: str | Path | None = None,
    hours_override: Mapping[str, float] | None = None,
    drop: Collection[str] = (),
) -> Plan:
    """Schedule the spec's calendar on its lots and check it against the window.

    Args:
        spec: The campaign spec.
        catalog: Catalog to price the lots with; by default the built-in one plus the spec's
            ``catalog`` file (resolved inside ``base_dir``).
        base_dir: Folder of the spec file, needed only when the spec names a ``catalog``.
        hours_override: New hours for some steps, by step name (the re-forecast after the
            pilot).
        drop: Steps to remove (decision "reduce"). A step that waited for a dropped step now
            waits for what the dropped step waited for.

    Returns:
        The frozen plan; ``options`` is filled when it does not fit.

    Raises:
        SpecError: Unknown GPU or lot, no price, a window shorter than every lot, non-finite
            hours, or an unknown step in ``hours_override``/``drop``.
    """
    ctx = Context.build(spec, catalog=catalog, base_dir=base_dir, hours_override=hours_override)
    dropped = ctx.check_names(drop, field="drop")
    sched = ctx.schedule(dropped)
    options = () if ctx.fits(sched) else tuple(options_for(ctx, dropped, sched))
    ablation, ablation_warnings = ablation_of(spec)
    warnings = [*ctx.warnings, *_dropped_warnings(ctx, dropped), *_missing_parts(ctx, dropped)]
    warnings += ablation_warnings + _runs_without_steps(spec)
    kept = ctx.kept(dropped)
    rental = rental_of(spec)
    warnings += _deadline(spec, rental, ctx=ctx, kept=kept, steps=sched.steps)
    hours, kinds, resources = ctx.hours, ctx.kinds, ctx.resources
    gpu_hours = sum(hours[i] for i in kept if resources[i] == "gpu")
    spare = ctx.gpu_lanes * ctx.window - gpu_hours
    return Plan(
        name=spec.name,
        window_hours=ctx.window,
        span_hours=sched.span,
        machine_hours=sum(hours[i] for i in kept if kinds[i] == "machine"),
        gpu_hours=gpu_hours,
        human_hours=sum(hours[i] for i in kept if kinds[i] == "human"),
        total_price_usd=ctx.price,
        gpu_lanes=ctx.gpu_lanes,
        human_lanes=ctx.human_lanes,
        steps=sched.steps,
        packages=ctx.packages,
        options=options,
        warnings=tuple(warnings),
        ablation=ablation,
        dropped=tuple(n for n in ctx.names if n in dropped) if dropped else (),
        hours_override=tuple(sorted(ctx.overrides.items())),
        rental=rental,
        evidence=seed_evidence(spec, steps=sched.steps, spare_gpu_hours=spare),
        machines=lot_machines(spec, ctx.packages),
    )


def reduce_to_fit(
    spec: CampaignSpec,
    *,
    hours_override: Mapping[str, float] | None = None,
    catalog: Catalog | None = None,
    base_dir: str | Path | None = None,
) -> tuple[Plan, list[str]]:
    """Drop exploratory steps, then useful ones, until the calendar fits its window.

    Within a tier the longest steps go first; steps whose removal turned out unnecessary are
    then put back, so the dropped set is small. Essential steps are never dropped.

    Args:
        spec: The campaign spec.
        hours_override: New hours for some steps, by step name.
        catalog: See :func:`plan`.
        base_dir: See :func:`plan`.

    Returns:
        The plan without the dropped steps, and their names in table order. ``plan.fits`` is
        False when even the essential steps alone do not fit.
    """
    ctx = Context.build(spec, catalog=catalog, base_dir=base_dir, hours_override=hours_override)
    dropped, _ = reduce_drops(ctx, frozenset())
    names = [n for n in ctx.names if n in dropped]
    return (plan(spec, catalog=ctx.catalog, hours_override=hours_override, drop=names), names)


def ablation_of(spec: CampaignSpec) -> tuple[tuple[VariantFactors, ...], list[str]]:
    """Factors each variant changes from the control, and hygiene warnings.

    Warns about a variant that changes nothing, one that changes several factors without
    ``combined: true``, and variants that together form a full grid of combinations.
    """
    if spec.control is None or not spec.variants:
        return (), []
    # gpus: 1 is left out of a dump (see RunConfig): it is put back to compare.
    control = {"gpus": spec.control.gpus, **spec.control.model_dump(mode="json")}
    result: list[VariantFactors] = []
    warnings: list[str] = []
    for v in spec.variants:
        config = spec.run_config(v.name)
        resolved = {"gpus": config.gpus, **config.model_dump(mode="json")}
        changes = tuple(
            (k, control[k], resolved[k]) for k in sorted(v.changes) if resolved[k] != control[k]
        )
        result.append(VariantFactors(v.name, v.tier, v.combined, changes))
        factors = [c[0] for c in changes]
        if not changes:
            warnings.append(
                f"variant '{v.name}' changes nothing from the control: it cannot inform the "
                "decision; change one factor or remove it."
            )
        elif len(changes) > 1 and not v.combined:
            warnings.append(
                f"variant '{v.name}' changes {len(changes)} factors at once "
                f"({', '.join(factors)}): a difference could not be attributed to one cause; "
                "split it into one-factor variants, or set combined: true if the combination "
                "is the question."
            )
    warnings += _full_grids(control, result)
    return tuple(result), warnings


def _full_grids(control: dict[str, Any], variants: list[VariantFactors]) -> list[str]:
    """Warn when control + variants cover every combination of two or more factors."""
    warnings = []
    seen: set[tuple[str, ...]] = set()
    for vf in variants:
        factors = vf.factors
        if len(factors) < 2 or factors in seen:
            continue
        seen.add(factors)
        configs = {tuple(_key(control[f]) for f in factors)}
        for other in variants:
            if other.factors and set(other.factors) <= set(factors):
                values = {f: v for f, _, v in other.changes}
                configs.add(tuple(_key(values.get(f, control[f])) for f in factors))
        levels = [len({c[i] for c in configs}) for i in range(len(factors))]
        if math.prod(levels) == len(configs):
            warnings.append(
                f"the variants form a full grid of every combination of {' x '.join(factors)} "
                f"({len(configs)} runs with the control): keep the ablation small and "
                "interpretable: change one factor at a time, combine only what the decision "
                "needs."
            )
    return warnings


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


# --- warnings ----------------------------------------------------------------------------


def _missing_parts(ctx: Context, dropped: frozenset[str]) -> list[str]:
    kept = ctx.kept(dropped)
    if not any(ctx.resources[i] == "gpu" for i in kept):
        return []
    # One string of every kept step's text: a word (no newline in it) is in that string
    # exactly when it is in one step's text. One substring search per word, not per step.
    texts = "\n".join(map(ctx.texts.__getitem__, kept))
    return [
        f"the calendar has GPU steps but no {part} step ({why}); add one with its own hours "
        f"(steps are matched by name/description words such as '{words[0]}')."
        for part, words, why in _REQUIRED_PARTS
        if not any(w in texts for w in words)
    ]


def _deadline(
    spec: CampaignSpec,
    rental: Rental | None,
    *,
    ctx: Context,
    kept: list[int],
    steps: tuple[ScheduledStep, ...],
) -> list[str]:
    texts = ctx.texts
    names = {ctx.names[i] for i in kept if _RETRIEVAL.search(texts[i])}
    ends = {s.name: s.end_hours for s in steps if s.name in names}
    undated = sum(1 for p in spec.packages if p.starts_at is None)
    return deadline_warnings(rental, retrieval=ends, undated=undated)


def _dropped_warnings(ctx: Context, dropped: frozenset[str]) -> list[str]:
    return [
        f"essential step '{n}' is dropped: the campaign may not reach its decision."
        for n, tier in zip(ctx.names, ctx.tiers, strict=True)
        if n in dropped and tier == "essential"
    ]


def _runs_without_steps(spec: CampaignSpec) -> list[str]:
    planned = {s.run for s in spec.calendar if s.run}
    return [
        f"run '{r}' has no calendar step (no step with run: {r}): its GPU time is not planned."
        for r in spec.run_names()
        if r not in planned
    ]


# --- presentation ------------------------------------------------------------------------


def render_markdown(plan: Plan) -> str:
    """The plan as Markdown (for a Prefect artifact or a report)."""
    lines = [f"## Calendar of `{plan.name}`", "", _markdown_summary(plan), ""]
    lines += [
        "| step | kind | tier | lane | machine | start h | end h | hours |",
        "|---|---|---|---|---|---:|---:|---:|",
    ]
    for s in sorted(plan.steps, key=lambda s: (s.start_hours, s.lane)):
        kind = s.kind if s.kind == "human" else f"machine/{s.resource}"
        lines.append(
            f"| {s.name} | {kind} | {s.tier} | {s.lane} | {plan.machine(s)} | "
            f"{say_hours(s.start_hours)} | "
            f"{say_hours(s.end_hours)} | {say_hours(s.hours)} |"
        )
    if plan.dropped:
        lines += ["", f"Dropped: {', '.join(plan.dropped)}."]
    if plan.options:
        lines += ["", "### Options", ""]
        lines += [
            f"- **{o.kind}**: {o.description}" + (f" Requires: {o.requires}." if o.requires else "")
            for o in plan.options
        ]
    if plan.ablation:
        lines += ["", "### Ablation", ""] + [
            f"- `{a.variant}` ({a.tier}): {', '.join(a.factors) or 'changes nothing'}"
            for a in plan.ablation
        ]
    if plan.evidence:
        lines += ["", "### Evidence", ""] + [
            f"- {line.removeprefix('evidence: ')}" for line in evidence_lines(plan.evidence)
        ]
    if plan.warnings:
        lines += ["", "### Warnings", ""] + [f"- {w}" for w in plan.warnings]
    return "\n".join(lines) + "\n"


def _markdown_summary(plan: Plan) -> str:
    """The sentence under the title: span, window, verdict, hours, lots and price."""
    verdict = (
        f"fits, {say_hours(plan.uncommitted_hours)} h uncommitted"
        if plan.fits
        else f"does NOT fit: {say_hours(plan.overrun_hours)} h over"
    )
    lots = ", ".join(
        f"{p.count} x {p.days}-day {p.gpu} lot "
        f"({p.gpus_per_lot} GPU/lot, {format_usd(p.price_usd)})"
        for p in plan.packages
    )
    return (
        f"Span **{say_hours(plan.span_hours)} h** in a {say_hours(plan.window_hours)} h "
        f"window: {verdict}. Machine {say_hours(plan.machine_hours)} h "
        f"(GPU {say_hours(plan.gpu_hours)} h), human {say_hours(plan.human_hours)} h. "
        f"Lots: {lots}; total {format_usd(plan.total_price_usd)}."
    )
