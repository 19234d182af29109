"""The calendar planner: steps -> lanes -> span, window fit, options (R4-R9).

Pure functions, no Prefect. The planner places every step of the spec's calendar on a lane:

* a GPU step takes one GPU lane; there is one lane per GPU of the committed lots (a B200
  lot gives two, ``count: 2`` gives two). Two GPU steps never share a lane at the same time,
  whatever the table says (R5);
* a human step takes one of the ``people`` human lanes;
* a ``cpu`` or ``none`` machine step needs no scarce lane and may overlap GPU work; it is
  drawn on a ``host`` lane only so that the chart stays readable.

Scheduling is deterministic list scheduling: a step is ready when every step it waits for
has ended; ready steps start as soon as a lane of their kind is free, by tier (essential,
then useful, then exploratory), then the longest remaining chain, then table order. No lane
idles while a ready step waits for it, so the span never exceeds the sum of the hours.

The span runs from the first start (hour 0) to the last end. ``uncommitted = window - span``
only checks the calendar: none of these hours is a duration promised by the provider (R6).
"""

from __future__ import annotations

import heapq
import json
import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from itertools import pairwise
from pathlib import Path
from typing import Any

from gpucampaign.spec import CampaignSpec, SpecError
from gpucampaign.tariffs import (
    Catalog,
    ResolvedPackage,
    format_usd,
    load_catalog,
    resolve_package,
    usd,
)

TIER_RANK = {"essential": 0, "useful": 1, "exploratory": 2}
_EPS = 1e-9
# Above this many newly dropped steps, reduce_to_fit skips the pass that puts back steps whose
# removal turned out unnecessary: each try is a full re-plan, and such a set is large anyway.
_PRUNE_LIMIT = 64

# What an end-to-end calendar with GPU work must contain (R4, R12). Matched as lower-case
# substrings of each step's name and description.
_REQUIRED_PARTS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("loading", ("load", "download", "ingest", "fetch", "audit"), "R4: loading the inputs"),
    ("validation", ("valid", "eval", "score", "benchmark"), "R4: validation/evaluation"),
    (
        "output writing",
        ("output", "predict", "export", "artifact", "manifest", "report"),
        "R4: writing the output files",
    ),
    ("checkpoint write", ("save", "checkpoint write", "write checkpoint"), "R12: an early save"),
    (
        "checkpoint transfer",
        ("transfer", "upload", "sync", "backup", "copy"),
        "R12: moving checkpoints to storage",
    ),
    ("checkpoint restore", ("restore", "reload", "resume", "restart"), "R12: a reload in a new process"),
    (
        "results retrieval",
        ("retriev", "download", "collect", "get back"),
        "R12: getting the files back before the lot ends",
    ),
)


# --- results -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScheduledStep:
    """One step placed on a lane."""

    name: str
    kind: str
    resource: str | None
    tier: str
    lane: str
    start_hours: float
    end_hours: float
    hours: float
    run: str | None = None
    phase: str | None = None
    after: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The ``steps[]`` entry of ``campaign plan --json``."""
        return {
            "name": self.name,
            "kind": self.kind,
            "resource": self.resource,
            "tier": self.tier,
            "lane": self.lane,
            "start_hours": _h(self.start_hours),
            "end_hours": _h(self.end_hours),
            "hours": _h(self.hours),
            "run": self.run,
            "phase": self.phase,
            "after": list(self.after),
        }


@dataclass(frozen=True)
class Option:
    """A way to make a calendar that does not fit fit (R7)."""

    kind: str  # "larger_package" | "smaller_protocol" | "second_lot"
    description: str
    span_hours: float
    window_hours: float
    total_price_usd: Decimal | None
    fits: bool
    dropped: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The ``options[]`` entry of ``campaign plan --json``."""
        return {
            "kind": self.kind,
            "description": self.description,
            "span_hours": _h(self.span_hours),
            "window_hours": _h(self.window_hours),
            "total_price_usd": usd(self.total_price_usd),
            "fits": self.fits,
            "dropped": list(self.dropped),
        }


