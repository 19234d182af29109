"""The verdict: the spec's decision rule applied to the measured evidence.

The winner is chosen on the selection split only; its gain over the control is then reported,
with a 95% interval paired by example and seed, on the report split, which decides how sure
the verdict is. A pure function of the metrics, the predictions, the per-example scores and the stop
records: nothing is re-measured.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from gpucampaign.close.bootstrap import Gain, paired_gain, paired_mean_gain
from gpucampaign.close.more_evidence import (
    NOISE_NOT_MEASURED,
    missing_interval,
    seeds_to_measure_noise,
    to_settle,
)
from gpucampaign.close.verdict_steps import (
    ALPHA,
    barred,
    family,
    futile_settled,
    futile_words,
    refuse_uncorrected,
    steps_compared,
)
from gpucampaign.close.verdict_words import (
    TIE_RULE,
    ci_text,
    disagreement,
    improves_text,
    listing,
    say_gain,
    say_value,
    stop_text,
    tie_text,
)
from gpucampaign.config import DecisionRule
from gpucampaign.core.resample import BOOT_SEED
from gpucampaign.core.text import say_exact, say_hours

VerdictKind = Literal["adopt", "negative", "inconclusive", "stopped", "re-pose"]
# A gain computed as a float difference of two k/n accuracies can land 1e-17 under min_gain.
_GAIN_DIGITS = 12


@dataclass(frozen=True)
class RunEvidence:
    """What one run measured: its metric per split, and its predictions and per-example
    scores per split (one per replicate seed), from which the paired intervals are drawn.

    ``status`` is the run's state (``completed``, ``stopped``, ``interrupted``, ``dropped``,
    ``not_run``): a run without a metric is described by it. ``note`` qualifies its values
    (an interrupted run's are those of its last good model, at that step). ``no_interval``
    says why a run that measured has no per-example rows for the metric (then its gains are
    point estimates). ``train_s``: one seed's measured training time (the sum of its step
    times), which breaks a tie on the selection split and prices more seeds. ``step`` and
    ``planned`` are the step of the model compared and the run's planned steps; ``peak`` is
    the step and value of its best evaluation on the selection split (a run keeps only its
    last model, so a run that peaked earlier is compared at its last step, and the verdict
    says so); ``futile`` is the step at which an early stop rule (``early_rule``: ``futile``
    or ``not_learning``) stopped it: it then has no values (a model of fewer steps is never set
    against the finished control) and is never adopted.
    """

    values: Mapping[str, float | None] = field(default_factory=dict)
    predictions: Mapping[str, Sequence[Any]] = field(default_factory=dict)
    scores: Mapping[str, Sequence[Any]] = field(default_factory=dict)
    status: str = "completed"
    note: str = ""
    no_interval: str = ""
    train_s: float | None = None
    step: int | None = None
    planned: int | None = None
    peak: tuple[int, float] | None = None
    futile: int | None = None
    early_rule: str = ""


@dataclass(frozen=True)
class Verdict:
    """The decision the campaign reached, with the numbers it rests on.

    ``answer`` is one sentence that answers the spec's question in its own terms: yes, no or
    not yet (not answered when nothing was compared), the chosen run, its gain with the
    interval on the report split, the threshold, then the kind; ``text`` is the verdict
    paragraph with every number.

    ``kind``: ``adopt`` (``run`` is the variant to adopt: chosen on the selection split, and the
    report split's interval clears the minimum gain), ``negative`` (no variant clears the
    minimum gain, or none meets the threshold: a complete result; ``run`` is the control when it
    meets the threshold), ``inconclusive`` (the chosen variant's interval straddles the minimum
    gain; ``resolve`` says what would settle it; or no variant clears it but one was
    interrupted under ``resume: inference``, so a complete run might), ``stopped`` (the
    control has no metric, or was interrupted, so nothing can be compared) or ``re-pose`` (the
    decision point after the pilot re-posed the question). ``variants`` holds, per variant and
    split, ``value``, ``gain`` and ``gain_ci95``. An interrupted variant's values are those of
    its last good model: it can be chosen (its evidence at that step already clears the rule)
    and the text says at which step.
    """

    kind: VerdictKind
    run: str | None
    text: str
    numbers: dict[str, Any] = field(default_factory=dict)
    select_split: str | None = None
    report_split: str | None = None
    control: dict[str, float | None] = field(default_factory=dict)
    variants: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    test_disagrees: bool = False
    resolve: dict[str, Any] | None = None
    answer: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (kept in manifest.json and report.json)."""
        return asdict(self)


