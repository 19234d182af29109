"""How a verdict says its numbers: values against the threshold, gains and their intervals
against the minimum gain, the seeds an interval rests on, and the stops that ended runs."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpucampaign.config import DecisionRule
from gpucampaign.core.text import say_number


def say_value(x: float, rule: DecisionRule) -> str:
    """A metric value, with the digits that show how it compares with the threshold."""
    return say_number(x, against=rule.threshold)


def say_gain(x: float, rule: DecisionRule) -> str:
    """A gain (or an interval's end), with the digits that show how it compares with the
    minimum gain."""
    return say_number(x, against=rule.min_gain, signed=True)


def seeds_text(entry: Mapping[str, Any]) -> str:
    """What an interval over seeds rests on: ``3 seeds (0, 1, 2) x 80 examples``; empty
    without replicates."""
    seeds = entry.get("seeds")
    if not seeds:
        return ""

    def named(ks: Sequence[int | None]) -> str:
        return "" if None in ks else f" ({', '.join(str(k) for k in ks)})"

    c, v = seeds["control"], seeds["variant"]
    if seeds["paired"]:
        on = f"{len(c)} seeds{named(c)}"
    else:
        on = (
            f"{len(c)} control seed(s){named(c)} and {len(v)} variant seed(s){named(v)} "
            "(resampled apart)"
        )
    return f"{on} x {entry['n']} examples"


def improves_text(rule: DecisionRule, name: str, entry: Mapping[str, Any], split: str) -> str:
    """``'b' improves accuracy over the control by +0.05 on test (95% CI [+0.04, +0.06])``;
    with replicates the interval names its seeds and examples."""
    better = " (lower is better)" if rule.direction == "minimize" else ""
    ci = entry.get("gain_ci95")
    over = f" over {seeds_text(entry)}" if entry.get("seeds") else ""
    interval = (
        f"95% CI [{say_gain(ci[0], rule)}, {say_gain(ci[1], rule)}]{over}"
        if ci is not None
        else "a point estimate, no interval"
    )
    return (
        f"'{name}' improves {rule.metric}{better} over the control by "
        f"{say_gain(entry['gain'], rule)} on {split} ({interval})"
    )


def say_metric(x: float | None, rule: DecisionRule, *, status: str = "stopped") -> str:
    """A metric value, or why the run has none (its status)."""
    if x is not None:
        return say_value(x, rule)
    if status == "dropped":
        return "dropped at the decision point"
    if status == "not_run":
        return "not run"
    return "stopped (no metric)"


def ci_text(entry: Mapping[str, Any], rule: DecisionRule) -> str:
    """``gain +0.01 [95% CI -0.005, +0.025]``, or the gain alone without an interval."""
    if entry.get("gain") is None:
        return "no gain"
    ci = entry.get("gain_ci95")
    if ci is None:
        return f"gain {say_gain(entry['gain'], rule)} (no interval)"
    low, high = say_gain(ci[0], rule), say_gain(ci[1], rule)
    seeds = ""
    if entry.get("seeds"):
        seeds = f" over {seeds_text(entry)}" + (
            f", {entry['dominates']} dominate" if entry.get("dominates") else ""
        )
    return f"gain {say_gain(entry['gain'], rule)} [95% CI {low}, {high}{seeds}]"


def stops_of(
    run: str, stops: Iterable[Mapping[str, Any]], *, seeds: bool = False
) -> list[Mapping[str, Any]]:
    """Stop records of a run (with ``seeds``, of its seed replicates ``<run>.s<seed>`` too),
    matched by name or by run ID ``<name>-<10 hex>``."""
    seed_run = re.compile(rf"{re.escape(run)}(\.s\d+)?" if seeds else re.escape(run))
    out = []
    for s in stops:
        rid = str(s.get("run_id") or "")
        names = [str(s.get("run") or ""), rid.rsplit("-", 1)[0] if rid else ""]
        if any(seed_run.fullmatch(n) for n in names if n):
            out.append(s)
    return out


def stop_text(run: str, stops: Iterable[Mapping[str, Any]]) -> str:
    """Why a run has no metric, from its stop records (a stopped seed replicate named)."""
    found = stops_of(run, stops, seeds=True)
    if not found:
        return f"'{run}' has no metric (no stop recorded)"
    return "; ".join(
        f"'{s.get('run') or run}' stopped by {s.get('rule', 'stop')} ({s.get('stop_id', '?')}): "
        f"{s.get('reason', '')}"
        for s in found
    )


#: How a tie on the selection split is broken, as the verdict states it.
TIE_RULE = "the cheaper run by measured training time, then the first in the spec"


def tie_text(
    rule: DecisionRule,
    chosen: str,
    tied: Sequence[str],
    *,
    table: Mapping[str, Any],
    train_s: Mapping[str, float | None],
) -> str:
    """The tie on the selection split and how it was broken (empty without a tie)."""
    if not tied:
        return ""
    sel = rule.select_split
    value = say_value(table[chosen][sel]["value"], rule)

    def took(name: str) -> str:
        t = train_s.get(name)
        return f"'{name}' {'not measured' if t is None else f'{t:.3g} s'}"

    return (
        f" Tie on {sel}: {', '.join(repr(n) for n in tied)} all reach {value}; broken by the "
        f"stated rule ({TIE_RULE}): '{chosen}' (training time {', '.join(map(took, tied))})."
    )


def listing(
    rule: DecisionRule,
    *,
    control: Any,
    table: Mapping[str, Any],
    status: Mapping[str, str],
    notes: Mapping[str, str] | None = None,
) -> str:
    """Every value, gain and interval on both splits, the control first (``control``: its
    ``verdict.RunEvidence``)."""
    sel, rep = rule.select_split, rule.report_split
    notes = notes or {}
    parts = [
        f"control {sel} {say_metric(control.values.get(sel), rule, status=control.status)}, "
        f"{rep} {say_metric(control.values.get(rep), rule, status=control.status)}"
        + (f" ({control.note})" if control.note else "")
    ]
    for name, row in table.items():
        st = status.get(name, "stopped")
        if row[sel]["value"] is None and row[rep]["value"] is None:
            parts.append(f"{name} {say_metric(None, rule, status=st)}")
            continue
        parts.append(
            f"{name} {sel} {say_metric(row[sel]['value'], rule, status=st)} "
            f"({ci_text(row[sel], rule)}), "
            f"{rep} {say_metric(row[rep]['value'], rule, status=st)} ({ci_text(row[rep], rule)})"
            + (f" ({notes[name]})" if notes.get(name) else "")
        )
    return "; ".join(parts)


def disagreement(chosen: str | None, on_report: str | None, *, sel: str, rep: str) -> str:
    if chosen == on_report:
        return ""
    picked = f"'{chosen}'" if chosen else "no variant"
    other = f"'{on_report}'" if on_report else "no variant"
    return (
        f" The {rep} split disagrees with the choice made on {sel}: on {rep} {other} would be "
        f"chosen, on {sel} {picked}; the verdict follows {sel} (choosing on {rep} would make "
        f"the reported gain optimistic)."
    )
