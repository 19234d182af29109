"""The rounds of seeds a campaign buys beyond its plan while its verdict is inconclusive.

After the planned runs the verdict may say "not yet" and name the seeds that would settle it.
When it does, and another round of those seeds for the contenders (the chosen variant and the
control, nothing else) fits the lot's spare GPU time with its margin, the campaign trains that
round and decides again, up to ``decision_point.rounds`` rounds. Each look spends its share of
the error (``close.looks``), so deciding again never raises the chance of adopting a variant
without a real gain above 5% over all the looks. Pure functions of the output folder; the flow
(``gpucampaign_prefect/flows/_rounds.py``) trains what they propose.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gpucampaign.close.closing import folder_verdict
from gpucampaign.close.evidence import lot_price, run_evidence
from gpucampaign.close.looks import looks_taken, seeds_to_buy
from gpucampaign.config import CampaignSpec
from gpucampaign.core.errors import InputError
from gpucampaign.core.files import utc_now
from gpucampaign.core.text import say_hours
from gpucampaign.folder.records import RoundRecord, read_plan, read_rounds, spec_with_rounds

#: A round is bought only when this many times its measured training time fits the spare GPU
#: time: the margin for its restarts, its predictions and the lot's end.
ROUND_MARGIN = 2.0


def propose_round(
    spec: CampaignSpec, *, root: str | Path, catalog: Any = None
) -> tuple[RoundRecord | None, str]:
    """The next round of seeds the folder's campaign should buy, or None and why not.

    A round is proposed while the verdict (at the look the rounds bought so far reached) is
    inconclusive with a variant chosen, more seeds of it and the control would settle it (the
    verdict's advice names them; a variant that cleared the bar alone but not at the error this
    look may spend gets as many seeds again as it has), the spec's bound on rounds is not
    reached, no person declined one, and ``ROUND_MARGIN`` times its measured training time fits
    the plan's spare GPU time less what earlier rounds took.
    """
    bound, taken = spec.decision_point.rounds, looks_taken(root)
    recorded = read_rounds(root)
    if bound <= 0:
        return None, "the spec buys no round of seeds (decision_point.rounds: 0)"
    if taken >= bound:
        return None, f"the {bound} round(s) of seeds the spec allows were bought"
    if any(not r.bought for r in recorded):
        return None, "a person declined a round of seeds"
    states, verdict = folder_verdict(spec, root=root, catalog=catalog)
    chosen = verdict.run
    if verdict.kind != "inconclusive" or chosen is None or chosen == "control":
        return None, f"the verdict is {verdict.kind} with no variant to settle"
    eff = spec_with_rounds(spec, root)
    evidence = run_evidence(eff, root=root, states=states)
    have = {b: _seeds(eff, b) for b in ("control", chosen)}
    more = seeds_to_buy(verdict, have=min(len(s) for s in have.values()))
    if not more:
        return None, "more seeds alone would not settle it (the verdict's advice)"
    times = [evidence[b].train_s if b in evidence else None for b in have]
    if any(t is None for t in times):
        return None, "a contender's training time was not measured: the round cannot be priced"
    hours = int(more) * sum(float(t or 0.0) for t in times) / 3600
    plan = read_plan(root)
    spare = (plan.spare_gpu_hours if plan else None) or 0.0
    spare -= sum(r.gpu_hours or 0.0 for r in recorded if r.bought)
    if ROUND_MARGIN * hours > spare:
        return None, (
            f"the round ({say_hours(hours)} of GPU time, {ROUND_MARGIN:g} x with its margin) "
            f"does not fit the lot's {say_hours(max(0.0, spare))} of spare GPU time"
        )
    top = max(max(s) for s in have.values())
    new = list(range(top + 1, top + 1 + int(more)))
    seeds = {b: [*s, *new] for b, s in have.items()}
    try:
        eff.with_seeds(seeds)
    except (ValidationError, InputError) as exc:
        return None, f"the round's seeds do not fit the spec: {exc}"
    lot = lot_price(spec, catalog=catalog)
    share = hours / lot["gpu_hours"] if lot and lot.get("gpu_hours") else None
    record = RoundRecord(
        round=taken + 1,
        seeds=seeds,
        runs=[f"{b}.s{k}" for b in have for k in new],
        gpu_hours=round(hours, 12),
        lot_share=None if share is None else round(share, 12),
        why=verdict.answer,
        time=utc_now(timespec="seconds"),
    )
    return record, ""


def _seeds(spec: CampaignSpec, base: str) -> list[int]:
    """Every seed of a base run: its replicate seeds, or its own seed alone."""
    return list(spec.seeds_of(base)) or [spec.run_config(base).seed]