@dataclass(frozen=True)
class _Frame:
    """One comparison under the rule: the per-variant ``table``, what every verdict of it
    carries (``base``: splits, table, numbers), the text's ``tail`` that states every number,
    ``tie``, how a tie on the selection split was broken, and ``disagree``, the note said when
    the report split would choose otherwise."""

    rule: DecisionRule
    table: Mapping[str, Any]
    base: dict[str, Any]
    tail: str
    disagree: str = ""
    tie: str = ""

    @property
    def ending(self) -> str:
        """The end of a verdict's text: the tail, how a tie was broken, then the
        disagreement note."""
        return f"{self.tail}{self.tie}{self.disagree}"

    def verdict(self, kind: VerdictKind, run: str | None, text: str, **fields: Any) -> Verdict:
        """A verdict of this comparison; it disagrees when a disagreement note is said."""
        return Verdict(
            kind=kind, run=run, text=text, test_disagrees=bool(self.disagree), **fields, **self.base
        )


def no_rule_verdict() -> Verdict:
    """The verdict of a spec without a decision rule: nothing can be decided."""
    return Verdict(
        kind="stopped",
        run=None,
        text="The spec has no decision rule.",
        answer="Not answered: the spec has no decision rule. Verdict: stopped.",
    )


def _split_entry(
    rule: DecisionRule, split: str, *, control: RunEvidence, variant: RunEvidence, seed: int
) -> dict[str, Any]:
    """``{value, gain, gain_ci95, n, replicates}`` of a variant on one split."""
    sign = 1.0 if rule.direction == "maximize" else -1.0
    v, c = variant.values.get(split), control.values.get(split)
    g: Gain | None = None
    if v is not None:
        g = paired_gain(
            control.predictions.get(split, ()),
            variant.predictions.get(split, ()),
            metric=rule.metric,
            seed=seed,
        )
        if g is None:
            g = paired_mean_gain(
                control.scores.get(split, ()), variant.scores.get(split, ()), metric=rule.metric
            )
    if g is not None:
        lo, hi = sorted((sign * g.ci95[0], sign * g.ci95[1]))
        return {
            **g.to_dict(),
            "value": v,
            "gain": round(sign * g.gain, _GAIN_DIGITS),
            "gain_ci95": [lo, hi],
        }
    gain = None if v is None or c is None else round(sign * (v - c), _GAIN_DIGITS)
    missing = dict.fromkeys(e.no_interval for e in (control, variant) if e.no_interval)
    return {
        "value": v,
        "gain": gain,
        "gain_ci95": None,
        "n": None,
        "replicates": None,
        "no_interval": "; ".join(missing) or None,
    }