@dataclass(frozen=True)
class VariantFactors:
    """Which factors a variant changes from the control (R9)."""

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

    @property
    def fits(self) -> bool:
        """True when the span fits inside the window."""
        return self.span_hours <= self.window_hours + _EPS

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
            "span_hours": _h(self.span_hours),
            "window_hours": _h(self.window_hours),
            "uncommitted_hours": _h(self.uncommitted_hours),
            "overrun_hours": _h(self.overrun_hours),
            "fits": self.fits,
            "machine_hours": _h(self.machine_hours),
            "gpu_hours": _h(self.gpu_hours),
            "human_hours": _h(self.human_hours),
            "total_price_usd": usd(self.total_price_usd),
            "gpu_lanes": self.gpu_lanes,
            "human_lanes": self.human_lanes,
            "steps": [s.to_dict() for s in self.steps],
            "packages": [p.to_dict() for p in self.packages],
            "options": [o.to_dict() for o in self.options],
            "warnings": list(self.warnings),
            "ablation": [a.to_dict() for a in self.ablation],
            "dropped": list(self.dropped),
            "hours_override": {k: _h(v) for k, v in self.hours_override},
        }


def _h(x: float) -> float:
    """Hours for presentation: drop float noise such as 47.99999999."""
    return round(x, 6) + 0.0


def _hs(x: float) -> str:
    """Hours in a sentence: ``78``, ``6.5``."""
    return f"{_h(x):g}"


