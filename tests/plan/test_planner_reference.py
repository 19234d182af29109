"""The list scheduler against a straightforward reference on random calendars.

The reference re-reads the rule of ``plan.calendar``'s docstring literally: at each event
(hour 0, then each end) it scans every step, sorts the ready ones by tier, longest remaining
chain and table order, and gives each the lowest free lane of its kind. It is quadratic and
obviously so; the planner must place every step exactly where it does (same lane, same start
and end to the last bit, same bridged ``after``), and reduce the same way.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpucampaign.config import CampaignSpec, parse_spec
from gpucampaign.plan import calendar
from gpucampaign.plan.schedule import TIER_RANK
from tests.helpers.fuzzing import examples

# Tenths next to whole hours: 0.1 + 0.2 != 0.3, so float ties are exercised too.
HOURS = [0.1, 0.2, 0.3, 6.0, 12.0, 24.0, 30.0, 48.0]
KINDS = ["gpu", "gpu", "cpu", "none", "human"]


@st.composite
def specs(draw: Any) -> dict[str, Any]:
    """A valid spec: steps linked only to steps of lower rank, then shuffled in the table (so
    links point up and down it), repeats in ``after`` allowed."""
    n = draw(st.integers(1, 16))
    steps = []
    for k in range(n):
        kind = draw(st.sampled_from(KINDS))
        after = draw(st.lists(st.integers(0, k - 1), max_size=3)) if k else []
        step: dict[str, Any] = {
            "name": f"s{k}",
            "kind": "human" if kind == "human" else "machine",
            "hours": draw(st.sampled_from(HOURS)),
            "tier": draw(st.sampled_from(["essential", "useful", "exploratory"])),
            "after": [f"s{a}" for a in after],
        }
        if kind != "human":
            step["resource"] = kind
        steps.append(step)
    table = draw(st.permutations(steps))
    data: dict[str, Any] = {
        "name": "ref",
        "packages": [{"gpu": "rtx4090", "days": 3, "count": draw(st.integers(1, 2))}],
        "people": draw(st.integers(1, 3)),
        "calendar": table,
    }
    window = draw(st.sampled_from([None, 72, 100, 150]))
    if window is not None:
        data["window_hours"] = window
    return data


def pool_of(s: Any) -> str:
    return "human" if s.kind == "human" else "gpu" if s.resource == "gpu" else "host"


def reference(
    spec: CampaignSpec, dropped: set[str], *, gpu_lanes: int
) -> dict[str, tuple[str, float, float, tuple[str, ...]]]:
    """Each kept step's (lane, start, end, bridged after), by the letter of the rule."""
    steps = list(spec.calendar)
    by_name = {s.name: s for s in steps}
    position = {s.name: i for i, s in enumerate(steps)}

    def bridged(name: str) -> list[str]:
        out: list[str] = []
        for a in by_name[name].after:
            for d in bridged(a) if a in dropped else [a]:
                if d not in out:
                    out.append(d)
        return out

    kept = [s for s in steps if s.name not in dropped]
    deps = {s.name: bridged(s.name) for s in kept}

    @cache
    def tail(name: str) -> float:
        later = [tail(o.name) for o in kept if name in deps[o.name]]
        return by_name[name].hours + max(later, default=0.0)

    lanes = {"gpu": gpu_lanes, "human": spec.people, "host": len(kept)}
    start: dict[str, float] = {}
    end: dict[str, float] = {}
    lane: dict[str, int] = {}
    now = 0.0
    while True:
        busy = {(pool_of(by_name[n]), lane[n]) for n in start if end[n] > now}
        ready = [
            s
            for s in kept
            if s.name not in start and all(d in end and end[d] <= now for d in deps[s.name])
        ]
        ready.sort(key=lambda s: (TIER_RANK[s.tier], -tail(s.name), position[s.name]))
        for s in ready:
            pool = pool_of(s)
            free = [k for k in range(lanes[pool]) if (pool, k) not in busy]
            if free:
                lane[s.name], start[s.name], end[s.name] = free[0], now, now + s.hours
                busy.add((pool, free[0]))
        later = [e for e in end.values() if e > now]
        if not later:
            break
        now = min(later)
    assert len(start) == len(kept)
    return {
        s.name: (f"{pool_of(s)}{lane[s.name]}", start[s.name], end[s.name], tuple(deps[s.name]))
        for s in kept
    }


