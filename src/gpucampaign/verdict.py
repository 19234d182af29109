"""The verdict: the spec's decision rule applied to the measured metrics.

A pure function of the metrics and the stop records: nothing is re-measured.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from gpucampaign.spec import DecisionRule

VerdictKind = Literal["adopt", "keep_control", "negative", "stopped", "re-pose"]
# A gain computed as a float difference of two k/n accuracies can land 1e-17 under min_gain.
_GAIN_DIGITS = 12


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


def no_rule_verdict() -> Verdict:
    """The verdict of a spec without a decision rule: nothing can be decided."""
    return Verdict(kind="stopped", run=None, text="The spec has no decision rule.")


def _fmt(x: float | None) -> str:
    return "stopped (no metric)" if x is None else f"{x:.4f}"


def stops_of(run: str, stops: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Stop records of a run, matched by name or by run ID ``<name>-<10 hex>``."""
    out = []
    for s in stops:
        rid = str(s.get("run_id") or "")
        if s.get("run") == run or (rid and rid.rsplit("-", 1)[0] == run):
            out.append(s)
    return out


def _stop_text(run: str, stops: Iterable[Mapping[str, Any]]) -> str:
    found = stops_of(run, stops)
    if not found:
        return f"'{run}' has no metric (no stop recorded)"
    return "; ".join(
        f"'{run}' stopped by {s.get('rule', 'stop')} ({s.get('stop_id', '?')}): "
        f"{s.get('reason', '')}"
        for s in found
    )


def _verdict_numbers(
    rule: DecisionRule,
    *,
    control_metric: float | None,
    variant_metrics: Mapping[str, float | None],
) -> dict[str, Any]:
    """The rule, each value, each gain over the control and who meets the threshold."""
    sign = 1.0 if rule.direction == "maximize" else -1.0
    gains = {
        name: (
            None
            if v is None or control_metric is None
            else round(sign * (v - control_metric), _GAIN_DIGITS)
        )
        for name, v in variant_metrics.items()
    }
    meets = {n: (None if v is None else rule.meets(v)) for n, v in variant_metrics.items()}
    return {
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
            **meets,
        },
    }


def _best_adoptable(
    rule: DecisionRule, *, variant_metrics: Mapping[str, float | None], gains: Mapping[str, Any]
) -> str | None:
    """The best variant that meets the threshold and beats the control by the min gain."""

    def adoptable(name: str) -> bool:
        v, g = variant_metrics[name], gains[name]
        return v is not None and g is not None and rule.meets(v) and g >= rule.min_gain and g > 0

    candidates = [n for n in variant_metrics if adoptable(n)]
    if not candidates:
        return None
    best = candidates[0]
    for n in candidates[1:]:
        if rule.better(variant_metrics[n], variant_metrics[best]):  # type: ignore[arg-type]
            best = n
    return best


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
    numbers = _verdict_numbers(rule, control_metric=control_metric, variant_metrics=variant_metrics)
    head = (
        f"{rule.metric} on {rule.split} ({rule.direction}, threshold {rule.threshold:g}, "
        f"min gain {rule.min_gain:g})"
    )
    listing = "; ".join(
        [f"control {_fmt(control_metric)}"] + [f"{n} {_fmt(v)}" for n, v in variant_metrics.items()]
    )
    stopped = [n for n, v in variant_metrics.items() if v is None]
    stop_note = ("; " + "; ".join(_stop_text(n, stops) for n in stopped)) if stopped else ""
    tail = f"{head}: {listing}{stop_note}."

    if repose_reason is not None:
        text = (
            f"Re-pose the question: the decision point after the pilot stopped the campaign "
            f"({repose_reason}). No variant was compared. {tail}"
        )
        return Verdict(kind="re-pose", run=None, text=text, numbers=numbers)
    if control_metric is None:
        text = (
            f"No decision: the control, the essential reference, has no metric "
            f"({_stop_text('control', stops)}); nothing can be compared. {tail}"
        )
        return Verdict(kind="stopped", run=None, text=text, numbers=numbers)
    gains = numbers["gains_over_control"]
    best = _best_adoptable(rule, variant_metrics=variant_metrics, gains=gains)
    if best is not None:
        v = variant_metrics[best]
        assert v is not None
        text = (
            f"Adopt '{best}': {rule.metric} {v:.4f} vs control {control_metric:.4f} on "
            f"{rule.split} (gain {gains[best]:+.4f} >= min gain {rule.min_gain:g}; threshold "
            f"{rule.threshold:g} met). {tail}"
        )
        return Verdict(kind="adopt", run=best, text=text, numbers=numbers)
    return _without_adoption(rule, control_metric=control_metric, numbers=numbers, tail=tail)


def _without_adoption(
    rule: DecisionRule, *, control_metric: float, numbers: dict[str, Any], tail: str
) -> Verdict:
    """Keep the control when it meets the threshold; a complete negative result otherwise."""
    meeting = [n for n, v in numbers["variants"].items() if v is not None and rule.meets(v)]
    why = (
        f"variant(s) {', '.join(repr(n) for n in meeting)} meet the threshold but do not beat "
        f"the control by the min gain {rule.min_gain:g}"
        if meeting
        else "no variant meets the threshold"
    )
    if rule.meets(control_metric):
        text = f"Keep the control: {why}; the control meets it ({control_metric:.4f}). {tail}"
        return Verdict(kind="keep_control", run="control", text=text, numbers=numbers)
    text = (
        f"Negative result (complete): {why}, and neither does the control. {tail} "
        "This answers the question: a longer campaign on these variants is not justified."
    )
    return Verdict(kind="negative", run=None, text=text, numbers=numbers)