# --- public API ----------------------------------------------------------------------------------


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
        hours_override: New hours for some steps, by step name (the re-forecast after the pilot).
        drop: Steps to remove (decision "reduce"). A step that waited for a dropped step now
            waits for what the dropped step waited for.

    Returns:
        The frozen plan; ``options`` is filled when it does not fit.

    Raises:
        SpecError: Unknown GPU or lot, no price, a window shorter than every lot, non-finite
            hours, or an unknown step in ``hours_override``/``drop``.
    """
    ctx = _Context.build(spec, catalog=catalog, base_dir=base_dir, hours_override=hours_override)
    dropped = ctx.check_names(drop, field="drop")
    sched = ctx.schedule(dropped)
    options = () if sched.span <= ctx.window + _EPS else tuple(_options(ctx, dropped, sched))
    ablation, ablation_warnings = ablation_of(spec)
    warnings = [*ctx.warnings, *_dropped_warnings(ctx, dropped), *_missing_parts(ctx, dropped)]
    warnings += ablation_warnings + _runs_without_steps(spec)
    kept = [t for t in ctx.tasks if t.name not in dropped]
    return Plan(
        name=spec.name,
        window_hours=ctx.window,
        span_hours=sched.span,
        machine_hours=sum(t.hours for t in kept if t.kind == "machine"),
        gpu_hours=sum(t.hours for t in kept if t.resource == "gpu"),
        human_hours=sum(t.hours for t in kept if t.kind == "human"),
        total_price_usd=ctx.price,
        gpu_lanes=ctx.gpu_lanes,
        human_lanes=ctx.human_lanes,
        steps=sched.steps,
        packages=ctx.packages,
        options=options,
        warnings=tuple(warnings),
        ablation=ablation,
        dropped=tuple(t.name for t in ctx.tasks if t.name in dropped),
        hours_override=tuple(sorted(ctx.overrides.items())),
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
    ctx = _Context.build(spec, catalog=catalog, base_dir=base_dir, hours_override=hours_override)
    dropped, _ = _reduce(ctx, frozenset())
    names = [t.name for t in ctx.tasks if t.name in dropped]
    return (
        plan(spec, catalog=ctx.catalog, hours_override=hours_override, drop=names),
        names,
    )


def ablation_of(spec: CampaignSpec) -> tuple[tuple[VariantFactors, ...], list[str]]:
    """Factors each variant changes from the control, and hygiene warnings (R9).

    Warns about a variant that changes nothing, one that changes several factors without
    ``combined: true``, and variants that together form a full grid of combinations.
    """
    if spec.control is None or not spec.variants:
        return (), []
    control = spec.control.model_dump(mode="json")
    result: list[VariantFactors] = []
    warnings: list[str] = []
    for v in spec.variants:
        resolved = spec.run_config(v.name).model_dump(mode="json")
        changes = tuple(
            (k, control[k], resolved[k]) for k in sorted(v.changes) if resolved[k] != control[k]
        )
        result.append(VariantFactors(v.name, v.tier, v.combined, changes))
        factors = [c[0] for c in changes]
        if not changes:
            warnings.append(
                f"variant '{v.name}' changes nothing from the control (R9): it cannot inform the "
                "decision; change one factor or remove it."
            )
        elif len(changes) > 1 and not v.combined:
            warnings.append(
                f"variant '{v.name}' changes {len(changes)} factors at once ({', '.join(factors)}) "
                "(R9): a difference could not be attributed to one cause; split it into "
                "one-factor variants, or set combined: true if the combination is the question."
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
                f"({len(configs)} runs with the control) (R9): keep the ablation small and "
                "interpretable: change one factor at a time, combine only what the decision needs."
            )
    return warnings


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


# --- preparation -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Task:
    index: int
    name: str
    kind: str
    resource: str | None
    tier: str
    hours: float
    after: tuple[int, ...]
    run: str | None
    phase: str | None
    text: str  # lower-case name + description, for keyword checks

    @property
    def pool(self) -> str:
        if self.kind == "human":
            return "human"
        return "gpu" if self.resource == "gpu" else "host"


@dataclass(frozen=True)
class _Schedule:
    span: float
    steps: tuple[ScheduledStep, ...]


@dataclass
class _Context:
    """Everything the scheduler needs, validated once."""

    catalog: Catalog
    packages: tuple[ResolvedPackage, ...]
    window: float
    gpu_lanes: int
    human_lanes: int
    tasks: list[_Task]
    topo: list[int]  # a topological order of task indices
    overrides: dict[str, float]
    warnings: list[str]

    @property
    def price(self) -> Decimal:
        return sum((p.total_usd for p in self.packages), Decimal(0))

    @classmethod
    def build(
        cls,
        spec: CampaignSpec,
        *,
        catalog: Catalog | None,
        base_dir: str | Path | None,
        hours_override: Mapping[str, float] | None,
    ) -> _Context:
        catalog = catalog or load_catalog(spec=spec, base_dir=base_dir)
        packages = tuple(resolve_package(p, catalog, index=i) for i, p in enumerate(spec.packages))
        warnings = [
            f"packages[{i}].price_usd {format_usd(p.price_usd)} differs from the catalog's "
            f"{format_usd(p.catalog_price_usd)} for a {p.days}-day {p.gpu} lot; the plan uses "
            "the spec's price."
            for i, p in enumerate(packages)
            if p.price_source == "spec"
            and p.catalog_price_usd is not None
            and p.price_usd != p.catalog_price_usd
        ]
        window = _window(spec, packages, warnings)
        index = {s.name: i for i, s in enumerate(spec.calendar)}
        overrides = _check_overrides(hours_override, index)
        tasks = []
        for i, s in enumerate(spec.calendar):
            hours = overrides.get(s.name, s.hours)
            if not math.isfinite(hours):
                raise SpecError(
                    f"field 'calendar[{i}].hours': step '{s.name}' has {hours} hours; give a "
                    "finite positive number of hours.",
                    field=f"calendar[{i}].hours",
                )
            tasks.append(
                _Task(
                    index=i,
                    name=s.name,
                    kind=s.kind,
                    resource=s.resource if s.kind == "machine" else None,
                    tier=s.tier,
                    hours=float(hours),
                    after=tuple(index[a] for a in s.after),
                    run=s.run,
                    phase=s.phase,
                    text=f"{s.name} {s.description}".lower(),
                )
            )
        return cls(
            catalog=catalog,
            packages=packages,
            window=window,
            gpu_lanes=sum(p.lanes for p in packages),
            human_lanes=spec.people,
            tasks=tasks,
            topo=_topological_order(tasks),
            overrides=overrides,
            warnings=warnings,
        )

    def check_names(self, names: Iterable[str], *, field: str) -> frozenset[str]:
        known = {t.name for t in self.tasks}
        names = frozenset(names)
        unknown = sorted(names - known)
        if unknown:
            raise SpecError(
                f"field '{field}': unknown step(s) {unknown}; use names of calendar steps.",
                field=field,
            )
        return names

    def effective_deps(self, dropped: frozenset[str]) -> list[tuple[int, ...]]:
        """Dependencies with dropped steps bridged: waiting for a dropped step means waiting
        for what it waited for."""
        deps: list[tuple[int, ...]] = [()] * len(self.tasks)
        for i in self.topo:
            out: dict[int, None] = {}
            for d in self.tasks[i].after:
                if self.tasks[d].name in dropped:
                    out.update(dict.fromkeys(deps[d]))
                else:
                    out[d] = None
            deps[i] = tuple(out)
        return deps

    def schedule(self, dropped: frozenset[str], *, gpu_lanes: int | None = None) -> _Schedule:
        return _list_schedule(
            self,
            dropped,
            gpu_lanes=self.gpu_lanes if gpu_lanes is None else gpu_lanes,
            human_lanes=self.human_lanes,
        )


def _window(spec: CampaignSpec, packages: tuple[ResolvedPackage, ...], warnings: list[str]) -> float:
    window = spec.window
    shortest = min(p.hours for p in packages)
    longest = max(p.hours for p in packages)
    if not math.isfinite(window):
        raise SpecError(
            "field 'window_hours': give a finite number of hours, or omit it to use the shortest "
            "lot's duration.",
            field="window_hours",
        )
    if window < shortest - _EPS:
        raise SpecError(
            f"field 'window_hours': {_hs(window)} h is shorter than every committed lot (the "
            f"shortest lasts {_hs(shortest)} h) and a lot is paid for its whole duration; set "
            f"window_hours to {_hs(shortest)} (or omit it), or plan on a shorter lot.",
            field="window_hours",
        )
    if window > longest + _EPS:
        warnings.append(
            f"window_hours {_hs(window)} is longer than the longest committed lot ({_hs(longest)} h): "
            "the GPU is not rented for the whole window unless lots follow one another, with a "
            "restart from checkpoint on each new lot."
        )
    return float(window)


def _check_overrides(
    hours_override: Mapping[str, float] | None, index: Mapping[str, int]
) -> dict[str, float]:
    overrides = dict(hours_override or {})
    unknown = sorted(set(overrides) - set(index))
    if unknown:
        raise SpecError(
            f"field 'hours_override': unknown step(s) {unknown}; re-forecast only calendar steps.",
            field="hours_override",
        )
    for name, hours in overrides.items():
        if not (isinstance(hours, int | float) and math.isfinite(hours) and hours > 0):
            raise SpecError(
                f"field 'hours_override.{name}': {hours!r} is not a positive finite number of "
                "hours; give the re-forecast duration in hours.",
                field=f"hours_override.{name}",
            )
    return {k: float(v) for k, v in overrides.items()}


def _topological_order(tasks: list[_Task]) -> list[int]:
    """Kahn's algorithm; the spec already refused cycles."""
    indegree = [len(t.after) for t in tasks]
    dependents: list[list[int]] = [[] for _ in tasks]
    for t in tasks:
        for d in t.after:
            dependents[d].append(t.index)
    queue = [i for i, n in enumerate(indegree) if n == 0]
    order = []
    while queue:
        i = queue.pop()
        order.append(i)
        for j in dependents[i]:
            indegree[j] -= 1
            if indegree[j] == 0:
                queue.append(j)
    assert len(order) == len(tasks), "cycle in a validated calendar"
    return order


