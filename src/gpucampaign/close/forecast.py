"""Forecast vs actual: the plan's allotted hours against the observed timeline, and the
measured estimates a later campaign can plan with.

Everything here reads records the campaign already wrote; nothing is re-measured and a step
the timeline does not show is "not observed", never estimated.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from gpucampaign.close.verdict_words import stops_of
from gpucampaign.core.errors import ArgumentError
from gpucampaign.core.files import median, parse_time
from gpucampaign.core.text import say_hours, say_step
from gpucampaign.folder.layout import ESTIMATES_FILE, OutputFolder
from gpucampaign.folder.records import DecisionRecord, PlanRecord, PlanStep, StopRecord, TimelineRow
from gpucampaign.folder.segments import inference_restarted, interruptions
from gpucampaign.plan.ranges import hours_range

_PHASE_KEYS = {"load": "load_s", "eval": "eval_s", "save": "save_s", "restore": "restore_s"}
_MEASURES = ("load_s", "step_s", "eval_s", "save_s", "restore_s")
#: How close a run's re-forecast after the pilot should come to its observed time (issue 48:
#: |observed - re-forecast| / observed); the report says where it did and where not.
REFORECAST_GOAL = 0.15


def _union_seconds(intervals: Sequence[tuple[datetime, datetime]]) -> float:
    """Busy time of possibly overlapping intervals, each second counted once."""
    total = 0.0
    cur_start: datetime | None = None
    cur_end: datetime | None = None
    for s, e in sorted(intervals):
        if cur_end is None or s > cur_end:
            if cur_end is not None and cur_start is not None:
                total += (cur_end - cur_start).total_seconds()
            cur_start, cur_end = s, e
        elif e > cur_end:
            cur_end = e
    if cur_end is not None and cur_start is not None:
        total += (cur_end - cur_start).total_seconds()
    return total


def _row_seconds(rows: Sequence[TimelineRow]) -> float:
    spans = []
    loose = 0.0
    for r in rows:
        if r.interval is not None:
            spans.append(r.interval)
        elif r.seconds is not None:
            loose += float(r.seconds)
    return _union_seconds(spans) + loose


def _numbers(value: Any) -> list[float]:
    """A measurement, or a list of them, as finite floats."""
    values = value if isinstance(value, list | tuple) else [value]
    return [
        float(v)
        for v in values
        if isinstance(v, int | float) and not isinstance(v, bool) and v == v
    ]


def _explain(
    s: PlanStep,
    *,
    refo: float | None,
    reforecast: PlanRecord | None,
    pilot: Mapping[str, Mapping[str, Any]],
    dropped_by: Mapping[str, Any],
    stops: Sequence[StopRecord],
    rows: Sequence[TimelineRow],
    used_step_s: float | None = None,
) -> list[str]:
    """What the records say about a step's deviation: re-forecast, decision, stop, notes.
    ``used_step_s``: the settled step the re-forecast rests on, as the decision kept it (the
    pilots of the same step pooled); older records have only the run's own pilot's."""
    why = []
    if reforecast is not None and refo is not None and abs(refo - s.hours) > 1e-9:
        src = "the pilot's measurements"
        step_s = used_step_s or median(_numbers(pilot.get(s.run or "", {}).get("step_s")))
        if step_s is not None:
            src += f" ({say_step(step_s)}/step)"
        why.append(f"re-forecast from {src}: {say_hours(s.hours)} -> {say_hours(refo)}")
    if s.name in dropped_by:
        d = dropped_by[s.name]
        why.append(f"dropped at the decision point ({d.action}): " + "; ".join(d.reasons))
    if s.run:
        for st in stops_of(s.run, [x.to_dict() for x in stops]):
            why.append(f"stopped by {st.get('rule')} ({st.get('stop_id')}): {st.get('reason')}")
    losses = interruptions(rows)
    if losses["segments"]:
        n = len(losses["segments"])
        moved = f", {losses['relaunches']} on another machine" if losses["relaunches"] else ""
        why.append(
            f"{n} interruption{'s' if n != 1 else ''}{moved}: {losses['lost_steps']} step(s) "
            f"trained again ({say_hours(losses['lost_hours'])}), "
            f"{say_hours(losses['down_hours'])} until training resumed"
        )
    if losses["lot_ends"]:
        why.append(f"stopped {len(losses['lot_ends'])} time(s) before a lot's end, then resumed")
    trained = [r for r in rows if r.phase == "train"]
    if len(trained) > 1:
        how = (
            "interrupted, then inference restarted from the last good model"
            if any(inference_restarted(r) for r in trained)
            else "resumed"
        )
        why.append(f"{how}: {len(trained)} training intervals on the timeline")
    why += sorted({r.note for r in rows if r.note})
    return why


def steps_split(
    kept: Mapping[str, Any], *, metrics: Sequence[Mapping[str, Any]], observed_s: float
) -> dict[str, float] | None:
    """A run's re-forecast and its observed time split in two: its training steps and the
    rest (start-up, the loop's own time, evaluations, saves). The steps: the ``steps`` the
    re-forecast counted at ``parts_s["steps"]`` (as the decision kept them), against the
    ``step_s`` of the run's last that many ``train`` rows (a step trained again after a
    resume counted once, at its last time). None when the decision kept no parts (older
    records, a pilot that measured only the step) or the run trained fewer steps (a stop)."""
    parts, steps = kept.get("parts_s") or {}, int(kept.get("steps") or 0)
    if "steps" not in parts or steps <= 0:
        return None
    times = {
        int(r["step"]): float(r["step_s"])
        for r in metrics
        if r.get("kind", "train") == "train" and _numbers(r.get("step_s")) and "step" in r
    }
    last = max(times, default=0)
    called = [times[k] for k in range(last - steps + 1, last + 1) if k in times]
    if len(called) < steps:
        return None
    forecast_s = float(sum(parts.values()))
    return {
        "reforecast_steps_s": float(parts["steps"]),
        "observed_steps_s": float(sum(called)),
        "reforecast_rest_s": forecast_s - float(parts["steps"]),
        "observed_rest_s": observed_s - float(sum(called)),
        "pilot_step_s": float(kept.get("step_s") or 0.0),
        "observed_step_s": float(median(called) or 0.0),
    }


def _said_split(x: Mapping[str, float]) -> str:
    """Where a miss is, in words: the steps or the rest (``steps_split``)."""

    def said(seconds: float) -> str:
        return say_hours(seconds / 3600.0)

    ratio = x["observed_step_s"] / x["pilot_step_s"] if x["pilot_step_s"] else None
    pace = f", {ratio:.2f}x" if ratio else ""
    return (
        f"its steps took {said(x['observed_steps_s'])} against {said(x['reforecast_steps_s'])} "
        f"re-forecast (their median {say_step(x['observed_step_s'])}, the pilot's "
        f"{say_step(x['pilot_step_s'])}{pace}), the rest {said(x['observed_rest_s'])} "
        f"against {said(x['reforecast_rest_s'])}"
    )


def _step_row(
    s: PlanStep,
    *,
    reforecast: PlanRecord | None,
    rows: Sequence[TimelineRow],
    ranges: Mapping[str, Mapping[str, Any]],
    metrics: Mapping[str, Sequence[Mapping[str, Any]]],
    **context: Any,
) -> dict[str, Any]:
    """One step of forecast vs actual: allotted, re-forecast (each with its p10-p90 range),
    observed, deviation, whether the observed time fell in the range, why (a run's miss over
    ``REFORECAST_GOAL`` split into its steps and the rest: ``steps_split``)."""
    observed = _row_seconds(rows) / 3600.0 if rows else None
    re_step = reforecast.step(s.name) if reforecast is not None else None
    refo = None if re_step is None else re_step.hours
    base = refo if refo is not None else s.hours
    kept = ranges.get(s.name) or {}
    lo, hi = (
        (kept["p10_hours"], kept["p90_hours"])
        if refo is not None and "p10_hours" in kept
        else hours_range(base)
    )
    deviation = None if observed is None else observed - base
    why = _explain(
        s, refo=refo, reforecast=reforecast, rows=rows, used_step_s=kept.get("step_s"), **context
    )
    split = None
    if refo is not None and observed and s.run:  # how far the re-forecast of a run came true
        off = abs(observed - refo) / observed
        split = steps_split(kept, metrics=metrics.get(s.run) or [], observed_s=3600 * observed)
        said = (
            f"within {off:.0%} of the observed time"
            if off <= REFORECAST_GOAL
            else f"{off:.0%} off the observed time (over {REFORECAST_GOAL:.0%})"
            + (f": {_said_split(split)}" if split else "")
        )
        at = 1 if why and why[0].startswith("re-forecast from") else 0
        why.insert(at, f"the re-forecast {said}")
    if observed is None and s.name not in context["dropped_by"]:
        why.append("not observed: the timeline records no interval for this step")
    elif not why and deviation is not None and base:
        if abs(deviation) <= 0.05 * base:
            why.append("within 5% of the forecast")
        else:
            word = "shorter" if deviation < 0 else "longer"
            why.append(
                f"{word} than forecast: not explained (no re-forecast, resume, drop, stop or "
                "note is recorded for it)"
            )
    return {
        "step": s.name,
        "kind": s.kind,
        "run": s.run,
        "phase": s.phase,
        "allotted_hours": s.hours,
        "allotted_range_hours": list(hours_range(s.hours)),
        "reforecast_hours": refo,
        "range_hours": [lo, hi],
        "in_range": None if observed is None else lo <= observed <= hi,
        "observed_hours": observed,
        "deviation_hours": deviation,
        "steps_split": split,
        "explanation": "; ".join(why) if why else "no forecast to compare with",
    }


def forecast_vs_actual(
    plan: PlanRecord,
    *,
    reforecast: PlanRecord | None,
    timeline: Iterable[TimelineRow],
    decisions: Iterable[DecisionRecord] = (),
    stops: Iterable[StopRecord] = (),
    pilot: Mapping[str, Mapping[str, Any]] | None = None,
    metrics: Mapping[str, Iterable[Mapping[str, Any]]] | None = None,
) -> dict[str, Any]:
    """Compare, per calendar step, the allotted time, the re-forecast and the observed time.

    The plan is read, never rewritten. Observed hours come only from ``timeline.jsonl`` rows
    naming the step (overlapping rows counted once); a step with no row is "not observed",
    never estimated. Each deviation is explained by what the records say: the pilot's
    re-forecast, a decision (dropped step or run), a stop, or the timeline's notes.

    Args:
        plan: the untouched ``plan.json``.
        reforecast: the plan re-forecast after the pilot, None when there was none.
        timeline: ``timeline.jsonl`` rows.
        decisions: ``decisions.jsonl`` records.
        stops: ``stops.jsonl`` records.
        pilot: pilot measurements per run name (``load_s``, ``step_s``...), when recorded.
        metrics: ``metrics.jsonl`` rows per run, for the measured estimates and each run's
            steps (``steps_split``).

    Returns:
        ``{steps: [...], decisions: [...], stops: [...], estimates: {...}, totals: {...},
        interruptions: {...}}`` (``segments.interruptions``).
    """
    timeline, decisions, stops = list(timeline), list(decisions), list(stops)
    rows_of = {run: list(rows) for run, rows in (metrics or {}).items()}
    dropped_by = {name: rec.decision for rec in decisions for name in rec.decision.dropped_steps}
    ranges = {k: v for rec in decisions for k, v in rec.reforecast.items() if isinstance(v, dict)}
    rows_by_step: dict[str, list[TimelineRow]] = {}
    for r in timeline:
        rows_by_step.setdefault(str(r.step or f"({r.phase})"), []).append(r)
    steps_out = [
        _step_row(
            s,
            reforecast=reforecast,
            rows=rows_by_step.get(s.name, []),
            pilot=pilot or {},
            dropped_by=dropped_by,
            ranges=ranges,
            metrics=rows_of,
            stops=stops,
        )
        for s in plan.steps
    ]
    return {
        "steps": steps_out,
        "unplanned_timeline_steps": sorted(set(rows_by_step) - {s.name for s in plan.steps}),
        "decisions": [d.to_dict() for d in decisions],
        "stops": [s.to_dict() for s in stops],
        "totals": {
            "allotted_span_hours": plan.span_hours,
            "reforecast_span_hours": None if reforecast is None else reforecast.span_hours,
            "observed_wall_hours": _row_seconds(timeline) / 3600.0 if timeline else None,
            "window_hours": plan.window_hours,
        },
        "estimates": measured_estimates(timeline, pilot=pilot, metrics=rows_of),
        "interruptions": _with_share(interruptions(timeline), window_hours=plan.window_hours),
    }


def _with_share(losses: dict[str, Any], *, window_hours: float | None) -> dict[str, Any]:
    """``losses`` with what they cost as a share of the lot's window (work trained again plus
    the time until training resumed), in hours of the window: no price is assumed."""
    cost = losses["lost_hours"] + losses["down_hours"]
    share = cost / window_hours if window_hours else None
    return {**losses, "cost_hours": cost, "share_of_window": share, "window_hours": window_hours}


def actual_intervals(
    timeline: Iterable[TimelineRow], *, origin: str | datetime | None = None
) -> list[dict[str, Any]]:
    """Timeline rows as ``{name, start_hours, end_hours}`` from ``origin`` (for the Gantt chart).

    Args:
        timeline: ``timeline.jsonl`` rows; open intervals are left out.
        origin: the campaign's start; the earliest recorded start by default.
    """
    rows = [(r, r.interval) for r in timeline if r.interval is not None]
    if not rows:
        return []
    if isinstance(origin, str):
        t0 = parse_time(origin)
    else:
        t0 = origin if origin is not None else min(iv[0] for _, iv in rows)
    return [
        {
            # Time no calendar step stands for (a seed run without its own step) is named by
            # its run, so a reader sees whose time it was, not just the phase ("train").
            "name": str(r.step or " ".join(filter(None, (r.phase, r.run))) or "unplanned"),
            "start_hours": (iv[0] - t0).total_seconds() / 3600.0,
            "end_hours": (iv[1] - t0).total_seconds() / 3600.0,
        }
        for r, iv in rows
    ]


def aligned_intervals(plan: PlanRecord, timeline: Sequence[TimelineRow]) -> list[dict[str, Any]]:
    """Observed intervals on the plan's clock: the first observed step starts where it was
    planned."""
    rows = [r for r in timeline if r.interval is not None]
    if not rows:
        return []
    first = min(rows, key=lambda r: r.interval[0])  # type: ignore[index]
    planned = plan.step(first.step or "")
    offset = float((planned.start_hours if planned else None) or 0.0)
    return [
        {**iv, "start_hours": iv["start_hours"] + offset, "end_hours": iv["end_hours"] + offset}
        for iv in actual_intervals(rows)
    ]


def measured_estimates(
    timeline: Iterable[TimelineRow],
    *,
    pilot: Mapping[str, Mapping[str, Any]] | None = None,
    metrics: Mapping[str, Iterable[Mapping[str, Any]]] | None = None,
) -> dict[str, Any]:
    """Measured load/step/eval/save/restore seconds (medians), for the next campaign's plan.

    Sources, all records of this campaign: timeline rows whose ``phase`` is load, eval, save
    or restore (their ``seconds``), or train with ``steps`` (seconds per step); the pilot's
    measurements per run (numbers or lists of numbers); and ``metrics.jsonl`` rows
    (``step_s`` of train rows, ``eval_s``, ``save_s``, ``restore_s``). Nothing absent from
    the records is filled in: such a measure is None and listed in ``not_observed``.
    """
    samples: dict[str, list[float]] = {k: [] for k in _MEASURES}
    for r in timeline:
        if r.seconds is None:
            continue
        if r.phase in _PHASE_KEYS:
            samples[_PHASE_KEYS[r.phase]].append(float(r.seconds))
        elif r.phase in ("train", "step") and r.steps:
            samples["step_s"].append(float(r.seconds) / float(r.steps))
    for m in (pilot or {}).values():
        for k in _MEASURES:
            samples[k] += _numbers(m.get(k))
    for rows in (metrics or {}).values():
        for row in rows:
            for k in _MEASURES:
                if k in row and (k != "step_s" or row.get("kind", "train") == "train"):
                    samples[k] += _numbers(row[k])
    measured = {k: median(v) for k, v in samples.items()}
    return {
        "measured": measured,
        "samples": {k: len(v) for k, v in samples.items()},
        "pilot": {k: dict(v) for k, v in (pilot or {}).items()},
        "not_observed": sorted(k for k, v in measured.items() if v is None),
    }


def load_estimates(out: str | Path) -> dict[str, Any]:
    """Read the measured estimates an earlier campaign left in its output folder.

    Returns:
        ``{campaign_id, measured: {load_s, step_s, eval_s, save_s, restore_s}, pilot: {...}}``;
        a measure the earlier campaign did not observe is None.

    Raises:
        SpecError: the folder has no readable ``estimates.json``.
    """
    path = OutputFolder(out).path(ESTIMATES_FILE)  # a link out of the folder is refused
    if not path.is_file():
        raise ArgumentError(
            f"'{out}' has no {ESTIMATES_FILE}: give the output folder of a closed campaign",
            field="calibrate_from",
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # ValueError: JSONDecodeError, UnicodeDecodeError
        raise ArgumentError(
            f"'{path}' is not readable JSON ({exc})", field="calibrate_from"
        ) from None
    measured = data.get("measured") if isinstance(data, dict) else None
    if not isinstance(measured, dict):
        raise ArgumentError(f"'{path}' has no 'measured' mapping", field="calibrate_from")
    for k, v in measured.items():
        if v is not None and (not isinstance(v, int | float) or v < 0):
            raise ArgumentError(
                f"'{path}': measured.{k} must be a non-negative number or null",
                field="calibrate_from",
            )
    return data