def _choose(
    rule: DecisionRule,
    table: Mapping[str, Mapping[str, Any]],
    split: str,
    *,
    train_s: Mapping[str, float | None] | None = None,
    never: Mapping[str, str] | None = None,
) -> tuple[str | None, list[str]]:
    """The best variant on ``split`` that meets the threshold and gains the min gain there,
    and the variants tied with it (empty when it is alone at its value).

    A tie (the same value) goes to the cheaper run by measured training time, then to the
    first in the spec's order. A variant that only ties the control gains nothing and is never
    chosen: the control is kept; nor is a variant in ``never`` (stopped as futile).
    """
    ok = []
    for name, row in table.items():
        if name in (never or {}):
            continue
        v, g = row[split]["value"], row[split]["gain"]
        if v is None or g is None or not rule.meets(v) or g < rule.min_gain or g <= 0:
            continue
        ok.append(name)
    best = None
    for name in ok:
        if best is None or rule.better(table[name][split]["value"], table[best][split]["value"]):
            best = name
    if best is None:
        return None, []
    tied = [n for n in ok if table[n][split]["value"] == table[best][split]["value"]]
    if len(tied) == 1:
        return best, []
    times = train_s or {}
    order = list(table)

    def cost(name: str) -> tuple[bool, float, int]:
        t = times.get(name)
        return (t is None, t if t is not None else 0.0, order.index(name))

    return min(tied, key=cost), tied


def decide_verdict(
    rule: DecisionRule,
    *,
    control: RunEvidence | None,
    variants: Mapping[str, RunEvidence | None],
    stops: Iterable[Mapping[str, Any]] = (),
    repose_reason: str | None = None,
    lot: Mapping[str, float] | None = None,
    seed: int = BOOT_SEED,
    look: int = 0,
    alpha: float = ALPHA,
) -> Verdict:
    """Apply the spec's decision rule to the measured evidence.

    The winner is the best variant on ``rule.select_split`` that meets the threshold and beats
    the control by at least ``min_gain`` (strictly better when ``min_gain`` is 0); a tie goes
    to the cheaper run by measured training time, then the first in the spec (``TIE_RULE``).
    Its gain on ``rule.report_split``, with a 95% interval paired by example (over predictions
    or per-example scores), then decides the kind: ``adopt`` when the interval's lower end
    clears ``min_gain``, ``negative`` when its upper end does not, ``inconclusive`` when it
    straddles it, or when there is no interval and ``min_gain`` is above 0 (a point estimate
    cannot show it cleared), or when training noise is not measured (one seed a side: the
    interval covers the examples only, so the verdict proposes seeds). Without a winner the
    result is ``negative``. The text names the step each run is compared at. The text states
    every number and every stop, how a tie was broken, and when the report split disagrees
    with the choice made on the selection split; ``answer`` answers the question in one
    sentence.

    Args:
        rule: the spec's decision rule.
        control: the control's evidence; None (or no value on the selection split) when it
            has no metric.
        variants: evidence per variant name; None for a run that measured nothing.
        stops: stop records (``stops.jsonl`` lines) to explain missing metrics.
        repose_reason: the reasons, when the decision point re-posed the question (no run was
            trained after the pilot): the verdict is then ``re-pose``.
        lot: the rented lots' price and GPU hours (``usd``, ``gpu_hours``), to price the extra
            seeds of an inconclusive verdict (from each run's measured training time).
        seed: the bootstrap's seed.
        look, alpha: the rounds of seeds bought so far, and the one-sided error adoption
            may spend at this look (``close.looks.look_alpha``; Holm's step-down at it).

    Returns:
        The verdict.
    """
    stops = list(stops)
    sel, rep = rule.select_split, rule.report_split
    ctrl = control or RunEvidence(status="stopped")
    evidence = {n: e or RunEvidence(status="stopped") for n, e in variants.items()}
    table: dict[str, dict[str, dict[str, Any]]] = {
        n: {s: _split_entry(rule, s, control=ctrl, variant=e, seed=seed) for s in (sel, rep)}
        for n, e in evidence.items()
    }
    frame = _frame(rule, control=ctrl, evidence=evidence, table=table, stops=stops)

    early = _no_comparison(frame, control=ctrl, stops=stops, repose_reason=repose_reason)
    if early is not None:
        return early
    times = {n: e.train_s for n, e in evidence.items()}
    never = barred(evidence)
    chosen, tied = _choose(rule, table, sel, train_s=times, never=never)
    on_report, _ = _choose(rule, table, rep, train_s=times, never=never)
    frame = replace(
        frame,
        disagree=disagreement(chosen, on_report, sel=sel, rep=rep),
        tie=tie_text(rule, chosen, tied, table=table, train_s=times) if chosen else "",
    )
    if tied:
        frame.base["numbers"]["tie"] = {"tied": tied, "chosen": chosen, "rule": TIE_RULE}
    if chosen is None:
        cut = [n for n, e in evidence.items() if e.status == "interrupted"]
        settled = futile_settled(rule, never, stops=stops)
        return _negative(frame, control=ctrl, cut=cut, futile=futile_words(settled, evidence))
    seconds = {"control": ctrl.train_s, **times}
    fam = frame.base["numbers"]["family"] = family(rule, table, never=never, alpha=alpha, look=look)
    return refuse_uncorrected(_confirm(frame, chosen, seconds=seconds, lot=lot), fam=fam)