# --- scheduling ----------------------------------------------------------------------------------


def _list_schedule(
    ctx: _Context, dropped: frozenset[str], *, gpu_lanes: int, human_lanes: int
) -> _Schedule:
    """Event-driven list scheduling, O((steps + links) log steps)."""
    tasks = ctx.tasks
    keep = [t.name not in dropped for t in tasks]
    deps = ctx.effective_deps(dropped)
    dependents: list[list[int]] = [[] for _ in tasks]
    waiting = [0] * len(tasks)
    for i, ds in enumerate(deps):
        if keep[i]:
            waiting[i] = len(ds)
            for d in ds:
                dependents[d].append(i)
    # Longest remaining chain (hours) from each step, the second priority key.
    tail = [0.0] * len(tasks)
    for i in reversed(ctx.topo):
        if keep[i]:
            tail[i] = tasks[i].hours + max((tail[j] for j in dependents[i]), default=0.0)

    ready: dict[str, list[tuple[int, float, int]]] = {"gpu": [], "human": [], "host": []}
    free: dict[str, list[int]] = {"gpu": list(range(gpu_lanes)), "human": list(range(human_lanes))}
    free["host"] = []
    host_lanes = 0
    running: list[tuple[float, int]] = []
    start = [0.0] * len(tasks)
    lane_of = [-1] * len(tasks)

    def make_ready(i: int) -> None:
        heapq.heappush(ready[tasks[i].pool], (TIER_RANK[tasks[i].tier], -tail[i], i))

    for i in range(len(tasks)):
        if keep[i] and waiting[i] == 0:
            make_ready(i)
    now = 0.0
    while True:
        for pool, queue in ready.items():
            while queue:
                if not free[pool]:
                    if pool != "host":
                        break
                    free["host"].append(host_lanes)  # host lanes are not scarce
                    host_lanes += 1
                i = heapq.heappop(queue)[2]
                lane_of[i] = heapq.heappop(free[pool])
                start[i] = now
                heapq.heappush(running, (now + tasks[i].hours, i))
        if not running:
            break
        now = running[0][0]
        while running and running[0][0] == now:
            i = heapq.heappop(running)[1]
            heapq.heappush(free[tasks[i].pool], lane_of[i])
            for j in dependents[i]:
                waiting[j] -= 1
                if waiting[j] == 0:
                    make_ready(j)

    assert all(lane_of[i] >= 0 for i in range(len(tasks)) if keep[i]), "a step was never started"
    steps = tuple(
        ScheduledStep(
            name=t.name,
            kind=t.kind,
            resource=t.resource,
            tier=t.tier,
            lane=f"{t.pool}{lane_of[t.index]}",
            start_hours=start[t.index],
            end_hours=start[t.index] + t.hours,
            hours=t.hours,
            run=t.run,
            phase=t.phase,
            after=tuple(tasks[d].name for d in deps[t.index]),
        )
        for t in tasks
        if keep[t.index]
    )
    return _Schedule(span=max((s.end_hours for s in steps), default=0.0), steps=steps)


