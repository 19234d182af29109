"""The list scheduler behind :mod:`gpucampaign.plan.calendar`: steps, lanes, span, reductions.

Pure functions, no Prefect. :class:`Context` validates a spec once (lots, window, hours,
dependencies); :meth:`Context.schedule` places the kept steps on lanes; :func:`reduce_drops`
finds the smallest set of optional steps to drop so that the calendar fits its window.

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
import heapq
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from decimal import Decimal
from functools import cached_property
from itertools import accumulate, compress, pairwise
from operator import attrgetter
from pathlib import Path
from typing import Any

from gpucampaign.plan.tariffs import (
    Catalog,
    ResolvedPackage,
    format_usd,
    load_catalog,
    resolve_package,
)
from gpucampaign.spec import CampaignSpec, SpecError, run_size

TIER_RANK = {"essential": 0, "useful": 1, "exploratory": 2}
EPS = 1e-9
# Above this many newly dropped steps, reduce_drops skips the pass that puts back steps whose
# removal turned out unnecessary: each try is a full re-plan, and such a set is large anyway.
_PRUNE_LIMIT = 64
# The kinds of lane, by index: a GPU step takes a GPU lane, a human step a human lane, any
# other machine step a host lane (host lanes are not scarce: a new one opens when all are busy).
POOLS = ("gpu", "human", "host")
_GPU, _HUMAN, _HOST = 0, 1, 2
# Relative slack for the load bound in reduce_drops, far above float rounding of the sums.
_BOUND_SLACK = 1e-7


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
class Schedule:
    """The kept steps on their lanes and the span they make."""

    span: float
    steps: tuple[ScheduledStep, ...]


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
        warnings = _price_warnings(packages)
        window = _window(spec, packages, warnings)
        cal = spec.calendar

        def column(field: str) -> list[Any]:
            return list(map(attrgetter(field), cal))

        names = column("name")
        index = {n: i for i, n in enumerate(names)}
        overrides = _check_overrides(hours_override, index)
        kinds, tiers = column("kind"), column("tier")
        resources = [
            r if k == "machine" else None for k, r in zip(kinds, column("resource"), strict=True)
        ]
        after = _unique_links(column("after"))
        link_offsets = list(accumulate(map(len, after), initial=0))
        link_targets = [index[a] for links in after for a in links]
        offsets, dependents = _dependents_of(link_offsets, link_targets)
        machines = _machines(packages)
        widths = _widths(spec, names, column("run"), resources, packages)
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
            hours=_hours(spec, column("hours"), overrides, index),
            runs=column("run"),
            phases=column("phase"),
            descriptions=column("description"),
            after=after,
            pools=[
                _HUMAN if k == "human" else _GPU if r == "gpu" else _HOST
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
        start, lane_of, span = _list_schedule(
            self, keep, gpu_lanes=lanes, human_lanes=self.human_lanes, lanes=True, wide=wide
        )
        steps = _placed(self, keep, dropped, start=start, lane_of=lane_of, wide=wide)
        return Schedule(span=span, steps=steps)

    def span(self, dropped: frozenset[str], *, gpu_lanes: int | None = None) -> float:
        """The span :meth:`schedule` would give, without placing the steps on lanes."""
        lanes = self.gpu_lanes if gpu_lanes is None else gpu_lanes
        return _list_schedule(
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


def _hours(
    spec: CampaignSpec, hours: list[float], overrides: Mapping[str, float], index: Mapping[str, int]
) -> list[float]:
    hours = list(map(float, hours))
    for name, h in overrides.items():
        hours[index[name]] = h
    if not all(map(math.isfinite, hours)):
        i = next(i for i, h in enumerate(hours) if not math.isfinite(h))
        s = spec.calendar[i]
        raise SpecError(
            f"field 'calendar[{i}].hours': step '{s.name}' has {overrides.get(s.name, s.hours)} "
            "hours; give a finite positive number of hours.",
            field=f"calendar[{i}].hours",
        )
    return hours


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


def _list_schedule(
    ctx: Context,
    keep: list[bool],
    *,
    gpu_lanes: int,
    human_lanes: int,
    lanes: bool,
    chain_cap: float = math.inf,
    wide: dict[int, list[int]] | None = None,
) -> tuple[list[float], list[int], float]:
    """Event-driven list scheduling, O((steps + links) log steps).

    A step is ready when every step it waits for has ended; at each event (hour 0, then each
    end) ready steps start while a lane of their kind is free, best priority first: tier, then
    the longest remaining chain (hours), then table order. The priority is one sort, so the
    heaps hold integers.

    A dropped step is a pass-through: it ends the moment everything it waits for has ended and
    takes no lane and no time, so a step that waited for it starts when what it waited for
    has ended (the bridged links of :meth:`Context.effective_deps`, without building them).

    With ``lanes`` False only free-lane counts are kept (which lane of a kind a step takes
    changes no time) and the returned lanes are all -1.

    When the longest chain of kept steps exceeds ``chain_cap``, no span can be shorter: the
    loop is skipped and the span returned is infinite.

    A step of a data-parallel run takes ``ctx.widths[i]`` GPU lanes of one machine at once
    (``_start_wide``); its lanes go into ``wide`` (by step index) when given.

    Returns:
        Start hour and lane number of each step (by index), and the span.
    """
    n = len(keep)
    hours, pools, offsets, dependents = ctx.hours, ctx.pools, ctx.offsets, ctx.dependents
    waiting = [b - a for a, b in pairwise(ctx.link_offsets)]
    # Longest remaining chain (hours) from each step, the second priority key; a dropped step
    # adds no hours.
    tail = [0.0] * n
    for i in reversed(ctx.topo):
        longest = 0.0
        for j in dependents[offsets[i] : offsets[i + 1]]:
            if tail[j] > longest:
                longest = tail[j]
        tail[i] = hours[i] + longest if keep[i] else longest
    if chain_cap < math.inf and max(tail, default=0.0) > chain_cap:
        return [], [], math.inf
    ranks = ctx.tier_ranks
    kept = list(compress(range(n), keep))
    # Stable sorts: tier ascending, then tail descending, then table order.
    order = sorted(sorted(kept, key=tail.__getitem__, reverse=True), key=ranks.__getitem__)
    rank = [0] * n
    for r, i in enumerate(order):
        rank[i] = r

    ready: list[list[int]] = [[], [], []]
    free_count = [gpu_lanes, human_lanes]
    free: list[list[int]] = [list(range(gpu_lanes)), list(range(human_lanes)), []]
    host_lanes = 0
    start = [0.0] * n
    lane_of = [-1] * n
    running: list[tuple[float, int]] = []
    heappush, heappop = heapq.heappush, heapq.heappop

    def release(i: int) -> None:
        """Dropped step ``i`` passes through: wake whoever waited only for it."""
        stack = [i]
        while stack:
            k = stack.pop()
            for j in dependents[offsets[k] : offsets[k + 1]]:
                waiting[j] -= 1
                if waiting[j] == 0:
                    if keep[j]:
                        heappush(ready[pools[j]], rank[j])
                    else:
                        stack.append(j)

    for i in [i for i in range(n) if waiting[i] == 0]:
        if keep[i]:
            ready[pools[i]].append(rank[i])
        else:
            release(i)
    for queue in ready:
        heapq.heapify(queue)
    now = 0.0
    started = 0
    # Steps of several GPUs: each machine's free lanes, and the lanes each running step holds.
    widths = ctx.widths if ctx.wide else None
    machine_free = [list(m) for m in ctx.machines_for(gpu_lanes)] if widths is not None else []
    machine_of = {lane: m for m, ls in enumerate(machine_free) for lane in ls}
    held: dict[int, list[int]] = {}
    while True:
        if widths is not None:
            for i in _start_wide(ready[_GPU], order, widths, machine_free, held):
                lane_of[i] = held[i][0]
                if wide is not None and widths[i] > 1:
                    wide[i] = list(held[i])
                start[i] = now
                heappush(running, (now + hours[i], i))
                started += 1
        for pool in (_GPU, _HUMAN) if widths is None else (_HUMAN,):
            queue = ready[pool]
            while queue and free_count[pool]:
                i = order[heappop(queue)]
                free_count[pool] -= 1
                if lanes:
                    lane_of[i] = heappop(free[pool])
                start[i] = now
                heappush(running, (now + hours[i], i))
                started += 1
        queue = ready[_HOST]
        while queue:  # host lanes are not scarce
            i = order[heappop(queue)]
            if lanes:
                if free[_HOST]:
                    lane_of[i] = heappop(free[_HOST])
                else:
                    lane_of[i] = host_lanes
                    host_lanes += 1
            start[i] = now
            heappush(running, (now + hours[i], i))
            started += 1
        if not running:
            break
        now = running[0][0]
        while running and running[0][0] == now:
            i = heappop(running)[1]
            pool = pools[i]
            if i in held:  # a GPU step while widths are kept: its lanes back to its machine
                for lane in held.pop(i):
                    heappush(machine_free[machine_of[lane]], lane)
            else:
                if pool != _HOST:
                    free_count[pool] += 1
                if lanes:
                    heappush(free[pool], lane_of[i])
            for j in dependents[offsets[i] : offsets[i + 1]]:
                waiting[j] -= 1
                if waiting[j] == 0:
                    if keep[j]:
                        heappush(ready[pools[j]], rank[j])
                    else:
                        release(j)
    assert started == len(kept), "a step never started"
    span = max((start[i] + hours[i] for i in kept), default=0.0)
    return start, lane_of, span


def _start_wide(
    queue: list[int],
    order: list[int],
    widths: list[int],
    machine_free: list[list[int]],
    held: dict[int, list[int]],
) -> list[int]:
    """Start the ready GPU steps that find their width of free lanes on one machine, best
    priority first; a step that does not fit now waits (the others may pass it)."""
    heappush, heappop = heapq.heappush, heapq.heappop
    started, waiting = [], []
    while queue and any(machine_free):
        r = heappop(queue)
        i = order[r]
        w = widths[i]
        machine = next((m for m in machine_free if len(m) >= w), None)
        if machine is None:
            waiting.append(r)
            continue
        held[i] = [heappop(machine) for _ in range(w)]
        started.append(i)
    for r in waiting:
        heappush(queue, r)
    return started


def _machines(packages: tuple[ResolvedPackage, ...]) -> list[list[int]]:
    """The GPU lanes of each machine (one lot), numbered as the planner numbers lanes."""
    machines: list[list[int]] = []
    lane = 0
    for p in packages:
        for _ in range(p.count):
            machines.append(list(range(lane, lane + p.gpus_per_lot)))
            lane += p.gpus_per_lot
    return machines


def _widths(
    spec: CampaignSpec,
    names: list[str],
    runs: list[str | None],
    resources: list[str | None],
    packages: tuple[ResolvedPackage, ...],
) -> list[int]:
    """GPU lanes each step takes: its run's ``gpus`` for a GPU step, else 1.

    Raises:
        SpecError: A run needs more GPUs than any one machine (lot) of the spec has.
    """
    gpus: dict[str, int] = {}
    widths = []
    for run, resource in zip(runs, resources, strict=True):
        if resource != "gpu" or run is None or spec.control is None:
            widths.append(1)
            continue
        if run not in gpus:
            try:
                gpus[run] = run_size(spec.run_config(run)).processes
            except SpecError:
                gpus[run] = 1  # an unknown run is reported where runs are checked
        widths.append(gpus[run])
    largest = max((p.gpus_per_lot for p in packages), default=0)
    for name, run, width in zip(names, runs, widths, strict=True):
        if width > largest:
            lots = " + ".join(
                f"{p.count} {p.gpu} lot(s) of {p.gpus_per_lot} GPU(s)" for p in packages
            )
            raise SpecError(
                f"calendar step '{name}' runs '{run}' with gpus: {width}: a data-parallel run "
                f"needs {width} GPUs of ONE machine, and the spec's lots ({lots}) have at most "
                f"{largest} each. Separate lots are separate machines: GPU memory and NVLink "
                f"do not span them, so {width} GPUs of different lots cannot run it. Rent a "
                f"lot with {width} GPUs on one machine (a b200 lot has 2), or set gpus: "
                f"{largest} for that run.",
                field="gpus",
            )
    return widths


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
            for pool, lanes in ((_GPU, ctx.gpu_lanes), (_HUMAN, ctx.human_lanes))
            if lanes > 0
        ]

    def __call__(self, drop: set[str] | frozenset[str]) -> bool:
        drop = frozenset(drop)
        keep = [n not in drop for n in self.ctx.names]
        margin = self.limit * (1 + _BOUND_SLACK) + _BOUND_SLACK
        if any(math.fsum(compress(h, keep)) / lanes > margin for h, lanes in self.loads):
            return False
        ctx = self.ctx
        _, _, span = _list_schedule(
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
