"""Closing the campaign: the verdict (R1), the budget close (R13, R14), forecast vs actual (R16).

Everything here is a pure function of records the campaign already wrote (``plan.json``,
``timeline.jsonl``, ``decisions.jsonl``, ``stops.jsonl``, metrics) and of the spec: nothing is
re-measured and nothing is invented. Money is computed in ``Decimal`` and rounded to cents
only at the end; no hourly rate is ever derived from a lot's price (R8).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any, Literal

from gpucampaign.files import median
from gpucampaign.spec import DecisionRule, Package, SpecError

VerdictKind = Literal["adopt", "keep_control", "negative", "stopped", "re-pose"]
CENT = Decimal("0.01")
ESTIMATES_FILE = "estimates.json"
# A gain computed as a float difference of two k/n accuracies can land 1e-17 under min_gain.
_GAIN_DIGITS = 12


# --- verdict (R1) ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Verdict:
    """The decision the campaign reached, with the numbers it rests on.

    ``kind``: ``adopt`` (``run`` is the variant to adopt), ``keep_control`` (the control meets
    the threshold and no variant beats it by the minimum gain), ``negative`` (no variant meets
    the threshold: a complete result) or ``stopped`` (the control has no metric, so nothing
    can be compared), or ``re-pose`` (the decision point after the pilot re-posed the question).
    """

    kind: VerdictKind
    run: str | None
    text: str
    numbers: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (kept in manifest.json and report.json)."""
        return asdict(self)


def _fmt(x: float | None) -> str:
    return "stopped (no metric)" if x is None else f"{x:.4f}"


