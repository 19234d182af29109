"""The decision point after the pilot (R3): automatic, or asked of a person in the Prefect UI."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.context import FlowRunContext
from prefect.exceptions import FlowPauseTimeout
from prefect.flow_runs import pause_flow_run

from gpucampaign import calendar
from gpucampaign.decision import (
    Decision,
    DecisionInput,
    apply_answer,
    decide_auto,
    reforecast_hours,
)
from gpucampaign.files import utc_now
from gpucampaign.spec import CampaignSpec
from tasks._common import artifact_key, busy, out_folder


def decision_point(
    spec: CampaignSpec,
    *,
    catalog: Any,
    pilot: dict[str, dict[str, Any]],
    pilot_stops: list[dict[str, Any]],
    mode: str,
    out: str,
) -> Decision:
    """Re-forecast, decide, record the decision (decisions.jsonl + a UI artifact) and return it.

    A decision already recorded in the output folder is reused: a rerun repeats nothing.
    """
    logger = get_run_logger()
    folder = out_folder(out)
    previous = [d for d in folder.read_jsonl("decisions.jsonl") if d.get("point") == "after-pilot"]
    if previous:
        logger.info("decision point: reusing the decision already taken")
        return Decision.model_validate(previous[-1]["decision"])

    # The decision is a calendar step of its own: a person's wait in 'ask' mode is observed time.
    with busy(folder, spec, phase="decide", kind="human" if mode == "ask" else "machine",
              note=f"decision by {mode}"):
        decision, forecast, full = _decide(spec, catalog=catalog, pilot=pilot, pilot_stops=pilot_stops,
                                           mode=mode)
    record = {
        "point": "after-pilot",
        "time": utc_now(timespec="seconds"),
        "decision": decision.model_dump(mode="json"),
        "reforecast": {name: {"hours": h, "how": how} for name, (h, how) in forecast.items()},  # plan: reforecast.json
    }
    folder.append_jsonl("decisions.jsonl", record)
    folder.write_json("reforecast.json", full.to_dict())
    logger.info("decision point: %s by %s: %s%s", decision.action, decision.by, "; ".join(decision.reasons),
                f" (dropped: {', '.join(decision.dropped_runs)})" if decision.dropped_runs else "")
    create_markdown_artifact(
        markdown=_markdown(decision, forecast),
        key=artifact_key("decision", spec.name),
        description=f"Decision after the pilot: {decision.action}",
    )
    return decision


def _decide(
    spec: CampaignSpec, *, catalog: Any, pilot: dict[str, dict[str, Any]], pilot_stops: list[dict[str, Any]],
    mode: str,
) -> tuple[Decision, dict[str, tuple[float, str]], Any]:
    """Re-forecast the calendar from the pilot and take the decision (automatic or asked)."""
    forecast = reforecast_hours(spec, pilot=pilot)
    override = {name: h for name, (h, _) in forecast.items()}
    full = calendar.plan(spec, catalog=catalog, hours_override=override)
    reduced, dropped_steps = calendar.reduce_to_fit(spec, catalog=catalog, hours_override=override)
    dropped_runs = sorted({s.run for s in spec.calendar if s.name in dropped_steps and s.run})
    auto = decide_auto(
        fits_all=full.fits,
        reduced_fits=reduced.fits,
        reduced_dropped_runs=dropped_runs,
        reduced_dropped_steps=list(dropped_steps),
        pilot_stops=pilot_stops,
        essential_runs=[r for r in spec.run_names() if spec.tier_of(r) == "essential"],
        span_hours=full.span_hours,
        reduced_span_hours=reduced.span_hours,
        window_hours=full.window_hours,
    )
    decision = auto
    if mode == "ask":
        decision = _ask(spec, auto=auto, timeout_s=spec.decision_point.timeout_s)
    return decision, forecast, full


def _ask(spec: CampaignSpec, *, auto: Decision, timeout_s: int) -> Decision:
    logger = get_run_logger()
    logger.warning(
        "decision point: waiting up to %ss for a person in the Prefect UI; proposed: %s (%s)",
        timeout_s, auto.action, "; ".join(auto.reasons),
    )
    try:
        answer = pause_flow_run(wait_for_input=DecisionInput, timeout=timeout_s, poll_interval=2)
    except FlowPauseTimeout:
        _resume_self()
        return auto.model_copy(update={"by": "timeout", "reasons": [*auto.reasons, "no answer in time"]})
    try:
        return apply_answer(spec, answer=answer, auto=auto)
    except ValueError as exc:
        logger.error("decision point: the answer was refused (%s); taking the automatic choice", exc)
        return auto.model_copy(update={"by": "timeout", "reasons": [*auto.reasons, f"answer refused: {exc}"]})


def _resume_self() -> None:
    """After a pause timed out, put the flow run back to Running so the campaign goes on."""
    from prefect.client.orchestration import get_client
    from prefect.states import Running

    ctx = FlowRunContext.get()
    assert ctx is not None and ctx.flow_run is not None
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(ctx.flow_run.id, Running(), force=True)


def _markdown(decision: Decision, forecast: dict[str, tuple[float, str]]) -> str:
    lines = [f"# Decision after the pilot: **{decision.action}** ({decision.by})", ""]
    lines += [f"- {r}" for r in decision.reasons]
    if decision.dropped_runs:
        lines += ["", f"Dropped runs: {', '.join(decision.dropped_runs)}"]
    lines += ["", "| step | re-forecast hours | how |", "|---|---:|---|"]
    lines += [f"| {name} | {h:.4f} | {how} |" for name, (h, how) in forecast.items()]
    return "\n".join(lines)