# --- when it does not fit -------------------------------------------------------------------------


def _reduce(ctx: _Context, base: frozenset[str]) -> tuple[frozenset[str], _Schedule]:
    """Smallest-by-tier drop set that makes the calendar fit (see reduce_to_fit)."""

    def fits(drop: set[str] | frozenset[str]) -> bool:
        return ctx.schedule(frozenset(drop)).span <= ctx.window + _EPS

    dropped = set(base)
    if not fits(dropped):
        for tier in ("exploratory", "useful"):
            candidates = sorted(
                (t for t in ctx.tasks if t.tier == tier and t.name not in dropped),
                key=lambda t: (-t.hours, -t.index),
            )
            names = [t.name for t in candidates]
            if not names:
                continue
            if not fits(dropped | set(names)):
                dropped |= set(names)
                continue
            # Smallest prefix (longest steps first) that fits; `hi` always fits.
            lo, hi = 1, len(names)
            while lo < hi:
                mid = (lo + hi) // 2
                if fits(dropped | set(names[:mid])):
                    hi = mid
                else:
                    lo = mid + 1
            dropped |= set(names[:lo])
            break
        added = [t for t in ctx.tasks if t.name in dropped and t.name not in base]
        if fits(dropped) and len(added) <= _PRUNE_LIMIT:
            # Put back what was not needed: useful steps first, shortest first.
            for t in sorted(added, key=lambda t: (TIER_RANK[t.tier], t.hours, t.index)):
                if fits(dropped - {t.name}):
                    dropped.discard(t.name)
    final = frozenset(dropped)
    return final, ctx.schedule(final)