def _stops_of(run: str, stops: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Stop records of a run, matched by name or by run ID ``<name>-<10 hex>``."""
    out = []
    for s in stops:
        rid = str(s.get("run_id") or "")
        if s.get("run") == run or (rid and rid.rsplit("-", 1)[0] == run):
            out.append(s)
    return out


def _stop_text(run: str, stops: Iterable[Mapping[str, Any]]) -> str:
    found = _stops_of(run, stops)
    if not found:
        return f"'{run}' has no metric (no stop recorded)"
    return "; ".join(
        f"'{run}' stopped by {s.get('rule', 'stop')} ({s.get('stop_id', '?')}): {s.get('reason', '')}"
        for s in found
    )


def decide_verdict(
    rule: DecisionRule,
    *,
    control_metric: float | None,
    variant_metrics: Mapping[str, float | None],
    stops: Iterable[Mapping[str, Any]] = (),
    repose_reason: str | None = None,
) -> Verdict:
    """Apply the spec's decision rule to the measured metrics.

    A variant is adopted when it meets the threshold AND is better than the control by at
    least ``min_gain`` (strictly better when ``min_gain`` is 0); among several, the best one.
    Otherwise the control is kept if it meets the threshold, or the result is negative: "no
    variant meets the threshold", a complete result. The text states every number.

    Args:
        rule: the spec's decision rule.
        control_metric: the control's metric on ``rule.split``, None when it stopped.
        variant_metrics: metric per variant name, None for a stopped or dropped variant.
        stops: stop records (``stops.jsonl`` lines) to explain missing metrics.
        repose_reason: the reasons, when the decision point re-posed the question (no run was
            trained after the pilot): the verdict is then ``re-pose``.

    Returns:
        The verdict; ``numbers`` holds the rule, each value and each gain over the control.
    """
    stops = list(stops)
    sign = 1.0 if rule.direction == "maximize" else -1.0
    gains = {
        name: (None if v is None or control_metric is None else round(sign * (v - control_metric), _GAIN_DIGITS))
        for name, v in variant_metrics.items()
    }
    numbers: dict[str, Any] = {
        "metric": rule.metric,
        "direction": rule.direction,
        "split": rule.split,
        "threshold": rule.threshold,
        "min_gain": rule.min_gain,
        "control": control_metric,
        "variants": dict(variant_metrics),
        "gains_over_control": gains,
        "meets_threshold": {
            "control": None if control_metric is None else rule.meets(control_metric),
            **{n: (None if v is None else rule.meets(v)) for n, v in variant_metrics.items()},
        },
    }
    head = f"{rule.metric} on {rule.split} ({rule.direction}, threshold {rule.threshold:g}, min gain {rule.min_gain:g})"
    listing = "; ".join(
        [f"control {_fmt(control_metric)}"] + [f"{n} {_fmt(v)}" for n, v in variant_metrics.items()]
    )
    stopped = [n for n, v in variant_metrics.items() if v is None]
    stop_note = ("; " + "; ".join(_stop_text(n, stops) for n in stopped)) if stopped else ""

    if repose_reason is not None:
        return Verdict(
            kind="re-pose",
            run=None,
            text=(
                f"Re-pose the question: the decision point after the pilot stopped the campaign "
                f"({repose_reason}). No variant was compared. {head}: {listing}{stop_note}."
            ),
            numbers=numbers,
        )
    if control_metric is None:
        return Verdict(
            kind="stopped",
            run=None,
            text=(
                f"No decision: the control, the essential reference, has no metric "
                f"({_stop_text('control', stops)}); nothing can be compared. {head}: {listing}{stop_note}."
            ),
            numbers=numbers,
        )

    def adoptable(name: str) -> bool:
        v, g = variant_metrics[name], gains[name]
        return v is not None and g is not None and rule.meets(v) and g >= rule.min_gain and g > 0

    candidates = [n for n in variant_metrics if adoptable(n)]
    if candidates:
        best = candidates[0]
        for n in candidates[1:]:
            if rule.better(variant_metrics[n], variant_metrics[best]):  # type: ignore[arg-type]
                best = n
        v = variant_metrics[best]
        assert v is not None
        return Verdict(
            kind="adopt",
            run=best,
            text=(
                f"Adopt '{best}': {rule.metric} {v:.4f} vs control {control_metric:.4f} on {rule.split} "
                f"(gain {gains[best]:+.4f} >= min gain {rule.min_gain:g}; threshold {rule.threshold:g} met). "
                f"{head}: {listing}{stop_note}."
            ),
            numbers=numbers,
        )

    meeting = [n for n, v in variant_metrics.items() if v is not None and rule.meets(v)]
    why = (
        f"variant(s) {', '.join(repr(n) for n in meeting)} meet the threshold but do not beat the "
        f"control by the min gain {rule.min_gain:g}"
        if meeting
        else "no variant meets the threshold"
    )
    if rule.meets(control_metric):
        return Verdict(
            kind="keep_control",
            run="control",
            text=f"Keep the control: {why}; the control meets it ({control_metric:.4f}). {head}: {listing}{stop_note}.",
            numbers=numbers,
        )
    return Verdict(
        kind="negative",
        run=None,
        text=(
            f"Negative result (complete): {why}, and neither does the control. {head}: {listing}{stop_note}. "
            "This answers the question: a longer campaign on these variants is not justified."
        ),
        numbers=numbers,
    )


# --- budget close (R13, R14) ----------------------------------------------------------------
def _usd(x: Any) -> Decimal:
    """A money amount as Decimal; floats go through repr so 47.14 stays 47.14."""
    if isinstance(x, Decimal):
        return x
    if isinstance(x, float):
        return Decimal(repr(x))
    return Decimal(str(x))


def _cents(x: Decimal) -> float:
    """Rounded to cents, as a float whose repr is the cent value (JSON-ready)."""
    return float(x.quantize(CENT, rounding=ROUND_HALF_UP))


def _as_dict(obj: Any) -> dict[str, Any]:
    if isinstance(obj, Mapping):
        return dict(obj)
    if hasattr(obj, "model_dump"):
        return obj.model_dump()
    raise TypeError(f"expected a mapping or a pydantic model, got {type(obj).__name__}")


def resolve_packages(packages: Iterable[Any], *, catalog: Any = None) -> list[dict[str, Any]]:
    """Packages with their price per lot: the spec's ``price_usd``, else the provider catalog.

    Args:
        packages: spec ``Package`` objects (priced through ``gpucampaign.tariffs``) or
            already resolved dicts ``{gpu, days, count, price_usd, gpus?}``.
        catalog: the ``tariffs.Catalog`` to price spec packages with (built-in by default).

    Returns:
        One dict per package ``{gpu, days, gpus, count, price_usd}`` (price as Decimal).

    Raises:
        SpecError: a package has no price anywhere.
    """
    from gpucampaign import tariffs

    out = []
    for i, p in enumerate(packages):
        if isinstance(p, Package):
            r = tariffs.resolve_package(p, catalog or tariffs.BUILTIN_CATALOG, index=i)
            out.append({"gpu": r.gpu, "days": r.days, "gpus": r.gpus_per_lot, "count": r.count, "price_usd": r.price_usd})
            continue
        d = _as_dict(p)
        if d.get("price_usd") is None:
            raise SpecError(
                f"field 'packages[{i}].price_usd': package {d.get('gpu')} {d.get('days')} days has no "
                "price; give the price of one lot for its whole duration",
                field=f"packages[{i}].price_usd",
            )
        out.append(
            {
                "gpu": d["gpu"],
                "days": int(d["days"]),
                "gpus": d.get("gpus"),
                "count": int(d.get("count", 1)),
                "price_usd": _usd(d["price_usd"]),
            }
        )
    return out


def close_budget(
    packages: Iterable[Any],
    *,
    catalog: Any = None,
    expenses: Iterable[Any] = (),
    deliveries: Iterable[Mapping[str, Any]] = (),
    unit: str | None,
    result_text: str | None = None,
) -> dict[str, Any]:
    """The budget close: rental, other expenses apart, spent, and rental per accepted delivery.

    Replays of a delivery (same ``content_sha256``) count once: accepted when any copy was.
    With zero accepted deliveries the ratio is undefined (None) and the reason names each
    rejection; the money spent is always shown. With no delivery unit (a research decision),
    no per-unit figure is made: ``result`` describes what was obtained instead.

    Args:
        packages: committed lots: spec ``Package`` objects or resolved dicts (see
            ``resolve_packages``).
        catalog: the ``tariffs.Catalog`` for spec packages without ``price_usd``.
        expenses: other expenses really incurred (``{name, usd, note}``), never invented.
        deliveries: ``{id, content_sha256, accepted, reason}`` per delivery candidate.
        unit: the delivery unit (e.g. "corpus"), None for a research decision.
        result_text: what the campaign obtained (the verdict text), used when ``unit`` is None.

    Returns:
        A JSON-ready dict; money values are floats rounded to cents.
    """
    lines = []
    rental = Decimal(0)
    for p in resolve_packages(packages, catalog=catalog):
        price = p["price_usd"]
        total = price * p["count"]
        rental += total
        lines.append({**p, "price_usd": _cents(price), "total_usd": _cents(total)})
    exp_lines = []
    other = Decimal(0)
    for e in expenses:
        d = _as_dict(e)
        amount = _usd(d["usd"])
        other += amount
        exp_lines.append({"name": d["name"], "usd": _cents(amount), "note": d.get("note", "")})
    spent = rental + other

    by_hash: dict[str, dict[str, Any]] = {}
    replays = []
    for d in deliveries:
        h = str(d["content_sha256"])
        if h in by_hash:
            first = by_hash[h]
            replays.append({"id": d["id"], "replay_of": first["id"], "content_sha256": h})
            if d.get("accepted") and not first["accepted"]:
                by_hash[h] = {**dict(d), "accepted": True}
            continue
        by_hash[h] = {**dict(d), "accepted": bool(d.get("accepted"))}
    accepted = [d for d in by_hash.values() if d["accepted"]]
    rejected = [
        {"id": d["id"], "content_sha256": d["content_sha256"], "reason": d.get("reason") or "no reason recorded"}
        for d in by_hash.values()
        if not d["accepted"]
    ]

    per: Decimal | None = None
    reason: str | None = None
    if unit is None:
        reason = (
            "research decision: the spec names no delivery unit, so no per-unit rental is made up; "
            "the result obtained: " + (result_text or "see the verdict")
        )
    elif not accepted:
        why = "; ".join(f"{r['id']}: {r['reason']}" for r in rejected) or "no delivery was produced"
        reason = f"zero accepted {unit} deliveries ({why}); {_cents(spent):.2f} USD spent all the same"
    else:
        per = (rental / len(accepted)).quantize(CENT, rounding=ROUND_HALF_UP)

    return {
        "packages": lines,
        "expenses": exp_lines,
        "rental_usd": _cents(rental),
        "other_expenses_usd": _cents(other),
        "spent_usd": _cents(spent),
        "unit": unit,
        "accepted_deliveries": len(accepted),
        "accepted": [{"id": d["id"], "content_sha256": d["content_sha256"]} for d in accepted],
        "rejected": rejected,
        "replays": replays,
        "rental_per_accepted_usd": None if per is None else float(per),
        "undefined_reason": reason,
        "result": result_text if unit is None else None,
    }


def render_budget_md(budget: Mapping[str, Any]) -> str:
    """The budget close as a short markdown section."""
    out = ["| Committed lot | Count | Price per lot (USD) | Total (USD) |", "|---|---:|---:|---:|"]
    for p in budget["packages"]:
        gpus = f", {p['gpus']} GPU(s) per lot" if p.get("gpus") else ""
        out.append(f"| {p['gpu']} {p['days']} days{gpus} | {p['count']} | {p['price_usd']:.2f} | {p['total_usd']:.2f} |")
    out.append(f"| **Rental** | | | **{budget['rental_usd']:.2f}** |")
    out.append("")
    if budget["expenses"]:
        out += ["Other expenses really incurred (kept apart from the rental):", ""]
        out += [f"- {e['name']}: {e['usd']:.2f} USD" + (f" ({e['note']})" if e["note"] else "") for e in budget["expenses"]]
    else:
        out.append("Other expenses really incurred: none recorded (no tax or transfer cost is assumed).")
    out += ["", f"**Spent: {budget['spent_usd']:.2f} USD** (rental {budget['rental_usd']:.2f} + other "
            f"{budget['other_expenses_usd']:.2f}).", ""]
    unit = budget["unit"]
    if budget["rental_per_accepted_usd"] is not None:
        out.append(
            f"Accepted deliveries ({unit}): {budget['accepted_deliveries']}; rental per accepted {unit}: "
            f"**{budget['rental_per_accepted_usd']:.2f} USD**."
        )
    elif unit is None:
        out.append(
            "No delivery unit (a research decision): no rental per unit is made up. "
            f"Result obtained for {budget['spent_usd']:.2f} USD: {budget.get('result') or 'see the verdict'}"
        )
    else:
        out.append(f"Accepted deliveries ({unit}): {budget['accepted_deliveries']}.")
        out.append(f"Rental per accepted {unit}: undefined — {budget['undefined_reason']}")
    if budget["rejected"]:
        out += ["", "Rejected deliveries:"] + [f"- {r['id']}: {r['reason']}" for r in budget["rejected"]]
    if budget["replays"]:
        out += ["", f"Replays of an earlier delivery (same content, counted once): {len(budget['replays'])}."]
    return "\n".join(out) + "\n"


# --- forecast vs actual (R16) ---------------------------------------------------------------
def _parse_time(s: str) -> datetime:
    return datetime.fromisoformat(str(s).replace("Z", "+00:00"))


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


def _row_seconds(rows: Sequence[Mapping[str, Any]]) -> float:
    spans = []
    loose = 0.0
    for r in rows:
        if r.get("start") and r.get("end"):
            spans.append((_parse_time(r["start"]), _parse_time(r["end"])))
        elif r.get("seconds") is not None:
            loose += float(r["seconds"])
    return _union_seconds(spans) + loose


def _plan_steps(plan: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Calendar steps of a plan dict as ``{name, hours, kind, run, phase, tier}``."""
    steps = plan.get("steps")
    if steps is None and isinstance(plan.get("plan"), Mapping):
        steps = plan["plan"].get("steps")
    if steps is None:
        raise SpecError("plan.json has no 'steps': it is not a plan written by `campaign plan`", field="plan")
    out = []
    for s in steps:
        hours = s.get("hours", s.get("allotted_hours"))
        if hours is None and s.get("start") is not None and s.get("end") is not None:
            hours = float(s["end"]) - float(s["start"])
        out.append(
            {
                "name": s["name"],
                "hours": None if hours is None else float(hours),
                "kind": s.get("kind"),
                "run": s.get("run"),
                "phase": s.get("phase"),
                "tier": s.get("tier"),
            }
        )
    return out


def forecast_vs_actual(
    plan: Mapping[str, Any],
    *,
    reforecast: Mapping[str, Any] | None,
    timeline: Iterable[Mapping[str, Any]],
    decisions: Iterable[Mapping[str, Any]] = (),
    stops: Iterable[Mapping[str, Any]] = (),
    pilot: Mapping[str, Mapping[str, Any]] | None = None,
    metrics: Mapping[str, Iterable[Mapping[str, Any]]] | None = None,
) -> dict[str, Any]:
    """Compare, per calendar step, the allotted time, the re-forecast and the observed time.

    The plan is read, never rewritten. Observed hours come only from ``timeline.jsonl`` rows
    naming the step (overlapping rows counted once); a step with no row is "not observed",
    never estimated. Each deviation is explained by what the records say: the pilot's
    re-forecast, a decision (dropped step or run), a stop, or the timeline's notes.

    Args:
        plan: the untouched ``plan.json`` content (``steps`` with ``name`` and ``hours``).
        reforecast: the plan re-forecast after the pilot (same shape), None when there was none.
        timeline: ``timeline.jsonl`` rows ``{step, run, phase, start, end, seconds, note}``.
        decisions: ``decisions.jsonl`` rows.
        stops: ``stops.jsonl`` rows.
        pilot: pilot measurements per run name (``load_s``, ``step_s``...), when recorded.
        metrics: ``metrics.jsonl`` rows per run, for the measured estimates.

    Returns:
        ``{steps: [...], decisions: [...], stops: [...], estimates: {...}, totals: {...}}``.
    """
    timeline = list(timeline)
    decisions = list(decisions)
    stops = list(stops)
    re_hours: dict[str, float | None] = {}
    if reforecast is not None:
        re_hours = {s["name"]: s["hours"] for s in _plan_steps(reforecast)}
    dropped_by: dict[str, Mapping[str, Any]] = {}
    for rec in decisions:
        d = _decision_of(rec)
        for name in d.get("dropped_steps", []) or []:
            dropped_by[name] = d

    rows_by_step: dict[str, list[Mapping[str, Any]]] = {}
    for r in timeline:
        rows_by_step.setdefault(str(r.get("step") or f"({r.get('phase')})"), []).append(r)

    steps_out = []
    for s in _plan_steps(plan):
        rows = rows_by_step.get(s["name"], [])
        observed = _row_seconds(rows) / 3600.0 if rows else None
        refo = re_hours.get(s["name"]) if reforecast is not None else None
        base = refo if refo is not None else s["hours"]
        deviation = None if observed is None or base is None else observed - base
        why = []
        if reforecast is not None and refo is not None and s["hours"] is not None and abs(refo - s["hours"]) > 1e-9:
            src = "the pilot's measurements"
            step_s = _numbers((pilot or {}).get(s["run"] or "", {}).get("step_s"))
            if step_s:
                src += f" ({median(step_s) * 1000:.2f} ms/step)"
            why.append(f"re-forecast from {src}: {s['hours']:.3f} h -> {refo:.3f} h")
        if s["name"] in dropped_by:
            d = dropped_by[s["name"]]
            why.append(f"dropped at the decision point ({d.get('action')}): " + "; ".join(d.get("reasons", [])))
        if s["run"]:
            for st in _stops_of(s["run"], stops):
                why.append(f"stopped by {st.get('rule')} ({st.get('stop_id')}): {st.get('reason')}")
        notes = sorted({str(r["note"]) for r in rows if r.get("note")})
        why += notes
        if observed is None and s["name"] not in dropped_by:
            why.append("not observed: the timeline records no interval for this step")
        elif not why and deviation is not None and base:
            if abs(deviation) <= 0.05 * base:
                why.append("within 5% of the forecast")
            else:
                word = "shorter" if deviation < 0 else "longer"
                why.append(f"{word} than forecast; no decision, stop or note recorded explains it")
        steps_out.append(
            {
                "step": s["name"],
                "kind": s["kind"],
                "run": s["run"],
                "phase": s["phase"],
                "allotted_hours": s["hours"],
                "reforecast_hours": refo,
                "observed_hours": observed,
                "deviation_hours": deviation,
                "explanation": "; ".join(why) if why else "no forecast to compare with",
            }
        )
    unplanned = sorted(set(rows_by_step) - {s["step"] for s in steps_out})
    observed_total = _row_seconds(timeline) / 3600.0 if timeline else None
    return {
        "steps": steps_out,
        "unplanned_timeline_steps": unplanned,
        "decisions": decisions,
        "stops": stops,
        "totals": {
            "allotted_span_hours": plan.get("span_hours"),
            "reforecast_span_hours": None if reforecast is None else reforecast.get("span_hours"),
            "observed_wall_hours": observed_total,
            "window_hours": plan.get("window_hours"),
        },
        "estimates": measured_estimates(timeline, pilot=pilot, metrics=metrics),
    }


def _decision_of(record: Mapping[str, Any]) -> Mapping[str, Any]:
    """The decision inside a ``decisions.jsonl`` row (nested under ``decision`` or flat)."""
    inner = record.get("decision")
    return inner if isinstance(inner, Mapping) else record


def actual_intervals(
    timeline: Iterable[Mapping[str, Any]], *, origin: str | datetime | None = None
) -> list[dict[str, Any]]:
    """Timeline rows as ``{name, start_hours, end_hours}`` from ``origin`` (for the Gantt chart).

    Args:
        timeline: ``timeline.jsonl`` rows with ``step``, ``start`` and ``end``.
        origin: the campaign's start; the earliest recorded start by default.
    """
    rows = [r for r in timeline if r.get("start") and r.get("end")]
    if not rows:
        return []
    t0 = (
        _parse_time(origin) if isinstance(origin, str)
        else origin if origin is not None
        else min(_parse_time(r["start"]) for r in rows)
    )
    return [
        {
            "name": str(r.get("step") or r.get("phase") or "unplanned"),
            "start_hours": (_parse_time(r["start"]) - t0).total_seconds() / 3600.0,
            "end_hours": (_parse_time(r["end"]) - t0).total_seconds() / 3600.0,
        }
        for r in rows
    ]


_PHASE_KEYS = {"load": "load_s", "eval": "eval_s", "save": "save_s", "restore": "restore_s"}
_MEASURES = ("load_s", "step_s", "eval_s", "save_s", "restore_s")


def _numbers(value: Any) -> list[float]:
    """A measurement, or a list of them, as finite floats."""
    values = value if isinstance(value, list | tuple) else [value]
    return [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool) and v == v]


