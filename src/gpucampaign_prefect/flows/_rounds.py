"""The rounds of seeds the campaign buys beyond its plan (``close.rounds`` proposes them):
each trained as normal runs (same lanes' GPU lock, checkpoints, restart safety), then the
verdict decided again, up to the spec's ``decision_point.rounds``."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from prefect import allow_failure, get_run_logger

from gpucampaign.close.looks import round_text
from gpucampaign.close.rounds import propose_round
from gpucampaign.config import CampaignSpec
from gpucampaign.core.stoprules import StopRule
from gpucampaign.folder.layout import OutputFolder
from gpucampaign.folder.records import (
    append_round,
    decision_after_pilot,
    read_decisions,
    read_rounds,
    run_states,
    runs_with_model,
    spec_with_rounds,
)
from gpucampaign_prefect.orchestration.phases import busy, stop_of
from gpucampaign_prefect.tasks.decide import ask_round
from gpucampaign_prefect.tasks.predict import predictions
from gpucampaign_prefect.tasks.train import train


def buy_rounds(
    cs: CampaignSpec,
    *,
    catalog: Any,
    folder: OutputFolder,
    common: dict[str, str],
    mode: str,
    campaign_id: str,
) -> dict[str, dict[str, Any]]:
    """Train the rounds a rerun finds recorded but unfinished, then buy rounds while
    ``propose_round`` proposes one ('ask': a person says yes or no to each, with its price).

    Returns:
        The error analyses of the rounds' runs, by run name (the close's ``analyses``).
    """
    logger = get_run_logger()
    bound = cs.decision_point.rounds
    analyses: dict[str, dict[str, Any]] = {}
    earlier = [r for r in read_rounds(folder.root) if r.bought]
    if earlier:  # a rerun: what the recorded rounds still lack (finished runs return at once)
        analyses |= _train_round(cs, runs=[r for e in earlier for r in e.runs], common=common)
    while True:
        record, why = propose_round(cs, root=folder.root, catalog=catalog)
        if record is None:
            if bound > 0:
                logger.info("no more rounds of seeds: %s", why)
            return analyses
        said = round_text(record, bound=bound)
        # The round's decision is a step of the timeline: a person's wait in 'ask' mode.
        kind = "human" if mode == "ask" else "machine"
        with busy(folder, cs, phase="decide", kind=kind, note=f"buy {said}"):
            if mode == "ask":
                bought, by = ask_round(cs, text=said, why=record.why, campaign_id=campaign_id)
                record = replace(record, bought=bought, by=by)
            append_round(folder.root, record)  # before its runs: a rerun trains what it lacks
        if not record.bought:
            logger.warning("declined (%s): %s", record.by, said)
            return analyses
        logger.warning("the verdict is not yet settled; buying %s", said)
        analyses |= _train_round(cs, runs=record.runs, common=common)


def _train_round(
    cs: CampaignSpec, *, runs: list[str], common: dict[str, str]
) -> dict[str, dict[str, Any]]:
    """Train ``runs`` one after the other on lane 0 under the GPU lock, then their
    predictions; a stop is recorded by its task and said here."""
    logger = get_run_logger()
    eff = spec_with_rounds(cs, common["out"])
    tail: Any = None
    futures = {}
    for run in runs:
        wait = [allow_failure(tail)] if tail is not None else None
        futures[run] = tail = train.submit(
            eff, run=run, lane=0, return_state=False, wait_for=wait, **common
        )
    for run, fut in futures.items():
        try:
            stop = stop_of(fut.result())
        except StopRule as exc:
            stop = exc
        if stop is not None:
            logger.warning("run '%s' of a round of seeds stopped and is recorded: %s", run, stop)
    decision = decision_after_pilot(read_decisions(common["out"]))
    states = run_states(eff, root=common["out"], decision=decision)
    with_model = [r for r in runs_with_model(states, root=common["out"]) if r in runs]
    return predictions(eff, runs=with_model, **common) if with_model else {}
