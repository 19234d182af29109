"""What the early stops saved: the GPU time of the steps the stopped variants did not train.

A ``futile`` stop (``engine/futility.py``) ends a variant at an evaluation when it cannot win,
a ``not_learning`` stop (``engine/rules.py``) one whose training loss is not below its start.
The time each saved is its planned steps minus the steps it did, times its measured step time
(the median of that training call's steps, kept with the stop's numbers). The timeline agrees:
the variant's training segment ends at the stop with the steps it trained, and the next GPU
segment (the next run in the queue) starts after it. The report states it in one line.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gpucampaign.core.files import parse_time
from gpucampaign.core.stoprules import EARLY_RULES, Futile
from gpucampaign.core.text import say_hours
from gpucampaign.engine.futility import saved_seconds
from gpucampaign.folder.records import StopRecord, TimelineRow, read_result

#: The timeline phases that hold the GPU.
GPU_PHASES = ("pilot", "train", "restart")


def futile_segment(root: str | Path, stop: Futile) -> tuple[int | None, str]:
    """The steps a training segment trained before a futility stop ended it, and its note.

    Args:
        root: The output folder (the run's ``result.json``, written before the stop).
        stop: The stop raised.
    """
    res = read_result(root, stop.run_id)
    steps = None if res is None else res.steps_done - (res.resumed_from_step or 0)
    planned = stop.numbers.get("planned_steps")
    left = stop.numbers.get("steps_saved")
    how = "as futile" if stop.rule == Futile.rule else f"by {stop.rule}"
    note = (
        f"{stop.run_id}: stopped {how} at step {stop.step} of {planned}; {left} step(s) "
        "not trained, the GPU lane goes to the next run"
    )
    return steps, note


def _ended_by(row: TimelineRow, run: str | None) -> bool:
    return (
        row.phase == "train"
        and row.run == run
        and (row.outcome or "").startswith(tuple(f"failed: {r}:" for r in EARLY_RULES))
    )


def _next_gpu_segment(timeline: Sequence[TimelineRow], after: TimelineRow) -> TimelineRow | None:
    """The first GPU segment that started once ``after`` had ended."""
    if not after.end:
        return None
    end = parse_time(after.end)
    later = [
        r
        for r in timeline
        if r is not after and r.kind == "machine" and r.phase in GPU_PHASES and r.start
        if parse_time(r.start) >= end
    ]
    return min(later, key=lambda r: parse_time(r.start), default=None)


def futility_savings(
    root: str | Path, *, stops: Iterable[StopRecord], timeline: Sequence[TimelineRow]
) -> dict[str, Any]:
    """The GPU time saved by the early stops (``futile``, ``not_learning``), run by run, with
    their timeline segments.

    Returns:
        ``{runs: [{run, run_id, stop_id, rule, step, planned_steps, steps_saved, step_s, saved_s,
        segment: {start, end, steps}, next: {run, phase, start}}], saved_s}``; ``saved_s`` is
        None when no futile stop has a measured step time (and the list is empty without one).
    """
    runs = []
    for s in stops:
        if s.rule not in EARLY_RULES:
            continue
        res = read_result(root, s.run_id)
        numbers = dict(s.numbers or ((res.stop or {}).get("numbers") if res else None) or {})
        planned = res.planned_steps if res is not None else numbers.get("planned_steps")
        done = res.steps_done if res is not None else s.step
        if isinstance(planned, int) and isinstance(done, int):
            numbers["steps_saved"] = planned - done
        seg = next((r for r in reversed(timeline) if _ended_by(r, s.run)), None)
        nxt = _next_gpu_segment(timeline, seg) if seg is not None else None
        runs.append(
            {
                "run": s.run,
                "run_id": s.run_id,
                "stop_id": s.stop_id,
                "rule": s.rule,
                "step": done,
                "planned_steps": planned,
                "steps_saved": numbers.get("steps_saved"),
                "step_s": numbers.get("step_s"),
                "saved_s": saved_seconds(numbers),
                "segment": (
                    {"start": seg.start, "end": seg.end, "steps": seg.steps}
                    if seg is not None
                    else None
                ),
                "next": (
                    {"run": nxt.run, "phase": nxt.phase, "start": nxt.start}
                    if nxt is not None
                    else None
                ),
            }
        )
    measured = [r["saved_s"] for r in runs if r["saved_s"] is not None]
    return {"runs": runs, "saved_s": sum(measured) if measured else None}


def render_futility_md(futility: Mapping[str, Any] | None) -> list[str]:
    """The report's one line on the GPU time the early stops saved (nothing without one)."""
    runs = (futility or {}).get("runs") or []
    if not runs:
        return []
    total = futility.get("saved_s") if futility else None
    parts = []
    for r in runs:
        step_s = r.get("step_s")
        per = "no measured step time" if step_s is None else f"{step_s * 1000:.3g} ms measured"
        lane = (
            f", its lane then went to {r['next']['phase']} of '{r['next']['run']}'"
            if r.get("next") and r["next"].get("run")
            else ""
        )
        how = "as not learning " if r.get("rule") == "not_learning" else ""
        parts.append(
            f"'{r['run']}' stopped {how}at step {r['step']} of {r['planned_steps']} "
            f"({r['steps_saved']} steps x {per}{lane})"
        )
    shown = "not measured" if total is None else say_hours(total / 3600.0)
    return [f"GPU time saved by early stops: {shown}: " + "; ".join(parts) + ".", ""]
