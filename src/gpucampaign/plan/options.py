"""The options offered when a calendar does not fit its window.

A larger package (longer lots of the same GPU), a smaller protocol (optional steps dropped)
and a second lot in parallel (only when independent GPU steps exist). Each is an
:class:`Option` with its own span, window and price, so the user compares them side by side.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from decimal import Decimal
from itertools import pairwise
from typing import Any

from gpucampaign.plan.planner import Context, reduce_drops
from gpucampaign.plan.schedule import EPS, TIER_RANK, Schedule, round_hours, say_hours
from gpucampaign.plan.tariffs import format_usd, usd


@dataclass(frozen=True)
class Option:
    """A way to make a calendar that does not fit fit."""

    kind: str  # "larger_package" | "smaller_protocol" | "second_lot"
    description: str
    span_hours: float
    window_hours: float
    total_price_usd: Decimal | None
    fits: bool
    dropped: tuple[str, ...] = ()
    requires: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The ``options[]`` entry of ``campaign plan --json``."""
        d = asdict(self)
        d["span_hours"] = round_hours(self.span_hours)
        d["window_hours"] = round_hours(self.window_hours)
        d["total_price_usd"] = usd(self.total_price_usd)
        d["dropped"] = list(self.dropped)
        return d


def options_for(ctx: Context, dropped: frozenset[str], sched: Schedule) -> list[Option]:
    """Every option that applies to a calendar whose schedule ``sched`` overruns."""
    candidates = (
        _larger_package(ctx, sched.span),
        _smaller_protocol(ctx, dropped),
        _second_lot(ctx, dropped),
    )
    return [o for o in candidates if o is not None]


def _over(ctx: Context, span: float) -> str:
    ok = span <= ctx.window + EPS
    return "fits" if ok else f"still {say_hours(span - ctx.window)} h over the window"


def _smaller_protocol(ctx: Context, dropped: frozenset[str]) -> Option | None:
    """The same lots with optional steps dropped until the calendar fits."""
    reduced, rsched = reduce_drops(ctx, dropped)
    newly = tuple(n for n in ctx.names if n in reduced and n not in dropped)
    if not newly:
        return None
    fresh = set(newly)
    tiers = sorted(
        {t for n, t in zip(ctx.names, ctx.tiers, strict=True) if n in fresh},
        key=TIER_RANK.__getitem__,
    )
    return Option(
        kind="smaller_protocol",
        description=(
            f"drop {' and '.join(tiers)} step(s) {', '.join(newly)}: "
            f"span {say_hours(rsched.span)} h, {_over(ctx, rsched.span)}, "
            f"same lots at {format_usd(ctx.price)}"
        ),
        span_hours=rsched.span,
        window_hours=ctx.window,
        total_price_usd=ctx.price,
        fits=ctx.fits(rsched),
        dropped=newly,
        requires=(
            "nothing more to rent; the question each dropped step would have answered stays "
            "open, and the report says so"
        ),
    )


def _larger_package(ctx: Context, span: float) -> Option | None:
    """Each package replaced by the shortest longer lot of the same GPU that covers the span."""
    replaced = []
    for p in ctx.packages:
        lot = next(
            (x for x in ctx.catalog.lots_of(p.gpu) if x.days > p.days and x.hours >= span - EPS),
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
        f"{_count(p.count)} {lot.days}-day {p.gpu} lot{'s' if p.count > 1 else ''}"
        for p, lot in replaced
    )
    ok = span <= window + EPS
    tail = (
        f"span {say_hours(span)} h fits with {say_hours(window - span)} h uncommitted"
        if ok
        else f"span {say_hours(span)} h still exceeds {say_hours(window)} h"
    )
    cost = format_usd(price) if known else "price not in catalog: give price_usd"
    return Option(
        kind="larger_package",
        description=f"{what} ({say_hours(window)} h window) instead: {tail}; {cost}",
        span_hours=span,
        window_hours=window,
        total_price_usd=price if known else None,
        fits=ok,
        requires=(
            "one rental long enough for the whole calendar: no state to move between lots"
            + (
                ""
                if known
                else "; the price comes from your catalog (give price_usd), never assumed"
            )
        ),
    )


def _second_lot(ctx: Context, dropped: frozenset[str]) -> Option | None:
    """One more lot of the first package, only when independent GPU steps exist."""
    if not _has_independent_gpu_steps(ctx, dropped):
        return None
    p = ctx.packages[0]
    lanes = ctx.gpu_lanes + p.gpus_per_lot
    span = ctx.span(dropped, gpu_lanes=lanes)
    price = ctx.price + p.price_usd
    return Option(
        kind="second_lot",
        description=(
            f"one more {p.days}-day {p.gpu} lot in parallel ({lanes} GPU lanes): independent "
            f"GPU steps run side by side, span {say_hours(span)} h, "
            f"{_over(ctx, span)}; {format_usd(price)}. It does not shorten any single "
            "step nor merge GPU memory."
        ),
        span_hours=span,
        window_hours=ctx.window,
        total_price_usd=price,
        fits=span <= ctx.window + EPS,
        requires=(
            f"a second {p.gpu} lot rented for the same dates, the corpus and code copied to it, "
            f"the GPU lock raised to {lanes} slots, and its outputs moved back before it ends"
        ),
    )


def _has_independent_gpu_steps(ctx: Context, dropped: frozenset[str]) -> bool:
    """True unless the kept GPU steps form one chain of the dependency order.

    They form a chain exactly when each is reachable from the previous one in a topological
    order, so only consecutive pairs need a search.
    """
    deps = ctx.effective_deps(dropped)
    position = {i: k for k, i in enumerate(ctx.topo)}
    gpu = [i for i in ctx.topo if ctx.resources[i] == "gpu" and ctx.names[i] not in dropped]
    for a, b in pairwise(gpu):
        stack, seen = [b], {b}
        found = False
        while stack and not found:
            node = stack.pop()
            for d in deps[node] if node in deps else ctx.links(node):
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
