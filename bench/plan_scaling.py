"""Time to plan a large calendar: 10,000 steps with dependencies (goal: under 1 s).

Reported, not asserted (the machine is shared and noisy). Usage:

    .venv/bin/python bench/plan_scaling.py [--steps 10000] [--seed 0]
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

from gpucampaign.plan import calendar
from gpucampaign.spec import parse_spec


def make_spec(n: int, *, seed: int, window_days: int) -> dict[str, Any]:
    """A calendar of ``n`` steps; each waits for up to 3 of the 50 steps before it."""
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
    return {
        "name": "bench",
        "packages": [{"gpu": "rtx4090", "days": window_days, "count": 8}],
        "people": 3,
        "calendar": steps,
    }


def timed(label: str, fn: Any) -> Any:
    start = time.perf_counter()
    result = fn()
    print(f"{label:<48} {time.perf_counter() - start:8.3f} s")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    data = make_spec(args.steps, seed=args.seed, window_days=30)
    spec = timed(f"validate spec ({args.steps} steps)", lambda: parse_spec(data))
    plan = timed("plan (fits: no options computed)", lambda: calendar.plan(spec))
    print(f"  span {plan.span_hours:.1f} h, {plan.gpu_lanes} GPU lanes, fits={plan.fits}")

    tight = parse_spec({**data, "packages": [{"gpu": "rtx4090", "days": 3, "count": 8}]})
    plan = timed("plan (does not fit: options, reduce, second lot)", lambda: calendar.plan(tight))
    print(
        f"  span {plan.span_hours:.1f} h in {plan.window_hours:g} h; options: "
        + ", ".join(f"{o.kind} ({len(o.dropped)} dropped)" for o in plan.options)
    )
    print("goal: plan under 1 s for 10,000 steps (reported, not asserted)")


if __name__ == "__main__":
    main()