def _no_comparison(
    frame: _Frame,
    *,
    control: RunEvidence,
    stops: list[Mapping[str, Any]],
    repose_reason: str | None,
) -> Verdict | None:
    """The verdict when nothing can be compared: the question was re-posed after the pilot, or
    the control has no metric or was interrupted; None when the comparison can go on."""
    if repose_reason is not None:
        text = (
            f"Re-pose the question: the decision point after the pilot stopped the campaign "
            f"({repose_reason}). No variant was compared. {frame.tail}"
        )
        answer = (
            "Not answered: re-pose the question; the decision point after the pilot stopped "
            f"the campaign ({repose_reason}). Verdict: re-pose."
        )
        return frame.verdict("re-pose", None, text, answer=answer)
    if control.values.get(frame.rule.select_split) is None:
        # Why: its stop, or (not run) what left it unfinished, as the lot's end did.
        why = control.note if control.status == "not_run" and control.note else None
        why = why or stop_text("control", stops)
        text = (
            f"No decision: the control, the essential reference, has no metric ({why}); "
            f"nothing can be compared. {frame.tail}"
        )
        answer = (
            f"Not answered: the control has no {frame.rule.metric} to compare with ({why}). "
            "Verdict: stopped."
        )
        return frame.verdict("stopped", None, text, answer=answer)
    if control.status == "interrupted":
        text = (
            f"No decision: the control, the essential reference, was interrupted "
            f"({control.note}); its values are evidence at that step only, and no variant is "
            f"compared with a partly trained reference. {frame.tail}"
        )
        answer = (
            f"Not answered: the control was interrupted ({control.note}), so no variant is "
            "compared with it. Verdict: stopped."
        )
        return frame.verdict("stopped", None, text, answer=answer)
    return None


def _frame(
    rule: DecisionRule,
    *,
    control: RunEvidence,
    evidence: Mapping[str, RunEvidence],
    table: dict[str, dict[str, dict[str, Any]]],
    stops: list[Mapping[str, Any]],
) -> _Frame:
    """The comparison's frame: what every verdict carries (splits, per-variant table, numbers)
    and the text's tail that states every number and why a run has none."""
    sel, rep, ctrl = rule.select_split, rule.report_split, control
    numbers: dict[str, Any] = {
        "metric": rule.metric,
        "direction": rule.direction,
        "threshold": rule.threshold,
        "min_gain": rule.min_gain,
        "select_split": sel,
        "report_split": rep,
    }
    base = {
        "select_split": sel,
        "report_split": rep,
        "variants": table,
        "control": {s: ctrl.values.get(s) for s in (sel, rep)},
        "numbers": numbers,
    }
    head = (
        f"{rule.metric} ({rule.direction}, threshold {say_exact(rule.threshold)}, min gain "
        f"{say_exact(rule.min_gain)}), chosen on {sel}, reported on {rep}"
    )
    never = barred(evidence)
    listed = listing(
        rule,
        control=ctrl,
        table=table,
        status={n: e.status for n, e in evidence.items()},
        notes={
            n: "; ".join(x for x in (e.note, never.get(n, "")) if x) for n, e in evidence.items()
        },
    )
    steps, at = steps_compared(rule, runs={"control": control, **evidence})
    if at:
        numbers["steps"] = at
    if never:
        numbers["never_adopted"] = never
    # Every stop that ended a run early is evidence said with the verdict: why a run has no
    # metric, or why its values are those of the model it reached (the control's missing
    # metric is said by the verdict itself).
    stopped = [
        n
        for n, e in (("control", control), *evidence.items())
        if e.status in ("stopped", "interrupted")
        and not (n == "control" and control.values.get(sel) is None)
    ]
    stop_note = ("; " + "; ".join(stop_text(n, stops) for n in stopped)) if stopped else ""
    return _Frame(rule, table, base, tail=f"{head}: {listed}{stop_note}.{steps}")


