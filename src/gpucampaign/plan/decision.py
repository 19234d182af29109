"""The decision point after the pilot: pure functions, no orchestration.

The pilot measures what a run really costs here; the calendar is re-forecast from those
measurements (the original plan stays untouched) and the campaign either continues,
reduces itself (drops exploratory, then useful runs) until it fits, or re-poses the question.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator

from gpucampaign.config import CampaignSpec
from gpucampaign.core.text import say_hours
from gpucampaign.plan import calendar
from gpucampaign.plan.ranges import hours_range
from gpucampaign.plan.reforecast import reforecast_runs

Action = Literal["continue", "reduce", "re-pose"]
# Early curves closer than this (relative to the control's largest loss) count as the same.
LOW_INFO_RTOL = 1e-3


class DecisionInput(BaseModel):
    """What a person answers at the decision point (Prefect UI form in 'ask' mode)."""

    model_config = ConfigDict(extra="forbid")

    action: Action = Field(
        description="continue | reduce (drop the listed runs) | re-pose (stop here)"
    )
    drop: list[str] = Field(
        default_factory=list, description="Optional runs to drop (with 'reduce')."
    )
    note: str = Field(default="", description="Why: kept in decisions.jsonl.")

    @field_validator("drop")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("list each run to drop once")
        return v


class Decision(BaseModel):
    """The decision taken, with its inputs and reasons (one line of decisions.jsonl)."""

    model_config = ConfigDict(frozen=True)

    action: Action
    dropped_runs: list[str] = Field(default_factory=list)
    dropped_steps: list[str] = Field(default_factory=list)
    reasons: list[str] = Field(default_factory=list)
    by: Literal["auto", "person", "timeout"] = "auto"
    inputs: dict[str, Any] = Field(default_factory=dict)

    def summary(self) -> str:
        """One line: the action, who took it, why, and the runs dropped."""
        dropped = f" (dropped: {', '.join(self.dropped_runs)})" if self.dropped_runs else ""
        return f"{self.action} by {self.by}: {'; '.join(self.reasons)}{dropped}"

    @property
    def kept(self) -> bool:
        """False when the campaign stops here (re-pose)."""
        return self.action != "re-pose"


def check_decision_input(spec: CampaignSpec, answer: DecisionInput) -> None:
    """Refuse an answer that drops an essential run or names an unknown one.

    Raises:
        ValueError: naming the offending run and the fix.
    """
    known = spec.run_names()
    for run in answer.drop:
        if run not in known:
            raise ValueError(f"drop: '{run}' is not a run of this campaign; use some of {known}")
        if spec.tier_of(run) == "essential":
            raise ValueError(f"drop: '{run}' is essential and cannot be dropped; re-pose instead")
    if answer.action != "reduce" and answer.drop:
        raise ValueError(
            "drop: only the 'reduce' action drops runs; choose 'reduce' or empty the list"
        )


def decide_auto(
    *,
    fits_all: bool,
    reduced_fits: bool,
    reduced_dropped_runs: list[str],
    reduced_dropped_steps: list[str],
    pilot_stops: list[dict[str, Any]],
    essential_runs: list[str],
    span_hours: float,
    reduced_span_hours: float,
    window_hours: float,
) -> Decision:
    """The automatic rule: continue if it fits, reduce until it fits, else re-pose."""
    inputs = {
        "span_hours": round(span_hours, 6),
        "reduced_span_hours": round(reduced_span_hours, 6),
        "window_hours": window_hours,
        "pilot_stops": pilot_stops,
    }
    essential_stops = [s for s in pilot_stops if s.get("run") in essential_runs]
    if essential_stops:
        return Decision(
            action="re-pose",
            reasons=[
                f"the pilot of essential run '{s['run']}' tripped {s['rule']}: {s['reason']}"
                for s in essential_stops
            ],
            inputs=inputs,
        )
    if fits_all:
        return Decision(
            action="continue",
            reasons=[f"the re-forecast span {span_hours:.2f} h fits the {window_hours:g} h window"],
            inputs=inputs,
        )
    if reduced_fits:
        return Decision(
            action="reduce",
            dropped_runs=reduced_dropped_runs,
            dropped_steps=reduced_dropped_steps,
            reasons=[
                f"the re-forecast span {span_hours:.2f} h exceeds the {window_hours:g} h window",
                f"without {', '.join(reduced_dropped_steps)} it takes "
                f"{reduced_span_hours:.2f} h and fits",
            ],
            inputs=inputs,
        )
    return Decision(
        action="re-pose",
        reasons=[
            f"even the essential steps alone take {reduced_span_hours:.2f} h, more than the "
            f"{window_hours:g} h window: re-pose the question (smaller protocol or a longer lot)"
        ],
        inputs=inputs,
    )


def apply_answer(spec: CampaignSpec, *, answer: DecisionInput, auto: Decision) -> Decision:
    """Turn a person's validated answer into a Decision, keeping the automatic one as input."""
    check_decision_input(spec, answer)
    dropped_steps = [s.name for s in spec.calendar if s.run in answer.drop]
    reasons = [f"chosen by a person: {answer.note or 'no note'}"]
    if answer.action != auto.action:
        reasons.append(f"the automatic rule proposed '{auto.action}'")
    return Decision(
        action=answer.action,
        dropped_runs=list(answer.drop),
        dropped_steps=dropped_steps,
        reasons=reasons,
        by="person",
        inputs={**auto.inputs, "proposed": auto.model_dump(mode="json")},
    )


