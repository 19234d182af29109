"""The decision point after the pilot: automatic, or asked of a person in the Prefect UI."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.context import FlowRunContext
from prefect.exceptions import FlowPauseTimeout
from prefect.flow_runs import pause_flow_run
from prefect.input import RunInput

from gpucampaign.config import CampaignSpec
from gpucampaign.folder.records import (
    decision_after_pilot,
    read_decisions,
    record_decision_after_pilot,
)
from gpucampaign.plan.decision import (
    Decision,
    DecisionInput,
    Reforecast,
    apply_answer,
    ask_description,
    decide_after_pilot,
    decision_form,
    decision_markdown,
    droppable_runs,
    on_timeout,
    say_deadline,
)
from gpucampaign_prefect.orchestration import notify
from gpucampaign_prefect.orchestration.phases import TASK_OPTIONS, artifact_key, busy, out_folder


@task(name="decision-point", task_run_name="decision-point[{mode}]", **TASK_OPTIONS)
def propose(
    spec: CampaignSpec,
    *,
    catalog: Any,
    pilot: dict[str, dict[str, Any]],
    pilot_stops: list[dict[str, Any]],
    mode: str,
) -> Reforecast:
    """The decision point's node in the UI: the re-forecast from the pilot and the automatic
    decision (a person's answer, in 'ask' mode, is waited for by the flow: a task cannot
    pause it)."""
    return decide_after_pilot(spec, catalog=catalog, pilot=pilot, pilot_stops=pilot_stops)


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
        refo = propose(spec, catalog=catalog, pilot=pilot, pilot_stops=pilot_stops, mode=mode)
        decision = refo.decision
        if mode == "ask":
            evidence = decision_markdown(decision, refo.hours, pilot=pilot)
            decision = _ask(spec, auto=decision, evidence=evidence, campaign_id=campaign_id)
    record_decision_after_pilot(folder.root, decision, reforecast=refo)
    logger.info("decision point: %s", decision.summary())
    create_markdown_artifact(
        markdown=f"Output folder: `{folder.root}`\n\n"
        + decision_markdown(decision, refo.hours, pilot=pilot),
        key=artifact_key("decision", spec.name, campaign_id),
        description=f"Decision after the pilot: {decision.action} ({folder.root})",
    )
    return decision


def ask_until_valid(
    ask: Callable[[str, int], Any | None],
    *,
    check: Callable[[Any], Decision],
    timeout_s: float,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[Decision | None, list[str]]:
    """Ask until an answer passes ``check``, within ``timeout_s`` in all.

    ``ask(refused, seconds_left)`` shows the form (with why the last answer was refused, ''
    the first time) and returns the answer, or None when no answer came in time; ``check``
    turns an answer into a Decision or raises ``ValueError`` with the reason.

    Returns:
        ``(decision, refusals)``: the decision is None when the time ran out.
    """
    deadline = clock() + timeout_s
    refusals: list[str] = []
    while (left := int(deadline - clock())) >= 1:
        got = ask(refusals[-1] if refusals else "", left)
        if got is None:
            break
        try:
            return check(got), refusals
        except ValueError as exc:
            refusals.append(str(exc))
    return None, refusals


def _ask(spec: CampaignSpec, *, auto: Decision, evidence: str, campaign_id: str = "") -> Decision:
    logger = get_run_logger()
    timeout_s = spec.decision_point.timeout_s
    logger.warning(
        "decision point: waiting up to %ss for a person in the Prefect UI; proposed: %s (%s)",
        timeout_s,
        auto.action,
        "; ".join(auto.reasons),
    )
    notify.decision_waiting(
        campaign=campaign_id or spec.name,
        name=spec.name,
        proposal=auto.action,
        reasons=list(auto.reasons),
        timeout_s=timeout_s,
    )
    # A RunInput subclass built at run time from DecisionInput: action, drop, note.
    base = RunInput.subclass_from_base_model_type(decision_form(spec, auto=auto))

    def ask(refused: str, left: int) -> Any | None:
        deadline = datetime.now(UTC) + timedelta(seconds=left)
        description = ask_description(evidence, auto=auto, deadline=deadline)
        if refused:
            logger.warning("decision point: answer refused (%s); asking again", refused)
            description = (
                f"**Your answer was refused: {refused}.** Answer again (or wait: the proposal "
                f"is taken at {say_deadline(deadline)}).\n\n{description}"
            )
        form = base.with_initial_data(
            description=description,
            action=auto.action,
            drop=[r for r in auto.dropped_runs if r in droppable_runs(spec)],
        )
        try:
            return pause_flow_run(wait_for_input=form, timeout=left, poll_interval=2)
        except FlowPauseTimeout:
            _resume_self()
            return None

    def check(got: Any) -> Decision:
        answer = DecisionInput(
            action=got.action, drop=[r for r in got.drop if r != "(none)"], note=got.note
        )
        return apply_answer(spec, answer=answer, auto=auto)

    decision, refusals = ask_until_valid(ask, check=check, timeout_s=timeout_s)
    if decision is not None:
        return decision
    why = "no answer in time"
    if refusals:
        why = f"no valid answer in time (refused: {'; '.join(refusals)})"
    logger.error("decision point: %s; taking the automatic choice", why)
    return on_timeout(auto, why=why)


def _resume_self() -> None:
    """After a pause timed out, put the flow run back to Running so the campaign goes on."""
    # the client only when a pause timed out
    from prefect.client.orchestration import get_client
    from prefect.states import Running

    ctx = FlowRunContext.get()
    assert ctx is not None and ctx.flow_run is not None
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(ctx.flow_run.id, Running(), force=True)


class RoundAnswer(RunInput):
    """A person's answer to a round of seeds beyond the plan."""

    buy: bool = True
    note: str = ""


def ask_round(
    spec: CampaignSpec, *, text: str, why: str, campaign_id: str = ""
) -> tuple[bool, str]:
    """'ask' mode: whether a person buys a round of seeds beyond the plan, shown its price as
    a share of the lot and the verdict that asks for it; the proposal (buy) is taken when no
    answer comes within ``decision_point.timeout_s``.

    Returns:
        ``(bought, by)``: ``by`` is 'person' or 'timeout'.
    """
    logger = get_run_logger()
    timeout_s = spec.decision_point.timeout_s
    logger.warning("decision point: waiting up to %ss for a person: buy %s?", timeout_s, text)
    notify.decision_waiting(
        campaign=campaign_id or spec.name,
        name=spec.name,
        proposal=f"buy {text}",
        reasons=[why],
        timeout_s=timeout_s,
    )
    deadline = datetime.now(UTC) + timedelta(seconds=timeout_s)
    description = (
        f"The verdict is not yet settled: {why}\n\n**Proposed: buy {text}** (`buy` is "
        f"pre-selected below). Without an answer by {say_deadline(deadline)} the round is bought."
    )
    try:
        got = pause_flow_run(
            wait_for_input=RoundAnswer.with_initial_data(description=description, buy=True),
            timeout=timeout_s,
            poll_interval=2,
        )
    except FlowPauseTimeout:
        _resume_self()
        logger.error("decision point: no answer in time; buying the round as proposed")
        return True, "timeout"
    return bool(got.buy), "person"
