"""The event loop that places kept steps on lanes: list scheduling by priority.

:func:`list_schedule` is called by :meth:`~gpucampaign.plan.planner.Context.schedule` (with
lane numbers) and :meth:`~gpucampaign.plan.planner.Context.span` (counts only).
"""

from __future__ import annotations

import heapq
import math
from itertools import compress, pairwise
from typing import Protocol

from gpucampaign.plan.schedule import GPU_POOL, HOST_POOL, HUMAN_POOL


class Steps(Protocol):
    """What the scheduler reads of a validated calendar (:class:`~gpucampaign.plan.planner.
    Context`): its columns by step index, its links and their reverse, a topological order."""

    hours: list[float]
    pools: list[int]
    tier_ranks: list[int]
    topo: list[int]
    link_offsets: list[int]
    offsets: list[int]
    dependents: list[int]
    widths: list[int]

    @property
    def wide(self) -> bool:
        """True when a step takes several GPU lanes."""
        ...

    def machines_for(self, gpu_lanes: int) -> list[list[int]]:
        """The GPU lanes of each machine, for ``gpu_lanes`` lanes in all."""
        ...


def list_schedule(
    ctx: Steps,
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
    has ended (the bridged links of :meth:`planner.Context.effective_deps`, without building them).

    With ``lanes`` False only free-lane counts are kept (which lane of a kind a step takes
    changes no time) and the returned lanes are all -1.

    When the longest chain of kept steps exceeds ``chain_cap``, no span can be shorter: the
    loop is skipped and the span returned is infinite.

    A step of a data-parallel run takes ``ctx.widths[i]`` GPU lanes of one machine at once
    (``_start_wide``); its lanes go into ``wide`` (by step index) when given.

    Returns:
        Start hour and lane number of each step (by index), and the span.
    """
    tail = _longest_chains(ctx, keep)
    if chain_cap < math.inf and max(tail, default=0.0) > chain_cap:
        return [], [], math.inf
    ranks = ctx.tier_ranks
    kept = list(compress(range(len(keep)), keep))
    # Stable sorts: tier ascending, then tail descending, then table order.
    order = sorted(sorted(kept, key=tail.__getitem__, reverse=True), key=ranks.__getitem__)
    loop = _EventLoop(
        ctx, keep, order, gpu_lanes=gpu_lanes, human_lanes=human_lanes, lanes=lanes, wide=wide
    )
    loop.run()
    assert loop.started == len(kept), "a step never started"
    hours, start = ctx.hours, loop.start
    span = max((start[i] + hours[i] for i in kept), default=0.0)
    return start, loop.lane_of, span


def _longest_chains(ctx: Steps, keep: list[bool]) -> list[float]:
    """Longest remaining chain (hours) from each step, the second priority key; a dropped step
    adds no hours."""
    hours, offsets, dependents = ctx.hours, ctx.offsets, ctx.dependents
    tail = [0.0] * len(keep)
    for i in reversed(ctx.topo):
        longest = 0.0
        for j in dependents[offsets[i] : offsets[i + 1]]:
            if tail[j] > longest:
                longest = tail[j]
        tail[i] = hours[i] + longest if keep[i] else longest
    return tail


class _EventLoop:
    """One pass of the scheduler: the ready heaps (one per kind of lane, holding priority
    ranks), the free lanes, the running steps (a heap of end hours) and each step's start and
    lane."""

    def __init__(
        self,
        ctx: Steps,
        keep: list[bool],
        order: list[int],
        *,
        gpu_lanes: int,
        human_lanes: int,
        lanes: bool,
        wide: dict[int, list[int]] | None,
    ) -> None:
        n = len(keep)
        self.ctx, self.keep, self.order, self.lanes, self.wide = ctx, keep, order, lanes, wide
        self.rank = [0] * n
        for r, i in enumerate(order):
            self.rank[i] = r
        self.waiting = [b - a for a, b in pairwise(ctx.link_offsets)]
        self.ready: list[list[int]] = [[], [], []]
        self.free_count = [gpu_lanes, human_lanes]
        self.free: list[list[int]] = [list(range(gpu_lanes)), list(range(human_lanes)), []]
        self.host_lanes = 0
        self.start = [0.0] * n
        self.lane_of = [-1] * n
        self.running: list[tuple[float, int]] = []
        self.now = 0.0
        self.started = 0
        # Steps of several GPUs: each machine's free lanes, and the lanes each running step
        # holds.
        self.widths = ctx.widths if ctx.wide else None
        self.machine_free = (
            [list(m) for m in ctx.machines_for(gpu_lanes)] if self.widths is not None else []
        )
        self.machine_of = {lane: m for m, ls in enumerate(self.machine_free) for lane in ls}
        self.held: dict[int, list[int]] = {}

    def run(self) -> None:
        """Start what is ready at hour 0, then at each end, until nothing runs."""
        keep, waiting, ready, pools, rank = (
            self.keep,
            self.waiting,
            self.ready,
            self.ctx.pools,
            self.rank,
        )
        for i in [i for i in range(len(keep)) if waiting[i] == 0]:
            if keep[i]:
                ready[pools[i]].append(rank[i])
            else:
                self.release(i)
        for queue in ready:
            heapq.heapify(queue)
        while True:
            self.start_ready()
            if not self.running:
                break
            self.end_next()

    def release(self, i: int) -> None:
        """Dropped step ``i`` passes through: wake whoever waited only for it."""
        keep, waiting, ready, pools, rank = (
            self.keep,
            self.waiting,
            self.ready,
            self.ctx.pools,
            self.rank,
        )
        offsets, dependents = self.ctx.offsets, self.ctx.dependents
        heappush = heapq.heappush
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

    def start_ready(self) -> None:
        """Start the ready steps, best first, while lanes of their kind are free."""
        heappush, heappop = heapq.heappush, heapq.heappop
        ready, free, free_count, order, hours = (
            self.ready,
            self.free,
            self.free_count,
            self.order,
            self.ctx.hours,
        )
        start, lane_of, running, now, lanes = (
            self.start,
            self.lane_of,
            self.running,
            self.now,
            self.lanes,
        )
        widths, held, wide = self.widths, self.held, self.wide
        started = self.started
        if widths is not None:
            for i in _start_wide(ready[GPU_POOL], order, widths, self.machine_free, held):
                lane_of[i] = held[i][0]
                if wide is not None and widths[i] > 1:
                    wide[i] = list(held[i])
                start[i] = now
                heappush(running, (now + hours[i], i))
                started += 1
        for pool in (GPU_POOL, HUMAN_POOL) if widths is None else (HUMAN_POOL,):
            queue = ready[pool]
            while queue and free_count[pool]:
                i = order[heappop(queue)]
                free_count[pool] -= 1
                if lanes:
                    lane_of[i] = heappop(free[pool])
                start[i] = now
                heappush(running, (now + hours[i], i))
                started += 1
        queue = ready[HOST_POOL]
        while queue:  # host lanes are not scarce
            i = order[heappop(queue)]
            if lanes:
                if free[HOST_POOL]:
                    lane_of[i] = heappop(free[HOST_POOL])
                else:
                    lane_of[i] = self.host_lanes
                    self.host_lanes += 1
            start[i] = now
            heappush(running, (now + hours[i], i))
            started += 1
        self.started = started

    def end_next(self) -> None:
        """Move to the next end hour: free the lanes of the steps that end then, and make
        ready the steps that waited only for them."""
        heappush, heappop = heapq.heappush, heapq.heappop
        running, held, free, free_count, lane_of = (
            self.running,
            self.held,
            self.free,
            self.free_count,
            self.lane_of,
        )
        keep, waiting, ready, rank, lanes = (
            self.keep,
            self.waiting,
            self.ready,
            self.rank,
            self.lanes,
        )
        pools, offsets, dependents = self.ctx.pools, self.ctx.offsets, self.ctx.dependents
        now = self.now = running[0][0]
        while running and running[0][0] == now:
            i = heappop(running)[1]
            pool = pools[i]
            if i in held:  # a GPU step while widths are kept: its lanes back to its machine
                for lane in held.pop(i):
                    heappush(self.machine_free[self.machine_of[lane]], lane)
            else:
                if pool != HOST_POOL:
                    free_count[pool] += 1
                if lanes:
                    heappush(free[pool], lane_of[i])
            for j in dependents[offsets[i] : offsets[i + 1]]:
                waiting[j] -= 1
                if waiting[j] == 0:
                    if keep[j]:
                        heappush(ready[pools[j]], rank[j])
                    else:
                        self.release(j)


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