def early_losses(metrics: Sequence[Mapping[str, Any]], *, steps: int) -> list[float]:
    """The training losses of the first ``steps`` steps, in step order (a pilot's curve)."""
    by_step = {
        int(r["step"]): float(r["loss"])
        for r in metrics
        if r.get("kind") == "train" and r.get("loss") is not None and int(r["step"]) <= steps
    }
    return [by_step[k] for k in sorted(by_step)]


def low_information(
    pilot: Mapping[str, Mapping[str, Any]], *, rtol: float = LOW_INFO_RTOL
) -> list[str]:
    """Runs whose early loss curve cannot be told from the control's.

    Such a variant is, in effect, a copy of the control: running it in full teaches little
    that a control isolating one cause would not. Curves are compared over their common steps.
    """
    ref = list((pilot.get("control") or {}).get("early_losses") or [])
    out = []
    for run, m in pilot.items():
        curve = list(m.get("early_losses") or [])
        n = min(len(ref), len(curve))
        if run == "control" or n == 0:
            continue
        scale = max(1e-12, max(abs(x) for x in ref[:n]))
        if max(abs(a - b) for a, b in zip(ref[:n], curve[:n], strict=True)) <= rtol * scale:
            out.append(run)
    return out


@dataclass(frozen=True)
class Reforecast:
    """The automatic decision after the pilot, with the re-forecast it rests on."""

    decision: Decision
    hours: dict[str, tuple[float, str]]
    plan: Any  # calendar.Plan of every step with the re-forecast hours
    #: Per step, the parts its hours sum and the step they rest on (``RunForecast.record``).
    measured: dict[str, dict[str, Any]] = field(default_factory=dict)

    def hours_record(self) -> dict[str, dict[str, Any]]:
        """``{step: {hours, how, p10_hours, p90_hours}}``, as kept in ``decisions.jsonl``
        (the range: ``plan.ranges``, uncalibrated), with the parts the hours sum where the
        pilot measured them (``parts_s``, ``step_s``, ``steps``)."""
        out = {}
        for name, (h, how) in self.hours.items():
            p10, p90 = hours_range(h)
            out[name] = {"hours": h, "how": how, "p10_hours": p10, "p90_hours": p90}
            out[name] |= self.measured.get(name) or {}
        return out


def decide_after_pilot(
    spec: CampaignSpec,
    *,
    catalog: Any,
    pilot: dict[str, dict[str, Any]],
    pilot_stops: list[dict[str, Any]],
) -> Reforecast:
    """Re-forecast the calendar from the pilot, reduce it to fit if needed, decide automatically.

    Args:
        spec: the campaign.
        catalog: the ``tariffs.Catalog`` the calendar is priced with.
        pilot: pilot measurements per run name (``pilot_measures``).
        pilot_stops: stop records of the pilots that stopped (with their ``run``).
    """
    runs = reforecast_runs(spec, pilot=pilot)
    hours = {name: (f.hours, f.how) for name, f in runs.items()}
    override = {name: h for name, (h, _) in hours.items()}
    full = calendar.plan(spec, catalog=catalog, hours_override=override)
    reduced, dropped_steps = calendar.reduce_to_fit(spec, catalog=catalog, hours_override=override)
    dropped_runs = sorted({s.run for s in spec.calendar if s.name in dropped_steps and s.run})
    decision = decide_auto(
        fits_all=full.fits,
        reduced_fits=reduced.fits,
        reduced_dropped_runs=dropped_runs,
        reduced_dropped_steps=list(dropped_steps),
        pilot_stops=pilot_stops,
        essential_runs=spec.essential_runs(),
        span_hours=full.span_hours,
        reduced_span_hours=reduced.span_hours,
        window_hours=full.window_hours,
    )
    if decision.action != "re-pose":
        decision, tripped = _drop_tripped_runs(spec, decision, pilot_stops=pilot_stops)
        decision = _flag_low_information(decision, pilot=pilot, tripped=tripped)
    measured = {name: f.record() for name, f in runs.items()}
    return Reforecast(decision=decision, hours=hours, plan=full, measured=measured)


