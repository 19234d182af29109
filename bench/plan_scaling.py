"""Time to validate and plan large calendars: 1k and 10k steps, the largest a spec accepts.

A spec holds at most ``MAX_CALENDAR_STEPS`` (10,000) steps since issue 32: the sizes above it
that were measured before (100k, with its goal of under 2 s, and 1M) are refused by the spec,
so they are skipped, and the output says so.

Each size is a calendar of ``n`` steps; each step waits for up to 3 of the 50 steps before it,
on one 30-day lot of ``max(8, n // 1250)`` RTX 4090s, so that every size has the same shape
(about 1,250 steps per GPU lane) and fits its window: the plan is one schedule plus its
checks. A second column plans the same calendar on a 3-day lot of 8 GPUs, which does not fit:
then the plan also computes its options (a larger lot, a smaller protocol found by a binary
search over the steps to drop, each try one more schedule, and a second lot).

Each size runs in a fresh process (``--repeats`` times up to 100,000 steps, once above; the
table gives the median). Reported, not asserted (the machine is shared and noisy); writes the
table to ``bench/results/plan_scaling.md`` with the load average before and after. Usage:

    .venv/bin/python bench/plan_scaling.py [--sizes 1000,10000]
        [--repeats 3] [--tight-max 100000] [--seed 0] [--out bench/results/plan_scaling.md]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpucampaign.config import parse_spec
from gpucampaign.config.parts import MAX_CALENDAR_STEPS
from gpucampaign.plan import calendar

ROOT = Path(__file__).resolve().parents[1]
GOAL_STEPS, GOAL_S = 100_000, 2.0


def make_spec(
    n: int, *, seed: int, window_days: int, count: int | None = None, fit: bool = True
) -> dict[str, Any]:
    """A calendar of ``n`` steps; each waits for up to 3 of the 50 steps before it.

    On ``count`` RTX 4090 lots of ``window_days`` days (default ``max(8, n // 1250)``: the same
    steps per GPU lane at every size). Its chains grow with ``n`` (about 0.0125 h a step), so
    with ``fit`` the window is stretched to ``0.02 * n`` hours when the lot is shorter (the
    plan warns that the window outlasts the lot); without it the window is the lot's.
    """
    rng = random.Random(seed)
    steps = []
    for i in range(n):
        kind = rng.choice(["gpu", "gpu", "gpu", "cpu", "none", "human"])
        step: dict[str, Any] = {
            "name": f"s{i}",
            "kind": "human" if kind == "human" else "machine",
            "hours": rng.choice([0.05, 0.1, 0.25, 0.5]),
            "tier": rng.choice(["essential", "essential", "useful", "exploratory"]),
            "after": sorted(
                {f"s{rng.randrange(max(0, i - 50), i)}" for _ in range(rng.randint(0, 3))}
            )
            if i
            else [],
        }
        if kind != "human":
            step["resource"] = kind
        steps.append(step)
    count = max(8, n // 1250) if count is None else count
    spec: dict[str, Any] = {
        "name": "bench",
        "packages": [{"gpu": "rtx4090", "days": window_days, "count": count}],
        "people": 3,
        "calendar": steps,
    }
    if fit and 0.02 * n > 24 * window_days:
        spec["window_hours"] = 0.02 * n
    return spec


def seconds(fn: Any) -> tuple[float, float, Any]:
    """Wall-clock and CPU seconds of ``fn()``, and its result."""
    start, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return time.perf_counter() - start, time.process_time() - cpu, result


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def row(n: int, *, seed: int, tight: bool) -> dict[str, Any]:
    # As in load_spec, the raw mapping is gone once validated (freeing it is timed too).
    raw = [make_spec(n, seed=seed, window_days=30)]
    validate_s, validate_cpu, spec = seconds(lambda: parse_spec(raw.pop()))
    plan_s, plan_cpu, plan = seconds(lambda: calendar.plan(spec))
    out = {"n": n, "validate": validate_s, "plan": plan_s, "fits": plan.fits}
    out["cpu"] = validate_cpu + plan_cpu
    out["span"], out["lanes"] = plan.span_hours, plan.gpu_lanes
    del spec, plan
    if tight:
        data = make_spec(n, seed=seed, window_days=3, count=8, fit=False)
        spec = parse_spec(data)
        out["tight"], _, plan = seconds(lambda: calendar.plan(spec))
        dropped = next((len(o.dropped) for o in plan.options if o.dropped), 0)
        kinds = ", ".join(o.kind for o in plan.options)
        out["tight_note"] = f"{kinds}; {dropped:,} dropped" if kinds else "fits: no options"
    return out


def render(rows: list[dict[str, Any]], *, before: str, after: str, wall_s: float) -> str:
    lines = [
        "# Planner scaling (`python bench/plan_scaling.py`)",
        "",
        f"Recorded {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {platform.node()} "
        f"({os.cpu_count()} cores, Python {platform.python_version()}) in {wall_s:.0f} s. "
        f"Load average (1, 5, 15 min) before: {before}; after: {after}. Wall-clock seconds, "
        "each size in a fresh process, the median of the repeats (in brackets); the machine "
        "may be shared, so read the CPU seconds and the ratios as well as the times.",
        "",
        "Calendar: each step waits for up to 3 of the 50 steps before it; one 30-day lot of "
        "max(8, n / 1250) RTX 4090s, so every size fits its window (validate = `parse_spec`, "
        "plan = `calendar.plan`). Ratio: total over the previous row's (10x the steps: ~10x "
        "is linear, ~13x is n log n). CPU: process time of validate + plan, less sensitive to "
        "other load than the wall clock. Does not fit: the same calendar on a 3-day lot of 8 GPUs, "
        "whose plan also computes its options.",
        "",
        "| steps | validate | plan | total | ratio | CPU (ratio) | per step | does not fit: "
        "plan with options |",
        "|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    prev = None
    for r in rows:
        total = r["validate"] + r["plan"]
        ratio = f"{total / prev[0]:.1f}x" if prev else "-"
        cpu = f"{r['cpu']:.2f} s" + (f" ({r['cpu'] / prev[1]:.1f}x)" if prev else "")
        tight = f"{r['tight']:.2f} s ({r['tight_note']})" if "tight" in r else "not run"
        lines.append(
            f"| {r['n']:,} ({r['repeats']}) | {r['validate']:.2f} s | {r['plan']:.2f} s | "
            f"{total:.2f} s | "
            f"{ratio} | {cpu} | {total / r['n'] * 1e6:.1f} us | {tight} |"
        )
        prev = (total, r["cpu"])
    goal = [r for r in rows if r["n"] == GOAL_STEPS]
    if goal:
        total = goal[0]["validate"] + goal[0]["plan"]
        cpu = goal[0]["cpu"]
        verdict = "met" if total < GOAL_S else "missed"
        lines += [
            "",
            f"Goal: validate + plan of {GOAL_STEPS:,} steps under {GOAL_S:g} s: {verdict} "
            f"({total:.2f} s wall clock, {cpu:.2f} s CPU).",
        ]
    else:
        lines += [
            "",
            f"Measured up to {MAX_CALENDAR_STEPS:,} steps, the largest calendar a spec accepts "
            f"(`MAX_CALENDAR_STEPS`): the goal of {GOAL_STEPS:,} steps under {GOAL_S:g} s is not "
            "measured, since the spec refuses a calendar that long.",
        ]
    return "\n".join(lines) + "\n"


def median_row(n: int, *, seed: int, tight: bool, repeats: int) -> dict[str, Any]:
    """``row`` in ``repeats`` fresh processes; the median of each time."""
    runs = []
    for _ in range(repeats):
        args = [sys.executable, __file__, "--child", str(n), "--seed", str(seed)]
        out = subprocess.run(
            [*args, *(["--tight-max", str(n)] if tight else ["--tight-max", "0"])],
            capture_output=True,
            text=True,
            check=True,
        )
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    r = dict(runs[0], repeats=repeats)
    for k in ("validate", "plan", "cpu", "tight"):
        if k in r:
            r[k] = statistics.median(x[k] for x in runs)
    return r


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=f"1000,{MAX_CALENDAR_STEPS}")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tight-max", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "plan_scaling.md")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        r = row(args.child, seed=args.seed, tight=args.child <= args.tight_max)
        print(json.dumps(r))
        return

    before, start = load(), time.perf_counter()
    rows = []
    sizes = [int(x) for x in args.sizes.split(",")]
    if skipped := [n for n in sizes if n > MAX_CALENDAR_STEPS]:
        print(
            f"skipped {', '.join(f'{n:,}' for n in skipped)} steps: a spec accepts at most "
            f"{MAX_CALENDAR_STEPS:,} (MAX_CALENDAR_STEPS); measured up to that, the largest",
            flush=True,
        )
    for n in (n for n in sizes if n <= MAX_CALENDAR_STEPS):
        repeats = args.repeats if n <= GOAL_STEPS else 1
        r = median_row(n, seed=args.seed, tight=n <= args.tight_max, repeats=repeats)
        print(
            f"{n:>9,} steps: validate {r['validate']:.3f} s, plan {r['plan']:.3f} s "
            f"(fits={r['fits']}, span {r['span']:.1f} h on {r['lanes']} GPU lanes)"
            + (f"; does not fit: {r['tight']:.3f} s ({r['tight_note']})" if "tight" in r else ""),
            flush=True,
        )
        rows.append(r)
    text = render(rows, before=before, after=load(), wall_s=time.perf_counter() - start)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
