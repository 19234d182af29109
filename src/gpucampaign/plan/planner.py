"""The list scheduler behind :mod:`gpucampaign.plan.calendar`: steps, lanes, span, reductions.

Pure functions, no Prefect. :class:`Context` validates a spec once (lots, window, hours,
dependencies); :meth:`Context.schedule` places the kept steps on lanes; :func:`reduce_drops`
finds the smallest set of optional steps to drop so that the calendar fits its window.
The spec's checks live in :mod:`~gpucampaign.plan.inputs`, the event loop in
:mod:`~gpucampaign.plan.list_scheduler`, the placed steps in :mod:`~gpucampaign.plan.schedule`.

Complexity, for ``n`` steps and ``e`` links (``after`` entries):

* :meth:`Context.build` is O(n + e): columns read once, links and dependents as flat index
  lists (a counting sort), and a topological order that is the table order itself when every
  link points up the table, else Kahn's algorithm.
* :meth:`Context.schedule` is O((n + e) log n): each step's longest remaining chain in one
  reverse topological pass, one sort for the priority (tier, longest chain, table order), then
  an event loop in which each step enters and leaves a ready heap, the running heap and a lane
  heap once, and each link is looked at once, when its step ends. A dropped step passes
  through (it ends when what it waited for has ended), so no links are rebuilt per drop set;
  the bridged ``after`` of the output rows is computed only for steps that wait for a dropped
  one.
* :meth:`Context.span` is the same loop without lane numbers or output rows (lanes of one kind
  are interchangeable: which one a step takes changes no time).
* :func:`reduce_drops` runs at most 4 + log2(m) + ``_PRUNE_LIMIT`` spans (m: optional steps
  of one tier) and one schedule: a binary search over the drop order, then the put-back pass
  when at most ``_PRUNE_LIMIT`` steps were dropped. A try whose kept GPU or human hours
  divided by that kind's lanes already exceed the window is refused without scheduling, and
  one whose longest chain does is refused before the event loop (no span is shorter). So
  O((log n + 64) (n + e) log n): near-linear, with that factor. It is the slow path left: a
  100,000-step calendar that overruns its window by 2 h drops 12 steps and pays the put-back
  pass, 33 spans in all (12 s on the shared machine).

Measured (bench/results/plan_scaling.md): validate + plan of 100,000 steps in about 2 s on a
shared 2-core machine, 1,000,000 in about 30 s.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from functools import cached_property
from itertools import accumulate, compress, pairwise
from operator import attrgetter
from pathlib import Path
from typing import Any

from gpucampaign.config import CampaignSpec, SpecError
from gpucampaign.plan.inputs import (
    check_overrides,
    machines_of,
    price_warnings,
    step_hours,
    step_widths,
    window_of,
)
from gpucampaign.plan.list_scheduler import list_schedule
from gpucampaign.plan.schedule import (
    EPS,
    GPU_POOL,
    HOST_POOL,
    HUMAN_POOL,
    POOLS,
    TIER_RANK,
    Schedule,
    ScheduledStep,
)
from gpucampaign.plan.tariffs import Catalog, ResolvedPackage, load_catalog, resolve_package

# Above this many newly dropped steps, reduce_drops skips the pass that puts back steps whose
# removal turned out unnecessary: each try is a full re-plan, and such a set is large anyway.
_PRUNE_LIMIT = 64
# Relative slack for the load bound in reduce_drops, far above float rounding of the sums.
_BOUND_SLACK = 1e-7


# --- preparation -------------------------------------------------------------------------


@dataclass
class Context:
    """Everything the scheduler needs, validated once.

    The calendar's steps are held as columns indexed by table position (``names[i]``,
    ``hours[i]``...): a 100,000-step calendar is a few lists, not 100,000 objects.
    """

    catalog: Catalog
    packages: tuple[ResolvedPackage, ...]
    window: float
    gpu_lanes: int
    human_lanes: int
    names: list[str]
    kinds: list[str]
    resources: list[str | None]  # None for human steps
    tiers: list[str]
    hours: list[float]  # after hours_override
    runs: list[str | None]
    phases: list[str | None]
    descriptions: list[str]
    after: list[tuple[str, ...]]  # the spec's links, repeats removed, in the table's order
    pools: list[int]  # index into POOLS
    tier_ranks: list[int]  # TIER_RANK of each step's tier
    topo: list[int]  # a topological order of step indices
    overrides: dict[str, float]
    warnings: list[str]
    # The links as indices, each a slice of one flat list of ints rather than a tuple per
    # step (cheaper to build, and nothing for the garbage collector to walk): step i waits
    # for link_targets[link_offsets[i]:link_offsets[i + 1]], and steps
    # dependents[offsets[i]:offsets[i + 1]] wait for it.
    link_offsets: list[int]
    link_targets: list[int]
    offsets: list[int]
    dependents: list[int]
    # GPU lanes each step takes at once: a run's ``gpus`` (data-parallel, on ONE machine), else
    # 1; and the GPU lanes of each machine (one lot), by lane number.
    widths: list[int] = dataclasses.field(default_factory=list)
    machines: list[list[int]] = dataclasses.field(default_factory=list)

    @property
    def wide(self) -> bool:
        """True when a step takes several GPU lanes (the scheduler then keeps machines)."""
        return any(w > 1 for w in self.widths)

    def machines_for(self, gpu_lanes: int) -> list[list[int]]:
        """The machines of ``gpu_lanes`` lanes: the lots', then more lots like the first."""
        machines = [m for m in self.machines if m[-1] < gpu_lanes]
        size = self.packages[0].gpus_per_lot if self.packages else 1
        lane = sum(map(len, machines))
        while lane < gpu_lanes:
            machines.append(list(range(lane, min(lane + size, gpu_lanes))))
            lane += size
        return machines

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
        warnings = price_warnings(packages)
        window = window_of(spec, packages, warnings)
        cal = spec.calendar

        def column(field: str) -> list[Any]:
            return list(map(attrgetter(field), cal))

        names = column("name")
        index = {n: i for i, n in enumerate(names)}
        overrides = check_overrides(hours_override, index)
        kinds, tiers = column("kind"), column("tier")
        resources = [
            r if k == "machine" else None for k, r in zip(kinds, column("resource"), strict=True)
        ]
        after = _unique_links(column("after"))
        link_offsets = list(accumulate(map(len, after), initial=0))
        link_targets = [index[a] for links in after for a in links]
        offsets, dependents = _dependents_of(link_offsets, link_targets)
        machines = machines_of(packages)
        widths = step_widths(spec, names, column("run"), resources, packages)
        return cls(
            catalog=catalog,
            packages=packages,
            window=window,
            gpu_lanes=sum(p.lanes for p in packages),
            human_lanes=spec.people,
            names=names,
            kinds=kinds,
            resources=resources,
            tiers=tiers,
            tier_ranks=[TIER_RANK[t] for t in tiers],
            hours=step_hours(spec, column("hours"), overrides, index),
            runs=column("run"),
            phases=column("phase"),
            descriptions=column("description"),
            after=after,
            pools=[
                HUMAN_POOL if k == "human" else GPU_POOL if r == "gpu" else HOST_POOL
                for k, r in zip(kinds, resources, strict=True)
            ],
            topo=_topological_order(link_offsets, link_targets, offsets, dependents),
            overrides=overrides,
            warnings=warnings,
            link_offsets=link_offsets,
            link_targets=link_targets,
            offsets=offsets,
            dependents=dependents,
            widths=widths,
            machines=machines,
        )

    def check_names(self, names: Iterable[str], *, field: str) -> frozenset[str]:
        """``names`` as a set, after checking that each is a calendar step."""
        names = frozenset(names)
        unknown = sorted(names.difference(self.names))
        if unknown:
            raise SpecError(
                f"field '{field}': unknown step(s) {unknown}; use names of calendar steps.",
                field=field,
            )
        return names

    def kept(self, dropped: frozenset[str]) -> list[int]:
        """Indices of the steps not in ``dropped``, in table order."""
        if not dropped:
            return list(range(len(self.names)))
        return [i for i, n in enumerate(self.names) if n not in dropped]

    @cached_property
    def texts(self) -> list[str]:
        """Each step's lower-case name and description, for keyword checks (built once)."""
        return [f"{n} {d}".lower() for n, d in zip(self.names, self.descriptions, strict=True)]

    def links(self, i: int) -> tuple[int, ...]:
        """The steps step ``i`` waits for, as indices."""
        return tuple(self.link_targets[self.link_offsets[i] : self.link_offsets[i + 1]])

    def effective_deps(self, dropped: frozenset[str]) -> dict[int, tuple[int, ...]]:
        """Dependencies with dropped steps bridged: waiting for a dropped step means waiting
        for what it waited for.

        Only for the steps that wait for a dropped step (rewritten in topological order);
        every other step ``i`` waits for :meth:`links` ``(i)``.
        """
        if not dropped:
            return {}
        offsets, dependents = self.offsets, self.dependents
        keep = self.keep_mask(dropped)
        touched: set[int] = set()
        for d, kept in enumerate(keep):
            if not kept:
                touched.update(dependents[offsets[d] : offsets[d + 1]])
        deps: dict[int, tuple[int, ...]] = {}
        for i in sorted(touched, key=self._position().__getitem__):
            out: dict[int, None] = {}
            for d in self.links(i):
                if keep[d]:
                    out[d] = None
                else:
                    out.update(dict.fromkeys(deps[d] if d in deps else self.links(d)))
            deps[i] = tuple(out)
        return deps

    def keep_mask(self, dropped: frozenset[str]) -> list[bool]:
        """For each step, whether it is kept."""
        if not dropped:
            return [True] * len(self.names)
        return [n not in dropped for n in self.names]

    def schedule(self, dropped: frozenset[str], *, gpu_lanes: int | None = None) -> Schedule:
        """Place every step not in ``dropped``; ``gpu_lanes`` overrides the lots' lanes."""
        keep = self.keep_mask(dropped)
        lanes = self.gpu_lanes if gpu_lanes is None else gpu_lanes
        wide: dict[int, list[int]] = {}
        start, lane_of, span = list_schedule(
            self, keep, gpu_lanes=lanes, human_lanes=self.human_lanes, lanes=True, wide=wide
        )
        steps = _placed(self, keep, dropped, start=start, lane_of=lane_of, wide=wide)
        return Schedule(span=span, steps=steps)

    def span(self, dropped: frozenset[str], *, gpu_lanes: int | None = None) -> float:
        """The span :meth:`schedule` would give, without placing the steps on lanes."""
        lanes = self.gpu_lanes if gpu_lanes is None else gpu_lanes
        return list_schedule(
            self,
            self.keep_mask(dropped),
            gpu_lanes=lanes,
            human_lanes=self.human_lanes,
            lanes=False,
        )[2]

    def fits(self, schedule: Schedule) -> bool:
        """True when the schedule's span fits inside the window."""
        return schedule.span <= self.window + EPS

    def _position(self) -> list[int]:
        """Each step's place in ``topo``."""
        position = [0] * len(self.topo)
        for k, i in enumerate(self.topo):
            position[i] = k
        return position


