"""The list scheduler behind :mod:`gpucampaign.plan.calendar`: steps, lanes, span, reductions.

Pure functions, no Prefect. :class:`Context` validates a spec once (lots, window, hours,
dependencies); :meth:`Context.schedule` places the kept steps on lanes; :func:`reduce_drops`
finds the smallest set of optional steps to drop so that the calendar fits its window.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from gpucampaign.plan.tariffs import (
    Catalog,
    ResolvedPackage,
    format_usd,
    load_catalog,
    resolve_package,
)
from gpucampaign.spec import CampaignSpec, SpecError

TIER_RANK = {"essential": 0, "useful": 1, "exploratory": 2}
EPS = 1e-9
# Above this many newly dropped steps, reduce_drops skips the pass that puts back steps whose
# removal turned out unnecessary: each try is a full re-plan, and such a set is large anyway.
_PRUNE_LIMIT = 64


def round_hours(x: float) -> float:
    """Hours for presentation: drop float noise such as 47.99999999."""
    return round(x, 6) + 0.0


def say_hours(x: float) -> str:
    """Hours in a sentence: ``78``, ``6.5``."""
    return f"{round_hours(x):g}"


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
        d = asdict(self)
        for k in ("start_hours", "end_hours", "hours"):
            d[k] = round_hours(d[k])
        d["after"] = list(self.after)
        return d


# --- preparation -------------------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    """A calendar step as the scheduler sees it (dependencies as indices)."""

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
        """The kind of lane the step takes: ``gpu``, ``human`` or ``host``."""
        if self.kind == "human":
            return "human"
        return "gpu" if self.resource == "gpu" else "host"


@dataclass(frozen=True)
class Schedule:
    """The kept steps on their lanes and the span they make."""

    span: float
    steps: tuple[ScheduledStep, ...]


@dataclass
class Context:
    """Everything the scheduler needs, validated once."""

    catalog: Catalog
    packages: tuple[ResolvedPackage, ...]
    window: float
    gpu_lanes: int
    human_lanes: int
    tasks: list[Task]
    topo: list[int]  # a topological order of task indices
    overrides: dict[str, float]
    warnings: list[str]

    @property
    def price(self) -> Decimal:
        """Price of every committed lot."""
        return sum((p.total_usd for p in self.packages), Decimal(0))

    @classmethod
    def build(
        cls,
        spec: CampaignSpec,
        *,
        catalog: Catalog | None,
        base_dir: str | Path | None,
        hours_override: Mapping[str, float] | None,
    ) -> Context:
        """Resolve the spec's lots, window and steps (see ``calendar.plan`` for the errors)."""
        catalog = catalog or load_catalog(spec=spec, base_dir=base_dir)
        packages = tuple(resolve_package(p, catalog, index=i) for i, p in enumerate(spec.packages))
        warnings = _price_warnings(packages)
        window = _window(spec, packages, warnings)
        index = {s.name: i for i, s in enumerate(spec.calendar)}
        overrides = _check_overrides(hours_override, index)
        tasks = _tasks(spec, index, overrides)
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
        """``names`` as a set, after checking that each is a calendar step."""
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

    def schedule(self, dropped: frozenset[str], *, gpu_lanes: int | None = None) -> Schedule:
        """Place every step not in ``dropped``; ``gpu_lanes`` overrides the lots' lanes."""
        return _list_schedule(
            self,
            dropped,
            gpu_lanes=self.gpu_lanes if gpu_lanes is None else gpu_lanes,
            human_lanes=self.human_lanes,
        )

    def fits(self, schedule: Schedule) -> bool:
        """True when the schedule's span fits inside the window."""
        return schedule.span <= self.window + EPS


def _price_warnings(packages: tuple[ResolvedPackage, ...]) -> list[str]:
    return [
        f"packages[{i}].price_usd {format_usd(p.price_usd)} differs from the catalog's "
        f"{format_usd(p.catalog_price_usd)} for a {p.days}-day {p.gpu} lot; the plan uses "
        "the spec's price."
        for i, p in enumerate(packages)
        if p.price_source == "spec"
        and p.catalog_price_usd is not None
        and p.price_usd != p.catalog_price_usd
    ]