def _negative(
    frame: _Frame,
    *,
    control: RunEvidence,
    cut: Sequence[str] = (),
    futile: tuple[str, str] = ("", ""),
) -> Verdict:
    """No variant clears the min gain on the selection split: a complete negative result,
    unless a variant was interrupted (``cut``): its values are those of an earlier step, so a
    complete run might still clear the rule, and the result is inconclusive; so too when a
    variant was stopped as futile without its interval at the stop showing it cannot win
    (``futile``: ``verdict_steps.futile_words``; those variants are said apart)."""
    rule, sel = frame.rule, frame.rule.select_split
    thr, mg = say_exact(rule.threshold), say_exact(rule.min_gain)
    barred_ = frame.base["numbers"].get("never_adopted") or {}
    rows = {n: row for n, row in frame.table.items() if n not in barred_}
    meeting = [
        n
        for n, row in rows.items()
        if row[sel]["value"] is not None and rule.meets(row[sel]["value"])
    ]
    why = (
        f"variant(s) {', '.join(repr(n) for n in meeting)} meet the threshold on {sel} but do "
        f"not beat the control by the min gain {mg}"
        if meeting
        else f"no {'finished ' if barred_ else ''}variant meets the threshold on {sel}"
    ) + futile[0]
    c = control.values[sel]
    assert c is not None
    keeps = rule.meets(c)
    also = (
        f"; the control meets it ({say_value(c, rule)}): keep the control"
        if keeps
        else (", and neither does the control")
    )
    gains = {n: row[sel]["gain"] for n, row in rows.items() if row[sel]["gain"] is not None}
    best = max(gains, key=lambda n: gains[n], default=None)
    short = (
        f"no variant improves {rule.metric} over the control by the min gain {mg} on {sel}"
        if meeting
        else f"no variant reaches the threshold {thr} in {rule.metric} on {sel}"
    )
    quote = ""
    if best is not None:
        rep = rule.report_split
        split = rep if frame.table[best][rep]["gain"] is not None else sel
        quote = (
            f" (the best on {sel}: {improves_text(rule, best, frame.table[best][split], split)})"
        )
    control_says = (
        f"keep the control ({rule.metric} {say_value(c, rule)} on {sel}, threshold {thr} met)"
        if keeps
        else f"neither does the control ({say_value(c, rule)} on {sel})"
    )
    if cut:
        names = ", ".join(repr(n) for n in cut)
        text = (
            f"Inconclusive: {why}{also}; but {names} stopped learning early (interrupted, "
            f"resume: inference): a complete run might still clear the rule. {frame.ending}"
        )
        answer = (
            f"Not yet: {short}{quote}, but {names} stopped learning early (interrupted): a "
            "complete run might still clear the rule. Verdict: inconclusive."
        )
        return frame.verdict("inconclusive", None, text, answer=answer)
    if futile[1]:
        text = (
            f"Inconclusive: {why}{also}; but {futile[1]} stopped as futile without the "
            f"interval at the stop showing it cannot win: a finished run might still clear the "
            f"rule. {frame.ending}"
        )
        answer = (
            f"Not yet: {short}{quote}, but {futile[1]} stopped as futile early without its "
            "interval showing it cannot win. Verdict: inconclusive."
        )
        return frame.verdict("inconclusive", None, text, answer=answer)
    text = (
        f"Negative result (complete): {why}{also}. {frame.ending} This answers the "
        "question: a longer campaign on these variants is not justified."
    )
    answer = f"No: {short}{quote}; {control_says}. Verdict: negative."
    return frame.verdict("negative", "control" if keeps else None, text, answer=answer)