def _drop_tripped_runs(
    spec: CampaignSpec, decision: Decision, *, pilot_stops: list[dict[str, Any]]
) -> tuple[Decision, list[str]]:
    """Drop each optional run whose pilot tripped a stop rule (it cannot change the choice);
    returns the decision and the runs it drops for that."""
    stopped = {str(s["run"]) for s in pilot_stops if s.get("run")}
    tripped = sorted(
        {r for r in stopped if spec.tier_of(r) != "essential"} - set(decision.dropped_runs)
    )
    reasons = [
        f"optional run '{s['run']}' is dropped: its pilot tripped {s['rule']} ({s['reason']}), "
        "so it cannot change the choice"
        for s in pilot_stops
        if s.get("run") in tripped
    ]
    dropped = sorted({*decision.dropped_runs, *tripped})
    update = {
        "action": "reduce" if dropped else decision.action,
        "dropped_runs": dropped,
        "dropped_steps": sorted(
            {*decision.dropped_steps, *(s.name for s in spec.calendar if s.run in tripped)}
        ),
        "reasons": [*decision.reasons, *reasons],
    }
    return decision.model_copy(update=update), tripped


def _flag_low_information(
    decision: Decision, *, pilot: Mapping[str, Mapping[str, Any]], tripped: list[str]
) -> Decision:
    """Flag each variant whose early curve equals the control's as low information (unless it
    was dropped for its tripped pilot)."""
    flagged = [r for r in low_information(pilot) if r not in tripped]
    reasons = [
        f"low information: the early loss curve of '{r}' cannot be told from the control's "
        f"(within {LOW_INFO_RTOL:g} over {len(pilot[r].get('early_losses') or [])} steps); "
        "a variant that isolates one cause would teach more"
        for r in flagged
    ]
    update = {
        "reasons": [*decision.reasons, *reasons],
        "inputs": {**decision.inputs, "low_information": flagged},
    }
    return decision.model_copy(update=update)


def decision_markdown(
    decision: Decision,
    hours: Mapping[str, tuple[float, str]],
    *,
    pilot: Mapping[str, Mapping[str, Any]] | None = None,
) -> str:
    """The decision, the per-run re-forecast and the pilots' early losses as markdown (the UI
    shows it, as the decision artifact and as the description of the 'ask' form)."""
    lines = [f"# Decision after the pilot: **{decision.action}** ({decision.by})", ""]
    lines += [f"- {r}" for r in decision.reasons]
    if decision.dropped_runs:
        lines += ["", f"Dropped runs: {', '.join(decision.dropped_runs)}"]
    lines += ["", "| step | re-forecast | how |", "|---|---:|---|"]
    lines += [f"| {name} | {say_hours(h)} | {how} |" for name, (h, how) in hours.items()]
    curves = {r: m.get("early_losses") or [] for r, m in (pilot or {}).items()}
    if any(curves.values()):
        flagged = set(decision.inputs.get("low_information") or [])
        lines += [
            "",
            "| run | early losses (first, middle, last pilot step) | note |",
            "|---|---|---|",
        ]
        for run, c in curves.items():
            shown = ", ".join(f"{x:.4f}" for x in (c[0], c[len(c) // 2], c[-1])) if c else ""
            note = "low information: same curve as the control" if run in flagged else ""
            lines.append(f"| {run} | {shown} | {note} |")
    return "\n".join(lines)


def droppable_runs(spec: CampaignSpec) -> list[str]:
    """The runs a person may drop at the decision point: every non-essential run."""
    return [r for r in spec.run_names() if spec.tier_of(r) != "essential"]


def decision_form(spec: CampaignSpec, *, auto: Decision) -> type[BaseModel]:
    """The 'ask' form: the automatic proposal pre-selected, ``drop`` a choice among the
    droppable runs (never free text)."""
    choices = droppable_runs(spec) or ["(none)"]
    # A Literal of the runs known only at run time: no static type names it.
    drop_type: Any = list[Literal[tuple(choices)]]  # type: ignore[misc]
    return create_model(
        "DecisionInput",
        __config__=ConfigDict(extra="forbid"),
        action=(
            Action,
            Field(
                default=auto.action, description=DecisionInput.model_fields["action"].description
            ),
        ),
        drop=(
            drop_type,
            Field(
                default=[r for r in auto.dropped_runs if r in choices],
                description="Optional runs to drop (with 'reduce'); the essential runs cannot be.",
            ),
        ),
        note=(str, Field(default="", description="Why: kept in decisions.jsonl.")),
    )


def say_deadline(deadline: datetime) -> str:
    """A deadline as a person reads it on a form that stays open: a time, not a count of
    seconds that the page never updates."""
    return deadline.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def ask_description(decision_md: str, *, auto: Decision, deadline: datetime) -> str:
    """The form's markdown: the evidence, the proposal and when it is taken without an answer."""
    return (
        f"{decision_md}\n\n**Proposed: {auto.action}** (pre-selected below). Without an answer "
        f"by {say_deadline(deadline)} the proposal is taken. `drop` takes effect with `reduce`."
    )


def on_timeout(auto: Decision, *, why: str) -> Decision:
    """The automatic decision, taken because no valid answer came in time."""
    return auto.model_copy(update={"by": "timeout", "reasons": [*auto.reasons, why]})