def _options(ctx: _Context, dropped: frozenset[str], sched: _Schedule) -> list[Option]:
    options = []
    larger = _larger_package(ctx, sched.span)
    if larger:
        options.append(larger)
    reduced, rsched = _reduce(ctx, dropped)
    newly = tuple(t.name for t in ctx.tasks if t.name in reduced and t.name not in dropped)
    if newly:
        ok = rsched.span <= ctx.window + _EPS
        tiers = sorted({t.tier for t in ctx.tasks if t.name in newly}, key=TIER_RANK.get)
        verdict = "fits" if ok else f"still {_hs(rsched.span - ctx.window)} h over the window"
        options.append(
            Option(
                kind="smaller_protocol",
                description=(
                    f"drop {' and '.join(tiers)} step(s) {', '.join(newly)}: span {_hs(rsched.span)} h, "
                    f"{verdict}, same lots at {format_usd(ctx.price)}"
                ),
                span_hours=rsched.span,
                window_hours=ctx.window,
                total_price_usd=ctx.price,
                fits=ok,
                dropped=newly,
            )
        )
    second = _second_lot(ctx, dropped)
    if second:
        options.append(second)
    return options


def _larger_package(ctx: _Context, span: float) -> Option | None:
    """Each package replaced by the shortest longer lot of the same GPU that covers the span."""
    replaced = []
    for p in ctx.packages:
        lot = next(
            (x for x in ctx.catalog.lots_of(p.gpu) if x.days > p.days and x.hours >= span - _EPS),
            None,
        )
        if lot is None:
            return None
        replaced.append((p, lot))
    known = all(lot.price_usd is not None for _, lot in replaced)
    price = sum(
        (lot.price_usd * p.count for p, lot in replaced if lot.price_usd is not None), Decimal(0)
    )
    window = min(lot.hours for _, lot in replaced)
    what = " + ".join(
        f"{_count(p.count)} {lot.days}-day {p.gpu} lot{'s' if p.count > 1 else ''}" for p, lot in replaced
    )
    ok = span <= window + _EPS
    tail = (
        f"span {_hs(span)} h fits with {_hs(window - span)} h uncommitted"
        if ok
        else f"span {_hs(span)} h still exceeds {_hs(window)} h"
    )
    cost = format_usd(price) if known else "price not in catalog: give price_usd"
    return Option(
        kind="larger_package",
        description=f"{what} ({_hs(window)} h window) instead: {tail}; {cost}",
        span_hours=span,
        window_hours=window,
        total_price_usd=price if known else None,
        fits=ok,
    )


def _second_lot(ctx: _Context, dropped: frozenset[str]) -> Option | None:
    """One more lot of the first package, only when independent GPU steps exist (R7)."""
    if not _has_independent_gpu_steps(ctx, dropped):
        return None
    p = ctx.packages[0]
    sched = ctx.schedule(dropped, gpu_lanes=ctx.gpu_lanes + p.gpus_per_lot)
    price = ctx.price + p.price_usd
    ok = sched.span <= ctx.window + _EPS
    verdict = "fits" if ok else f"still {_hs(sched.span - ctx.window)} h over the window"
    return Option(
        kind="second_lot",
        description=(
            f"one more {p.days}-day {p.gpu} lot in parallel ({ctx.gpu_lanes + p.gpus_per_lot} GPU "
            f"lanes): independent GPU steps run side by side, span {_hs(sched.span)} h, {verdict}; "
            f"{format_usd(price)}. It does not shorten any single step nor merge GPU memory."
        ),
        span_hours=sched.span,
        window_hours=ctx.window,
        total_price_usd=price,
        fits=ok,
    )