def _confirm(
    frame: _Frame,
    chosen: str,
    *,
    seconds: Mapping[str, float | None],
    lot: Mapping[str, float] | None,
) -> Verdict:
    """The chosen variant's report-split interval against the min gain: adopt, negative or
    inconclusive. Without an interval (no per-example rows) a minimum gain cannot be shown
    cleared by one point estimate: inconclusive, saying what is missing."""
    rule, table = frame.rule, frame.table
    sel, rep = rule.select_split, rule.report_split
    thr, mg = say_exact(rule.threshold), say_exact(rule.min_gain)
    entry = table[chosen][rep]
    value, gain, ci = entry["value"], entry["gain"], entry["gain_ci95"]
    lo, hi = (gain, gain) if ci is None else ci
    picked = f"'{chosen}' is best on {sel} ({ci_text(table[chosen][sel], rule)})"
    if value is None or gain is None:
        text = f"Inconclusive: {picked} but has no {rep} metric. {frame.ending}"
        answer = (
            f"Not yet: '{chosen}' is best on {sel} but has no {rep} {rule.metric} to confirm "
            "it. Verdict: inconclusive."
        )
        return frame.verdict("inconclusive", chosen, text, answer=answer)
    improves = improves_text(rule, chosen, entry, rep)
    reaches = f"reaches {say_value(value, rule)} against the threshold {thr}"
    if ci is None and rule.min_gain > 0 and rule.meets(value):
        resolve = missing_interval(rule, entry)
        text = (
            f"Inconclusive: {picked}; on {rep} its gain {say_gain(gain, rule)} has no interval, "
            f"so it cannot show that the gain clears the min gain {mg}. "
            f"{resolve['text']} {frame.ending}"
        )
        answer = (
            f"Not yet: {improves}, and without an interval ({resolve['why']}) a point "
            f"estimate cannot show the min gain {mg} cleared. Verdict: inconclusive."
        )
        return frame.verdict("inconclusive", chosen, text, resolve=resolve, answer=answer)
    if lo >= rule.min_gain and lo > 0 and rule.meets(value):
        if entry.get("training_noise") != "measured":
            return _noise_not_measured(frame, chosen, improves=improves, seconds=seconds, lot=lot)
        clears = (
            f"the lower end clears the min gain {mg}"
            if ci is not None
            else f"a point estimate above the min gain 0 ({missing_interval(rule, entry)['why']})"
        )
        text = (
            f"Adopt '{chosen}': chosen on {sel}; on {rep} {rule.metric} {say_value(value, rule)}, "
            f"{ci_text(entry, rule)}, {clears} (threshold {thr} met). {frame.ending}"
        )
        above = (
            f"clearing the min gain {mg}"
            if ci is not None
            else "above the min gain 0 on a point estimate"
        )
        answer = f"Yes: {improves}, {above}, and {reaches}. Verdict: adopt."
        return frame.verdict("adopt", chosen, text, answer=answer)
    if hi < rule.min_gain or hi <= 0 or not rule.meets(value):
        why = (
            f"its {rep} value {say_value(value, rule)} misses the threshold {thr}"
            if not rule.meets(value)
            else f"on {rep} its {ci_text(entry, rule)} stays under the min gain {mg}"
        )
        c = frame.base["control"].get(sel)
        keep = "; keep the control" if c is not None and rule.meets(c) else ""
        unconfirmed = f" The {rep} split does not confirm the choice made on {sel}."
        frame = replace(frame, disagree=frame.disagree or unconfirmed)
        text = f"Negative result (complete): {picked}, but {why}. {frame.ending}"
        answer = (
            f"No: '{chosen}', the best on {sel}, {reaches} on {rep}, which misses it"
            if not rule.meets(value)
            else f"No: {improves}, under the min gain {mg}"
        ) + f"{keep}. Verdict: negative."
        return frame.verdict("negative", None, text, answer=answer)
    return _straddles(frame, chosen, improves=improves, seconds=seconds, lot=lot)