def _tasks(
    spec: CampaignSpec, index: Mapping[str, int], overrides: Mapping[str, float]
) -> list[Task]:
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
            Task(
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
    return tasks


def _window(
    spec: CampaignSpec, packages: tuple[ResolvedPackage, ...], warnings: list[str]
) -> float:
    window = spec.window
    shortest = min(p.hours for p in packages)
    longest = max(p.hours for p in packages)
    if not math.isfinite(window):
        raise SpecError(
            "field 'window_hours': give a finite number of hours, or omit it to use the "
            "shortest lot's duration.",
            field="window_hours",
        )
    if window < shortest - EPS:
        raise SpecError(
            f"field 'window_hours': {say_hours(window)} h is shorter than every committed lot "
            f"(the shortest lasts {say_hours(shortest)} h) and a lot is paid for its whole "
            f"duration; set window_hours to {say_hours(shortest)} (or omit it), or plan on a "
            "shorter lot.",
            field="window_hours",
        )
    if window > longest + EPS:
        warnings.append(
            f"window_hours {say_hours(window)} is longer than the longest committed lot "
            f"({say_hours(longest)} h): the GPU is not rented for the whole window unless lots "
            "follow one another, with a restart from checkpoint on each new lot."
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


def _topological_order(tasks: list[Task]) -> list[int]:
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


# --- scheduling --------------------------------------------------------------------------


@dataclass
class _Graph:
    """The kept steps' links: who waits for whom, and each step's longest remaining chain."""

    keep: list[bool]
    deps: list[tuple[int, ...]]
    dependents: list[list[int]]
    waiting: list[int]
    tail: list[float]

    @classmethod
    def of(cls, ctx: Context, dropped: frozenset[str]) -> _Graph:
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
        return cls(keep, deps, dependents, waiting, tail)


def _list_schedule(
    ctx: Context, dropped: frozenset[str], *, gpu_lanes: int, human_lanes: int
) -> Schedule:
    """Event-driven list scheduling, O((steps + links) log steps)."""
    tasks = ctx.tasks
    g = _Graph.of(ctx, dropped)
    ready: dict[str, list[tuple[int, float, int]]] = {"gpu": [], "human": [], "host": []}
    free = {"gpu": list(range(gpu_lanes)), "human": list(range(human_lanes)), "host": []}
    host_lanes = 0
    running: list[tuple[float, int]] = []
    start = [0.0] * len(tasks)
    lane_of = [-1] * len(tasks)

    def make_ready(i: int) -> None:
        heapq.heappush(ready[tasks[i].pool], (TIER_RANK[tasks[i].tier], -g.tail[i], i))

    for i in range(len(tasks)):
        if g.keep[i] and g.waiting[i] == 0:
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
            for j in g.dependents[i]:
                g.waiting[j] -= 1
                if g.waiting[j] == 0:
                    make_ready(j)
    return _placed(ctx, g, start=start, lane_of=lane_of)


def _placed(ctx: Context, g: _Graph, *, start: list[float], lane_of: list[int]) -> Schedule:
    """The kept steps at their start hours and lanes."""
    tasks = ctx.tasks
    assert all(lane_of[i] >= 0 for i in range(len(tasks)) if g.keep[i]), "a step never started"
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
            after=tuple(tasks[d].name for d in g.deps[t.index]),
        )
        for t in tasks
        if g.keep[t.index]
    )
    return Schedule(span=max((s.end_hours for s in steps), default=0.0), steps=steps)


# --- reduction ---------------------------------------------------------------------------


def reduce_drops(ctx: Context, base: frozenset[str]) -> tuple[frozenset[str], Schedule]:
    """Smallest-by-tier drop set, beyond ``base``, that makes the calendar fit.

    Exploratory steps go first, then useful ones; within a tier the longest first. Steps whose
    removal turned out unnecessary are then put back. Essential steps are never dropped.

    Returns:
        The dropped names (``base`` included) and the schedule without them; that schedule
        may still overrun when even the essential steps alone do not fit.
    """

    def fits(drop: set[str] | frozenset[str]) -> bool:
        return ctx.fits(ctx.schedule(frozenset(drop)))

    dropped = set(base)
    if not fits(dropped):
        for tier in ("exploratory", "useful"):
            names = [
                t.name
                for t in sorted(
                    (t for t in ctx.tasks if t.tier == tier and t.name not in dropped),
                    key=lambda t: (-t.hours, -t.index),
                )
            ]
            if not names:
                continue
            if not fits(dropped | set(names)):
                dropped |= set(names)
                continue

            def fits_with(more: set[str], d: frozenset[str] = frozenset(dropped)) -> bool:
                return fits(d | more)

            dropped |= set(_smallest_prefix(names, fits_with))
            break
        added = [t for t in ctx.tasks if t.name in dropped and t.name not in base]
        if fits(dropped) and len(added) <= _PRUNE_LIMIT:
            # Put back what was not needed: useful steps first, shortest first.
            for t in sorted(added, key=lambda t: (TIER_RANK[t.tier], t.hours, t.index)):
                if fits(dropped - {t.name}):
                    dropped.discard(t.name)
    final = frozenset(dropped)
    return final, ctx.schedule(final)


def _smallest_prefix(names: list[str], fits: Callable[[set[str]], bool]) -> list[str]:
    """Binary search for the shortest prefix of ``names`` that fits (all of them fit)."""
    lo, hi = 1, len(names)
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(set(names[:mid])):
            hi = mid
        else:
            lo = mid + 1
    return names[:lo]