def measured_estimates(
    timeline: Iterable[Mapping[str, Any]],
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
        phase = str(r.get("phase") or "")
        if r.get("seconds") is None:
            continue
        sec = float(r["seconds"])
        if phase in _PHASE_KEYS:
            samples[_PHASE_KEYS[phase]].append(sec)
        elif phase in ("train", "step") and r.get("steps"):
            samples["step_s"].append(sec / float(r["steps"]))
    for m in (pilot or {}).values():
        for k in _MEASURES:
            samples[k] += _numbers(m.get(k))
    for rows in (metrics or {}).values():
        for r in rows:
            for k in _MEASURES:
                if k in r and (k != "step_s" or r.get("kind", "train") == "train"):
                    samples[k] += _numbers(r[k])
    measured = {k: median(v) for k, v in samples.items()}
    return {
        "measured": measured,
        "samples": {k: len(v) for k, v in samples.items()},
        "pilot": {k: dict(v) for k, v in (pilot or {}).items()},
        "not_observed": sorted(k for k, v in measured.items() if v is None),
    }


def load_estimates(out_dir: str | Path) -> dict[str, Any]:
    """Read the measured estimates an earlier campaign left in its output folder.

    Returns:
        ``{campaign_id, measured: {load_s, step_s, eval_s, save_s, restore_s}, pilot: {...}}``;
        a measure the earlier campaign did not observe is None.

    Raises:
        SpecError: the folder has no readable ``estimates.json``.
    """
    path = Path(out_dir) / ESTIMATES_FILE
    if not path.is_file():
        raise SpecError(
            f"'{out_dir}' has no {ESTIMATES_FILE}: give the output folder of a closed campaign",
            field="calibrate_from",
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # ValueError: JSONDecodeError, UnicodeDecodeError
        raise SpecError(f"'{path}' is not readable JSON ({exc})", field="calibrate_from") from None
    measured = data.get("measured") if isinstance(data, dict) else None
    if not isinstance(measured, dict):
        raise SpecError(f"'{path}' has no 'measured' mapping", field="calibrate_from")
    for k, v in measured.items():
        if v is not None and (not isinstance(v, int | float) or v < 0):
            raise SpecError(f"'{path}': measured.{k} must be a non-negative number or null", field="calibrate_from")
    return data


# --- the closing report ---------------------------------------------------------------------
REPORT_JSON, REPORT_MD, REPORT_HTML = "report.json", "report.md", "report.html"
REPORT_FORMAT = "gpucampaign.report/1"
SUMMARY_KEYS = (
    "verdict",
    "rental_usd",
    "other_expenses_usd",
    "spent_usd",
    "accepted_deliveries",
    "rental_per_accepted_usd",
    "undefined_reason",
)


def build_report(
    *,
    campaign_id: str,
    name: str,
    question: str,
    verdict: Verdict | Mapping[str, Any],
    budget: Mapping[str, Any],
    forecast: Mapping[str, Any],
    runs: Sequence[Mapping[str, Any]],
    stops: Sequence[Mapping[str, Any]] = (),
    decisions: Sequence[Mapping[str, Any]] = (),
    figures: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The closing report as data (``report.json``); ``render_report_md`` turns it into text.

    Args:
        campaign_id: the campaign's ID.
        name: the campaign's name.
        question: the decision the campaign had to reach.
        verdict: ``decide_verdict``'s result.
        budget: ``close_budget``'s result.
        forecast: ``forecast_vs_actual``'s result.
        runs: one entry per run of the spec: ``{run_id, run, tier, status, metric, stop_id?,
            analysis?}`` where ``analysis`` is ``outputs.error_analysis``'s result.
        stops: ``stops.jsonl`` records.
        decisions: ``decisions.jsonl`` records.
        figures: ``{calendar|curves|confusion: relative PNG path}`` inside the output folder.

    Returns:
        A JSON-ready dict whose top level holds the ``SUMMARY_KEYS`` (``campaign report --json``).
    """
    v = verdict.to_dict() if isinstance(verdict, Verdict) else dict(verdict)
    return {
        "format": REPORT_FORMAT,
        "campaign_id": campaign_id,
        "campaign": name,
        "question": question,
        "verdict": v,
        **{k: budget[k] for k in SUMMARY_KEYS[1:]},
        "budget": dict(budget),
        "runs": [dict(r) for r in runs],
        "forecast_vs_actual": dict(forecast),
        "stops": list(stops),
        "decisions": list(decisions),
        "figures": dict(figures or {}),
    }


def report_summary(report: Mapping[str, Any]) -> dict[str, Any]:
    """The keys ``campaign report --json`` promises, read from a report."""
    return {"campaign_id": report.get("campaign_id"), **{k: report.get(k) for k in SUMMARY_KEYS}}


def _cell(x: Any) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")


def _hours(x: float | None) -> str:
    return "not observed" if x is None else f"{x:.3f}"


def render_report_md(report: Mapping[str, Any]) -> str:
    """``report.md``: verdict, runs, budget, forecast vs actual, decisions, stops, analysis, figures."""
    from gpucampaign.outputs import render_error_analysis_md

    v = report["verdict"]
    figures = report.get("figures") or {}
    out = [f"# Closing report: {report['campaign']}", ""]
    if report.get("question"):
        out += [f"Question: {report['question']}", ""]
    out += [f"Campaign ID: `{report['campaign_id']}`", "", "## Verdict", "", f"**{v['kind']}**: {v['text']}", ""]

    out += ["## Runs", "", "| run | run ID | tier | status | metric | note |", "|---|---|---|---|---:|---|"]
    stops_by_id = {s.get("stop_id"): s for s in report.get("stops", [])}
    for r in report["runs"]:
        metric = "" if r.get("metric") is None else f"{r['metric']:.4f}"
        note = ""
        if r.get("stop_id"):
            s = stops_by_id.get(r["stop_id"], {})
            note = f"{r['stop_id']}: {s.get('rule', '')} {s.get('reason', '')}".strip()
        out.append(
            f"| {_cell(r['run'])} | `{r['run_id']}` | {r.get('tier', '')} | {r.get('status', '')} | {metric} | {_cell(note)} |"
        )
    out += ["", "## Budget", "", render_budget_md(report["budget"])]

    fva = report["forecast_vs_actual"]
    out += [
        "## Forecast vs actual",
        "",
        "Allotted hours come from `plan.json`, untouched since the start; observed hours only from "
        "`timeline.jsonl` (a step without a recorded interval is *not observed*, never estimated).",
        "",
        "| step | allotted h | re-forecast h | observed h | deviation h | explanation |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for s in fva["steps"]:
        refo = "" if s["reforecast_hours"] is None else f"{s['reforecast_hours']:.3f}"
        dev = "" if s["deviation_hours"] is None else f"{s['deviation_hours']:+.3f}"
        allotted = "" if s["allotted_hours"] is None else f"{s['allotted_hours']:.3f}"
        out.append(
            f"| {_cell(s['step'])} | {allotted} | {refo} | {_hours(s['observed_hours'])} | {dev} | {_cell(s['explanation'])} |"
        )
    totals = fva.get("totals", {})
    if totals:
        parts = [
            f"{label} {totals[k]:g} h"
            for k, label in (
                ("allotted_span_hours", "planned span"),
                ("reforecast_span_hours", "re-forecast span"),
                ("window_hours", "window"),
            )
            if totals.get(k) is not None
        ]
        if totals.get("observed_wall_hours") is not None:
            parts.append(f"observed busy time {totals['observed_wall_hours']:.3f} h")
        out += ["", "Totals: " + "; ".join(parts) + "."]
    if fva.get("unplanned_timeline_steps"):
        out += ["", "Timeline intervals outside the plan's steps: " + ", ".join(fva["unplanned_timeline_steps"]) + "."]
    out.append("")

    out += ["## Decisions taken", ""]
    decisions = report.get("decisions") or []
    for rec in decisions:
        d = _decision_of(rec)
        when = rec.get("point") or rec.get("time") or ""
        reasons = "; ".join(d.get("reasons", []) or [])
        dropped = f" (dropped: {', '.join(d['dropped_runs'])})" if d.get("dropped_runs") else ""
        out.append(f"- {when}: **{d.get('action', '?')}** by {d.get('by', '?')}{dropped}: {reasons}")
    if not decisions:
        out.append("- none recorded")
    out += ["", "## Stops", ""]
    out += [
        f"- `{s.get('stop_id')}` {s.get('rule')} on {s.get('run') or s.get('run_id')}"
        f"{'' if s.get('step') is None else ' at step ' + str(s['step'])}: {s.get('reason')}"
        for s in report.get("stops", [])
    ] or ["- none"]
    out.append("")

    analysed = [r for r in report["runs"] if r.get("analysis")]
    if analysed:
        out += ["## Error analysis", ""]
        for r in analysed:
            out.append(render_error_analysis_md(r["analysis"], title=f"{r['run']} (`{r['run_id']}`)"))

    est = fva.get("estimates") or {}
    if est.get("measured"):
        out += [
            "## Estimates for next time",
            "",
            "Measured here and kept in `estimates.json` (`campaign plan --calibrate-from` reads it):",
            "",
            "| measure | seconds | samples |",
            "|---|---:|---:|",
        ]
        for k, val in est["measured"].items():
            shown = "not observed" if val is None else f"{val:.6g}"
            out.append(f"| {k} | {shown} | {est.get('samples', {}).get(k, 0)} |")
        out.append("")

    if figures:
        out += ["## Figures", ""]
        titles = {"calendar": "Calendar: planned vs actual", "curves": "Loss and metric curves", "confusion": "Confusion matrix of the verdict's run"}
        for key, rel in figures.items():
            out += [f"![{titles.get(key, key)}]({rel})", ""]
    out += [
        "## Files",
        "",
        "`manifest.json` lists every file with its size and sha256; `RELOAD.md` gives the commands "
        "to reload a model and predict; `campaign verify .` checks this folder.",
        "",
    ]
    return "\n".join(out)


_IMG_SRC = re.compile(r'(<img\s[^>]*?src=")([^"]+)(")')


def render_report_html(report_md: str, *, root: str | Path, title: str = "Closing report") -> str:
    """A self-contained ``report.html``: the markdown rendered, figures embedded as data URIs."""
    import base64
    import html

    from markdown_it import MarkdownIt

    from gpucampaign.outputs import OutputFolder

    folder = OutputFolder(root)
    body = MarkdownIt("commonmark", {"html": False}).enable("table").render(report_md)

    def embed(m: Any) -> str:
        src = html.unescape(m.group(2))
        try:
            path = folder.path(src)
        except ValueError:
            return m.group(0)
        if not path.is_file() or path.suffix.lower() != ".png":
            return m.group(0)
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        return f"{m.group(1)}data:image/png;base64,{data}{m.group(3)}"

    body = _IMG_SRC.sub(embed, body)
    style = (
        "body{font-family:system-ui,sans-serif;max-width:72rem;margin:2rem auto;padding:0 1rem;line-height:1.45}"
        "table{border-collapse:collapse;margin:1rem 0}td,th{border:1px solid #ccc;padding:.25rem .5rem;vertical-align:top}"
        "img{max-width:100%}code{background:#f4f4f4;padding:0 .2rem}"
    )
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{style}</style></head><body>\n{body}</body></html>\n"
    )


def write_report(root: str | Path, report: Mapping[str, Any]) -> dict[str, Path]:
    """Write ``report.json``, ``report.md``, ``report.html`` and ``estimates.json``.

    ``campaign report OUT`` reads these files back: it never recomputes anything.

    Returns:
        ``{json, md, html, estimates}`` paths.
    """
    from gpucampaign.outputs import OutputFolder

    folder = OutputFolder(root)
    md = render_report_md(report)
    paths = {
        "json": folder.write_json(REPORT_JSON, report),
        "md": folder.write_text(REPORT_MD, md),
        "html": folder.write_text(
            REPORT_HTML, render_report_html(md, root=root, title=f"Closing report: {report['campaign']}")
        ),
    }
    est = (report.get("forecast_vs_actual") or {}).get("estimates") or {}
    paths["estimates"] = folder.write_json(
        ESTIMATES_FILE, {"campaign_id": report["campaign_id"], "campaign": report["campaign"], **est}
    )
    return paths


def read_report(out_dir: str | Path) -> dict[str, Any]:
    """``report.json`` of a closed campaign.

    Raises:
        SpecError: the folder has no readable report (the campaign has not closed).
    """
    path = Path(out_dir) / REPORT_JSON
    if not path.is_file():
        raise SpecError(
            f"'{out_dir}' has no {REPORT_JSON}: give the output folder of a closed campaign "
            "(the close phase writes it)",
            field="OUT",
        )
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise SpecError(f"'{path}' is not valid JSON ({exc})", field="OUT") from None
    if not isinstance(report, dict):
        raise SpecError(f"'{path}' is not a report: it holds no JSON object", field="OUT")
    return report
