"""The GPU bench's ``loop`` part: the campaign's loop against a bare loop on short steps.

On the device's own clock (synchronized at both ends): for each step time asked (``--loop-ms``,
2 and 8 ms by default), the deep MLP's width is chosen by timing 20 bare steps of each width;
then ``train_run`` (its time less its evaluations and its saves' stalls) against the fastest
bare loop (``gpu.py``: data and indices on the device), alternated ``--repeats`` times, over
``--loop-s`` seconds each. Reported per step time: the per-step overhead in microseconds (goal
<= 50 us), the throughput ratio (goal >= 0.97x), the stall of each save, and from a second call
that resumes the first one's checkpoint: its restore and its time to the first step
(``setup_s``: built, placed, restored, before the first step).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

WIDTHS = (256, 512, 1024, 2048, 4096, 8192)
LAYERS = 4
GOAL_US = 50.0


def _width_for(w: Any, gpu: Any, ms: float) -> tuple[int, float]:
    """The width whose bare step is nearest ``ms`` (on a log scale), and its step ms."""
    best: tuple[float, int, float] | None = None
    for width in WIDTHS:
        w.data["control"]["hidden"] = [width] * LAYERS
        gpu.bare_loop(w, "fastest", 5)
        step_ms = 1e3 * gpu.bare_loop(w, "fastest", 20) / 20
        score = abs(math.log(step_ms / ms))
        if best is None or score < best[0]:
            best = (score, width, step_ms)
        if step_ms > 2 * ms:
            break
    assert best is not None
    return best[1], best[2]


def loop_part(w: Any, gpu: Any) -> dict[str, Any]:
    """Per step time asked: the width, the campaign's overhead per step and its ratio."""
    a = w.args
    hidden = w.data["control"]["hidden"]
    out: dict[str, Any] = {**gpu.now_context(w.device), "rows": []}
    try:
        for ms in a.loop_ms:
            width, step_ms = _width_for(w, gpu, ms)
            steps = max(50, math.ceil(a.loop_s / (step_ms / 1e3)))
            gaps, ratios, stalls = [], [], []
            res = None
            for _ in range(a.repeats):
                bare = gpu.bare_loop(w, "fastest", steps)
                res = w.campaign(steps)
                t = res.timings
                loop_s = t["train_s"] - sum(t["eval_s"]) - sum(t["stall_s"])
                gaps.append(1e6 * (loop_s - bare) / steps)
                ratios.append(bare / loop_s)
                stalls += list(t["stall_s"])
            resumed = w.campaign_resumed(steps)
            row = {
                "asked_ms": ms,
                "width": width,
                "layers": LAYERS,
                "bare_step_ms": step_ms,
                "steps": steps,
                "overhead_us": gaps,
                "vs_bare": ratios,
                "stall_s": stalls,
                "restore_s": resumed.timings["restore_s"],
                "first_step_s": resumed.timings["setup_s"],
            }
            out["rows"].append(row)
            print(row, flush=True)
    finally:
        w.data["control"]["hidden"] = hidden
    return out


def render(loop: dict[str, Any]) -> list[str]:
    med = statistics.median
    lines = [
        f"## The loop's cost per step ({loop['at']}, load {loop['load_avg']})",
        "",
        "| step (bare) | MLP | steps | overhead per step (us) | vs bare | stall per save | "
        "restore | first step of a resume |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in loop["rows"]:
        us, x = med(r["overhead_us"]), med(r["vs_bare"])
        stall = f"{1e3 * med(r['stall_s']):.1f} ms" if r["stall_s"] else "-"
        lines.append(
            f"| {r['bare_step_ms']:.2f} ms | {r['layers']}x{r['width']} | {r['steps']} | "
            f"{us:.0f} ({'met' if us <= GOAL_US else 'MISSED'}: <= {GOAL_US:g}) | "
            f"{x:.3f}x ({'met' if x >= 0.97 else 'MISSED'}: >= 0.97) | {stall} | "
            f"{r['restore_s']:.3f} s | {r['first_step_s']:.2f} s |"
        )
    return [*lines, ""]
