"""The decision point after the pilot: automatic, or asked of a person in the Prefect UI."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.context import FlowRunContext
from prefect.exceptions import FlowPauseTimeout
from prefect.flow_runs import pause_flow_run
from prefect.input import RunInput

from gpucampaign.folder.records import (
    decision_after_pilot,
    read_decisions,
    record_decision_after_pilot,
)
from gpucampaign.plan.decision import (
    Decision,
    DecisionInput,
    apply_answer,
    ask_description,
    decide_after_pilot,
    decision_form,
    decision_markdown,
    droppable_runs,
    on_timeout,
)
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
    campaign_id: str = "",
) -> Decision:
    """Re-forecast, decide, record the decision (decisions.jsonl + a UI artifact) and return it.

    A decision already recorded in the output folder is reused: a rerun repeats nothing.
    """
    logger = get_run_logger()
    folder = out_folder(out)
    previous = decision_after_pilot(read_decisions(folder.root))
    if previous is not None:
        logger.info("decision point: reusing the decision already taken")
        return previous
    # The decision is a calendar step of its own: a person's wait in 'ask' mode is observed time.
    kind = "human" if mode == "ask" else "machine"
    with busy(folder, spec, phase="decide", kind=kind, note=f"decision by {mode}"):
        refo = decide_after_pilot(spec, catalog=catalog, pilot=pilot, pilot_stops=pilot_stops)
        decision = refo.decision
        if mode == "ask":
            evidence = decision_markdown(decision, refo.hours, pilot=pilot)
            decision = _ask(spec, auto=decision, evidence=evidence)
    record_decision_after_pilot(folder.root, decision, reforecast=refo)
    logger.info("decision point: %s", decision.summary())
    create_markdown_artifact(
        markdown=f"Output folder: `{folder.root}`\n\n"
        + decision_markdown(decision, refo.hours, pilot=pilot),
        key=artifact_key("decision", spec.name, campaign_id),
        description=f"Decision after the pilot: {decision.action} ({folder.root})",
    )
    return decision


def _ask(spec: CampaignSpec, *, auto: Decision, evidence: str) -> Decision:
    logger = get_run_logger()
    timeout_s = spec.decision_point.timeout_s
    logger.warning(
        "decision point: waiting up to %ss for a person in the Prefect UI; proposed: %s (%s)",
        timeout_s,
        auto.action,
        "; ".join(auto.reasons),
    )
    form = RunInput.subclass_from_base_model_type(decision_form(spec, auto=auto))
    form = form.with_initial_data(
        description=ask_description(evidence, auto=auto, timeout_s=timeout_s),
        action=auto.action,
        drop=[r for r in auto.dropped_runs if r in droppable_runs(spec)],
    )
    try:
        # A RunInput subclass built at run time from DecisionInput: action, drop, note.
        got: Any = pause_flow_run(wait_for_input=form, timeout=timeout_s, poll_interval=2)
    except FlowPauseTimeout:
        _resume_self()
        return on_timeout(auto, why="no answer in time")
    try:
        answer = DecisionInput(
            action=got.action, drop=[r for r in got.drop if r != "(none)"], note=got.note
        )
        return apply_answer(spec, answer=answer, auto=auto)
    except ValueError as exc:
        logger.error(
            "decision point: the answer was refused (%s); taking the automatic choice", exc
        )
        return on_timeout(auto, why=f"answer refused: {exc}")


def _resume_self() -> None:
    """After a pause timed out, put the flow run back to Running so the campaign goes on."""
    from prefect.client.orchestration import get_client
    from prefect.states import Running

    ctx = FlowRunContext.get()
    assert ctx is not None and ctx.flow_run is not None
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(ctx.flow_run.id, Running(), force=True)