def _unique_links(after: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
    """Each step's ``after``, a name given twice kept once (the spec's own tuples otherwise)."""
    for i, links in enumerate(after):
        if len(links) > 1 and len(set(links)) < len(links):
            after[i] = tuple(dict.fromkeys(links))
    return after


def _topological_order(
    link_offsets: list[int], link_targets: list[int], offsets: list[int], dependents: list[int]
) -> list[int]:
    """The table order when every link points up the table, else Kahn's algorithm (the spec
    already refused cycles)."""
    n = len(offsets) - 1
    waits = [b - a for a, b in pairwise(link_offsets)]
    owners = [i for i, k in enumerate(waits) for _ in range(k)]
    if all(map(int.__lt__, link_targets, owners)):
        return list(range(n))
    queue = [i for i, k in enumerate(waits) if k == 0]
    order = []
    while queue:
        i = queue.pop()
        order.append(i)
        for j in dependents[offsets[i] : offsets[i + 1]]:
            waits[j] -= 1
            if waits[j] == 0:
                queue.append(j)
    assert len(order) == n, "cycle in a validated calendar"
    return order


def _dependents_of(link_offsets: list[int], link_targets: list[int]) -> tuple[list[int], list[int]]:
    """Who waits for each step, as offsets into one flat list (a counting sort of the links)."""
    n = len(link_offsets) - 1
    counts = [0] * (n + 1)
    for d in link_targets:
        counts[d + 1] += 1
    offsets = list(accumulate(counts))
    fill = offsets[:-1]
    dependents = [0] * len(link_targets)
    for i, (a, b) in enumerate(pairwise(link_offsets)):
        for d in link_targets[a:b]:
            dependents[fill[d]] = i
            fill[d] += 1
    return offsets, dependents


# --- scheduling --------------------------------------------------------------------------


# --- placing -----------------------------------------------------------------------------


def _placed(
    ctx: Context,
    keep: list[bool],
    dropped: frozenset[str],
    *,
    start: list[float],
    lane_of: list[int],
    wide: dict[int, list[int]] | None = None,
) -> tuple[ScheduledStep, ...]:
    """The kept steps at their start hours and lanes, in table order."""
    names = ctx.names
    bridged = ctx.effective_deps(dropped)
    step = ScheduledStep
    rows = zip(
        range(len(keep)),
        names,
        ctx.kinds,
        ctx.resources,
        ctx.tiers,
        ctx.pools,
        lane_of,
        start,
        ctx.hours,
        ctx.runs,
        ctx.phases,
        ctx.after,
        strict=True,
    )
    return tuple(
        step(
            name,
            kind,
            resource,
            tier,
            (
                "+".join(f"{POOLS[pool]}{x}" for x in wide[i])
                if wide and i in wide
                else f"{POOLS[pool]}{lane}"
            ),
            begin,
            begin + hours,
            hours,
            run,
            phase,
            tuple(names[d] for d in bridged[i]) if i in bridged else after,
        )
        for i, name, kind, resource, tier, pool, lane, begin, hours, run, phase, after in compress(
            rows, keep
        )
    )


# --- reduction ---------------------------------------------------------------------------


def reduce_drops(ctx: Context, base: frozenset[str]) -> tuple[frozenset[str], Schedule]:
    """Smallest-by-tier drop set, beyond ``base``, that makes the calendar fit.

    Exploratory steps go first, then useful ones; within a tier the longest first. Steps whose
    removal turned out unnecessary are then put back. Essential steps are never dropped.

    Returns:
        The dropped names (``base`` included) and the schedule without them; that schedule
        may still overrun when even the essential steps alone do not fit.
    """
    fits = _FitTest(ctx)
    dropped = set(base)
    if not fits(dropped):
        for tier in ("exploratory", "useful"):
            candidates = [
                i for i, t in enumerate(ctx.tiers) if t == tier and ctx.names[i] not in dropped
            ]
            candidates.sort(key=lambda i: (-ctx.hours[i], -i))
            names = [ctx.names[i] for i in candidates]
            if not names:
                continue
            if not fits(dropped | set(names)):
                dropped |= set(names)
                continue

            def fits_with(more: set[str], d: frozenset[str] = frozenset(dropped)) -> bool:
                return fits(d | more)

            dropped |= set(_smallest_prefix(names, fits_with))
            break
        added = [i for i in ctx.kept(frozenset(base)) if ctx.names[i] in dropped]
        if fits(dropped) and len(added) <= _PRUNE_LIMIT:
            # Put back what was not needed: useful steps first, shortest first.
            for i in sorted(added, key=lambda i: (TIER_RANK[ctx.tiers[i]], ctx.hours[i], i)):
                if fits(dropped - {ctx.names[i]}):
                    dropped.discard(ctx.names[i])
    final = frozenset(dropped)
    return final, ctx.schedule(final)


class _FitTest:
    """Whether the calendar without some steps fits its window, as cheaply as can be told.

    A span is never shorter than the kept GPU (human) hours divided by the lanes (every lane
    works at most the span), nor than the longest chain of kept steps. When the first bound
    (exact sums) overruns the window by more than a margin far above float rounding, the answer
    is no without scheduling; the second is checked once the chains are known, before the
    event loop. Otherwise the span is computed (without lanes).
    """

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.limit = ctx.window + EPS
        self.loads = [
            ([h if p == pool else 0.0 for h, p in zip(ctx.hours, ctx.pools, strict=True)], lanes)
            for pool, lanes in ((GPU_POOL, ctx.gpu_lanes), (HUMAN_POOL, ctx.human_lanes))
            if lanes > 0
        ]

    def __call__(self, drop: set[str] | frozenset[str]) -> bool:
        drop = frozenset(drop)
        keep = [n not in drop for n in self.ctx.names]
        margin = self.limit * (1 + _BOUND_SLACK) + _BOUND_SLACK
        if any(math.fsum(compress(h, keep)) / lanes > margin for h, lanes in self.loads):
            return False
        ctx = self.ctx
        _, _, span = list_schedule(
            ctx,
            keep,
            gpu_lanes=ctx.gpu_lanes,
            human_lanes=ctx.human_lanes,
            lanes=False,
            chain_cap=margin,
        )
        return span <= self.limit


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