def _straddles(
    frame: _Frame,
    chosen: str,
    *,
    improves: str,
    seconds: Mapping[str, float | None],
    lot: Mapping[str, float] | None,
) -> Verdict:
    """Inconclusive: the chosen variant's report-split interval straddles the min gain; says
    what more evidence would settle it, and at what cost."""
    rule, table = frame.rule, frame.table
    sel, rep, mg = rule.select_split, rule.report_split, say_exact(rule.min_gain)
    picked = f"'{chosen}' is best on {sel} ({ci_text(table[chosen][sel], rule)})"
    entry = table[chosen][rep]
    resolve = to_settle(rule, chosen, entry=entry, seconds=seconds, lot=lot)
    text = (
        f"Inconclusive: {picked}; on {rep} its {ci_text(entry, rule)} straddles the min gain "
        f"{mg}. {resolve['text']} {frame.ending}"
    )
    settle = resolve.get("settle") or "more evidence would settle it"
    if resolve.get("more_seeds") is not None and not resolve.get("settle"):
        priced = (
            f", {say_hours(resolve['gpu_hours'])} of GPU time"
            if resolve.get("gpu_hours") is not None
            else ""
        )
        settle = (
            f"about {resolve['more_examples']} more {rep} examples or {resolve['more_seeds']} "
            f"more seed(s){priced} would settle it"
        )
    noise = f", and {NOISE_NOT_MEASURED}" if resolve.get("training_noise") == "not measured" else ""
    answer = (
        f"Not yet: {improves}, an interval that straddles the min gain {mg}{noise}; {settle}. "
        "Verdict: inconclusive."
    )
    return frame.verdict("inconclusive", chosen, text, resolve=resolve, answer=answer)


def _noise_not_measured(
    frame: _Frame,
    chosen: str,
    *,
    improves: str,
    seconds: Mapping[str, float | None],
    lot: Mapping[str, float] | None,
) -> Verdict:
    """Inconclusive: the chosen variant's interval clears the min gain, but over one seed a
    side (or no interval at all), so training noise is not in it: a reseeded control could do
    as well. Proposes seeds, priced; never more examples alone."""
    rule, table = frame.rule, frame.table
    sel, rep, mg = rule.select_split, rule.report_split, say_exact(rule.min_gain)
    entry = table[chosen][rep]
    resolve = seeds_to_measure_noise(rule, chosen, entry=entry, seconds=seconds, lot=lot)
    if entry.get("gain_ci95") is None:
        missing = missing_interval(rule, entry)
        resolve = {**resolve, "missing": missing["missing"], "why": missing["why"]}
        resolve["text"] += f" {missing['text']}"
    picked = f"'{chosen}' is best on {sel} ({ci_text(table[chosen][sel], rule)})"
    text = (
        f"Inconclusive: {picked}; on {rep} its {ci_text(entry, rule)} clears the min gain {mg}, "
        f"but {NOISE_NOT_MEASURED}, so it is not adopted. {resolve['text']} {frame.ending}"
    )
    answer = (
        f"Not yet: {improves}, but {NOISE_NOT_MEASURED}; {resolve['settle']}. "
        "Verdict: inconclusive."
    )
    return frame.verdict("inconclusive", chosen, text, resolve=resolve, answer=answer)
