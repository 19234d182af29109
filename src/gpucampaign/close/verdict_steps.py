"""At which steps the verdict compares the runs, and which runs it may adopt.

A run keeps its last model, so each run is compared at the step it stopped at: a finished run
at its last step, an interrupted one at its last good model, a run stopped as futile at its
stop. The verdict states those steps; when a run's selection-split metric peaked earlier than
the step compared (a control that overfit), it says so and why it is not compared there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any, Protocol

from gpucampaign.close.verdict_words import say_value, stops_of
from gpucampaign.config import DecisionRule
from gpucampaign.core.gain_interval import holm, spread_from

#: The one-sided error of the verdict's adoption: the 95% interval's lower end.
ALPHA = 0.025


class _Stepped(Protocol):
    @property
    def step(self) -> int | None: ...
    @property
    def planned(self) -> int | None: ...
    @property
    def peak(self) -> tuple[int, float] | None: ...
    @property
    def futile(self) -> int | None: ...
    @property
    def early_rule(self) -> str: ...


def barred(evidence: Mapping[str, _Stepped]) -> dict[str, str]:
    """The variants the verdict never adopts, and why: a run stopped early, as futile or as
    not learning (its model is an unfinished run's, not a finished run's)."""
    return {
        name: f"stopped {_as(e)} at step {e.futile}{_of(e)}: never adopted, not a finished run"
        for name, e in evidence.items()
        if e.futile is not None
    }


def _as(e: _Stepped) -> str:
    return "as not learning" if e.early_rule == "not_learning" else "as futile"


def _of(e: _Stepped) -> str:
    return f" of {e.planned}" if e.planned else ""


def steps_compared(
    rule: DecisionRule, *, runs: Mapping[str, _Stepped]
) -> tuple[str, dict[str, dict[str, Any]]]:
    """The sentence naming the step each run is compared at (empty when no step is known),
    and the numbers: ``{run: {step, planned, peak_step, peak_value, futile}}``."""
    numbers: dict[str, dict[str, Any]] = {}
    parts = []
    for name, e in runs.items():
        if e.step is None:
            continue
        numbers[name] = {
            "step": e.step,
            "planned": e.planned,
            "peak_step": e.peak[0] if e.peak else None,
            "peak_value": e.peak[1] if e.peak else None,
            "futile": e.futile,
        }
        said = f"'{name}' at step {e.step}{_of(e)}"
        if e.futile is not None:
            said += f" (stopped {_as(e)} there)"
        if e.peak is not None and e.peak[0] != e.step:
            said += (
                f" (its best {rule.select_split} {rule.metric}, {say_value(e.peak[1], rule)}, "
                f"was at step {e.peak[0]}; a run keeps only its last model, so it is compared "
                f"at step {e.step})"
            )
        parts.append(said)
    if not parts:
        return "", numbers
    return f" Steps compared: {', '.join(parts)}.", numbers


def refuse_rejected(verdict: Any, *, rejected: Mapping[str, str]) -> Any:
    """The verdict, never adopting a run whose model is a rejected delivery (``rejected``: the
    reason per run name): such a verdict becomes inconclusive and says why, so no run is both
    rejected and adopted."""
    run = verdict.run
    if verdict.kind != "adopt" or run not in rejected:
        return verdict
    why = f"its model is a rejected delivery ({rejected[run]}), so it is not adopted"
    return replace(
        verdict,
        kind="inconclusive",
        text=f"Inconclusive: '{run}' clears the rule, but {why}. {verdict.text}",
        answer=f"Not yet: '{run}' clears the rule, but {why}. Verdict: inconclusive.",
        numbers={**verdict.numbers, "rejected_delivery": {"run": run, "reason": rejected[run]}},
    )


def futile_settled(
    rule: DecisionRule, never: Mapping[str, str], *, stops: Iterable[Mapping[str, Any]]
) -> dict[str, bool]:
    """Per variant stopped early, whether its stop shows it cannot win: a futility stop
    decided at its look's error-spending boundary (``reach``, the optimistic end read
    O'Brien-Fleming-wide: ``engine.futility.spending_factor``), not a tie, with that end under
    the min gain or not above 0; a ``not_learning`` stop (neither its loss nor its decision
    metric moved: a finding). A futility stop without the boundary (recorded at the plain
    interval, which a slow starter trails early by chance) settles nothing: the verdict is
    then inconclusive, naming it."""
    out = {}
    for name in never:
        settled = False
        for s in stops_of(name, stops, seeds=True):
            n = s.get("numbers") or {}
            reach = n.get("reach")
            if s.get("rule") == "not_learning":
                settled = True
            elif s.get("rule") == "futile" and isinstance(reach, int | float):
                settled = settled or (not n.get("tie") and (reach < rule.min_gain or reach <= 0))
        out[name] = settled
    return out


def futile_words(settled: Mapping[str, bool], runs: Mapping[str, _Stepped]) -> tuple[str, str]:
    """``(clause, unsettled)``: the clause that says which variants were stopped early
    (empty without one), and the names of those whose stop did not show they cannot win."""
    if not settled:
        return "", ""
    said = ", ".join(f"'{n}' {_as(runs[n])} at step {runs[n].futile}" for n in settled)
    open_ = [n for n, ok in settled.items() if not ok]
    how = "each stop shows it cannot win" if not open_ else "not finished runs"
    return f"; stopped early: {said} ({how})", ", ".join(repr(n) for n in open_)


def family(
    rule: DecisionRule,
    table: Mapping[str, Mapping[str, Any]],
    *,
    never: Mapping[str, str],
    alpha: float = ALPHA,
    look: int = 0,
) -> dict[str, Any]:
    """Holm's correction over every variant the verdict may adopt (those with an interval on
    the report split, not stopped early): whether Holm's step-down at 2.5% one-sided (the 95%
    interval's lower end) adopts each. With one variant it is the interval itself; with
    several, the chance that any variant without a real gain is adopted stays at most 2.5%
    (``docs/stop-rules-and-evidence.md``). After a round of seeds bought beyond the plan
    (``look`` above 0) the step-down runs at the error that look may spend (``alpha``:
    ``close.looks.look_alpha``).

    Returns:
        ``{variants, alpha, adoptable}``: ``adoptable`` by variant name.
    """
    gains = {}
    for name, row in table.items():
        entry = row[rule.report_split]
        spread = spread_from(entry)
        if name in never or spread is None or entry.get("gain") is None:
            continue
        gains[name] = (float(entry["gain"]), spread)
    adoptable = holm(gains, bar=rule.min_gain, alpha=alpha)
    out = {"variants": len(gains), "alpha": alpha, "adoptable": adoptable}
    return {**out, "look": look} if look else out


def refuse_uncorrected(verdict: Any, *, fam: Mapping[str, Any]) -> Any:
    """The verdict, never adopting a variant whose interval clears the bar on its own but not
    once corrected for the other variants judged with it (Holm): it becomes inconclusive and
    says so, with each variant's p-value in the numbers."""
    run = verdict.run
    if verdict.kind != "adopt" or fam["adoptable"].get(run, True):
        return verdict
    why = (
        f"with {fam['variants']} variants judged together its interval does not clear the "
        "min gain once corrected for them (Holm); more seeds would settle it"
    )
    if fam.get("look"):  # a look after a round of seeds: the error spent across the looks
        why = (
            f"after round {fam['look']} of seeds its interval does not clear the min gain at "
            f"the {100 * fam['alpha']:.3g}% one-sided error this look may spend (the error is "
            "spent across the looks)"
            + (
                f" with {fam['variants']} variants judged together (Holm)"
                if fam["variants"] > 1
                else ""
            )
        )
    return replace(
        verdict,
        kind="inconclusive",
        text=f"Inconclusive: '{run}' clears the rule on its own, but {why}. {verdict.text}",
        answer=f"Not yet: '{run}' clears the rule on its own, but {why}. Verdict: inconclusive.",
    )