def reference_span(spec: CampaignSpec, dropped: set[str], *, gpu_lanes: int) -> float:
    placed = reference(spec, dropped, gpu_lanes=gpu_lanes)
    return max((e for _, _, e, _ in placed.values()), default=0.0)


def reference_reduce(spec: CampaignSpec, *, gpu_lanes: int) -> set[str]:
    """Exploratory steps first, then useful ones, longest first; the shortest prefix that fits
    (by bisection); then put back what was not needed, useful first, shortest first."""
    steps = list(spec.calendar)
    position = {s.name: i for i, s in enumerate(steps)}

    def fits(drop: set[str]) -> bool:
        return reference_span(spec, drop, gpu_lanes=gpu_lanes) <= spec.window + 1e-9

    dropped: set[str] = set()
    if not fits(dropped):
        for tier in ("exploratory", "useful"):
            names = [
                s.name
                for s in sorted(
                    (s for s in steps if s.tier == tier and s.name not in dropped),
                    key=lambda s: (-s.hours, -position[s.name]),
                )
            ]
            if not names:
                continue
            if not fits(dropped | set(names)):
                dropped |= set(names)
                continue
            lo, hi = 1, len(names)
            while lo < hi:
                mid = (lo + hi) // 2
                if fits(dropped | set(names[:mid])):
                    hi = mid
                else:
                    lo = mid + 1
            dropped |= set(names[:lo])
            break
        added = [s for s in steps if s.name in dropped]
        if fits(dropped) and len(added) <= 64:
            for s in sorted(added, key=lambda s: (TIER_RANK[s.tier], s.hours, position[s.name])):
                if fits(dropped - {s.name}):
                    dropped.discard(s.name)
    return dropped


def placed(p: calendar.Plan) -> dict[str, tuple[str, float, float, tuple[str, ...]]]:
    return {s.name: (s.lane, s.start_hours, s.end_hours, s.after) for s in p.steps}


@settings(derandomize=True, max_examples=examples(300), deadline=None)
@given(data=specs(), drop_bits=st.integers(0, 2**16 - 1))
def test_plan_places_every_step_where_the_reference_does(
    data: dict[str, Any], drop_bits: int
) -> None:
    spec = parse_spec(data)  # accepted: the planner below plans it
    names = [s.name for s in spec.calendar]
    drop = {n for k, n in enumerate(names) if drop_bits >> k & 1 and k % 3 == 0}
    for dropped in (set(), drop):
        p = calendar.plan(spec, drop=sorted(dropped))
        want = reference(spec, dropped, gpu_lanes=p.gpu_lanes)
        assert [s.name for s in p.steps] == [n for n in names if n not in dropped]
        assert placed(p) == want
        assert p.span_hours == max((e for _, _, e, _ in want.values()), default=0.0)
        for o in p.options:
            if o.kind == "second_lot":
                lanes = p.gpu_lanes + p.packages[0].gpus_per_lot
                assert o.span_hours == reference_span(spec, dropped, gpu_lanes=lanes)


@settings(derandomize=True, max_examples=examples(150), deadline=None)
@given(data=specs())
def test_reduce_to_fit_drops_what_the_reference_drops(data: dict[str, Any]) -> None:
    spec = parse_spec(data)
    p, dropped = calendar.reduce_to_fit(spec)
    want = reference_reduce(spec, gpu_lanes=p.gpu_lanes)
    assert dropped == [s.name for s in spec.calendar if s.name in want]
    assert placed(p) == reference(spec, want, gpu_lanes=p.gpu_lanes)
    assert p.fits == (reference_span(spec, want, gpu_lanes=p.gpu_lanes) <= spec.window + 1e-9)