def _has_independent_gpu_steps(ctx: _Context, dropped: frozenset[str]) -> bool:
    """True unless the kept GPU steps form one chain of the dependency order.

    They form a chain exactly when each is reachable from the previous one in a topological
    order, so only consecutive pairs need a search.
    """
    deps = ctx.effective_deps(dropped)
    position = {i: k for k, i in enumerate(ctx.topo)}
    gpu = [i for i in ctx.topo if ctx.tasks[i].resource == "gpu" and ctx.tasks[i].name not in dropped]
    for a, b in pairwise(gpu):
        stack, seen = [b], {b}
        found = False
        while stack and not found:
            for d in deps[stack.pop()]:
                if d == a:
                    found = True
                    break
                if d not in seen and position[d] > position[a]:
                    seen.add(d)
                    stack.append(d)
        if not found:
            return True
    return False


def _count(n: int) -> str:
    return {1: "one", 2: "two", 3: "three"}.get(n, str(n))


# --- warnings ------------------------------------------------------------------------------------


def _missing_parts(ctx: _Context, dropped: frozenset[str]) -> list[str]:
    kept = [t for t in ctx.tasks if t.name not in dropped]
    if not any(t.resource == "gpu" for t in kept):
        return []
    return [
        f"the calendar has GPU steps but no {part} step ({why}); add one with its own hours "
        f"(steps are matched by name/description words such as '{words[0]}')."
        for part, words, why in _REQUIRED_PARTS
        if not any(w in t.text for t in kept for w in words)
    ]


def _dropped_warnings(ctx: _Context, dropped: frozenset[str]) -> list[str]:
    return [
        f"essential step '{t.name}' is dropped: the campaign may not reach its decision."
        for t in ctx.tasks
        if t.name in dropped and t.tier == "essential"
    ]


def _runs_without_steps(spec: CampaignSpec) -> list[str]:
    planned = {s.run for s in spec.calendar if s.run}
    return [
        f"run '{r}' has no calendar step (no step with run: {r}): its GPU time is not planned."
        for r in spec.run_names()
        if r not in planned
    ]


# --- presentation --------------------------------------------------------------------------------


def render_markdown(plan: Plan) -> str:
    """The plan as Markdown (for a Prefect artifact or a report)."""
    verdict = (
        f"fits, {_hs(plan.uncommitted_hours)} h uncommitted"
        if plan.fits
        else f"does NOT fit: {_hs(plan.overrun_hours)} h over"
    )
    lots = ", ".join(
        f"{p.count} x {p.days}-day {p.gpu} lot ({p.gpus_per_lot} GPU/lot, {format_usd(p.price_usd)})"
        for p in plan.packages
    )
    lines = [
        f"## Calendar of `{plan.name}`",
        "",
        f"Span **{_hs(plan.span_hours)} h** in a {_hs(plan.window_hours)} h window: {verdict}. "
        f"Machine {_hs(plan.machine_hours)} h (GPU {_hs(plan.gpu_hours)} h), "
        f"human {_hs(plan.human_hours)} h. Lots: {lots}; total {format_usd(plan.total_price_usd)}.",
        "",
        "| step | kind | tier | lane | start h | end h | hours |",
        "|---|---|---|---|---:|---:|---:|",
    ]
    for s in sorted(plan.steps, key=lambda s: (s.start_hours, s.lane)):
        kind = s.kind if s.kind == "human" else f"machine/{s.resource}"
        lines.append(
            f"| {s.name} | {kind} | {s.tier} | {s.lane} | {_hs(s.start_hours)} | "
            f"{_hs(s.end_hours)} | {_hs(s.hours)} |"
        )
    if plan.dropped:
        lines += ["", f"Dropped: {', '.join(plan.dropped)}."]
    if plan.options:
        lines += ["", "### Options", ""] + [f"- **{o.kind}**: {o.description}" for o in plan.options]
    if plan.ablation:
        lines += ["", "### Ablation", ""] + [
            f"- `{a.variant}` ({a.tier}): {', '.join(a.factors) or 'changes nothing'}"
            for a in plan.ablation
        ]
    if plan.warnings:
        lines += ["", "### Warnings", ""] + [f"- {w}" for w in plan.warnings]
    return "\n".join(lines) + "\n"
