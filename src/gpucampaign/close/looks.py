"""The looks of a campaign that buys rounds of seeds: the spec as its rounds made it, and the
error each look of the verdict may spend.

A campaign decides once after its planned runs (the first look) and, while the verdict is
inconclusive, may buy up to ``decision_point.rounds`` rounds of seeds and decide again after
each (``close.rounds``); a person may also extend the campaign in place with more seeds
(``preflight.extension``), and its verdict is another look. Deciding again on growing evidence
raises the chance of adopting a variant without a real gain, so the error is spent across the
looks: the first look keeps the 95% interval's 2.5% one-sided (a campaign that buys no round
decides as before), and the ``j``-th look after it may spend 2.5% / 2^j (1.25%, 0.625%, ...).
By the union bound the chance of adopting a variant without a real gain over all the looks is
at most 2.5% + 2.5% = 5% however many looks there are and whatever their correlation (the
simulation in ``tests/close/test_calibration_sim.py`` measures it under that).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpucampaign.close.verdict_steps import ALPHA
from gpucampaign.core.files import read_jsonl
from gpucampaign.core.text import say_hours, say_number
from gpucampaign.folder.layout import SPEC_HISTORY
from gpucampaign.folder.records import RoundRecord, read_rounds


def look_alpha(look: int) -> float:
    """The one-sided error the verdict spends at ``look`` (0: the planned runs; ``j``: after
    the ``j``-th round of seeds or extension): 2.5%, then 2.5% / 2^j."""
    return ALPHA if look <= 0 else ALPHA / 2**look


def looks_taken(root: str | Path) -> int:
    """The folder's look: the rounds of seeds its campaign bought and the times it was
    extended in place (``spec-history.jsonl``), each a decision on more evidence."""
    extended = len(read_jsonl(Path(root) / SPEC_HISTORY))
    return sum(1 for r in read_rounds(root) if r.bought) + extended


def seeds_to_buy(verdict: Any, *, have: int) -> int | None:
    """How many more seeds a side a round would buy for ``verdict`` (``close.verdict.Verdict``)
    whose contenders have ``have`` seeds a side: the count its advice names when it is
    inconclusive with a variant chosen; as many again when the variant cleared the bar on its
    own but not at the error this look may spend (or not once corrected for the other variants);
    None when the verdict is settled or seeds alone cannot settle it."""
    if verdict.kind != "inconclusive" or verdict.run in (None, "control"):
        return None
    if verdict.resolve:
        more = verdict.resolve.get("more_seeds")
        return int(more) if more else None
    fam = (verdict.numbers or {}).get("family") or {}
    refused = (fam.get("adoptable") or {}).get(verdict.run) is False
    return max(1, have) if refused else None


def round_text(record: RoundRecord, *, bound: int) -> str:
    """A round in words, with its price as a share of the lot (never an hourly rate)."""
    new = sorted({int(r.rpartition(".s")[2]) for r in record.runs})
    bases = sorted({r.rpartition(".s")[0] for r in record.runs}, key=lambda b: b != "control")
    price = ""
    if record.gpu_hours is not None:
        price = f", measured {say_hours(record.gpu_hours)} of GPU time"
        if record.lot_share is not None:
            price += f" ({say_number(100 * record.lot_share, digits=2)}% of the lot)"
    return (
        f"round {record.round} of {bound}: {len(new)} more seed(s) ({', '.join(map(str, new))}) "
        f"of {' and '.join(repr(b) for b in bases)}{price}"
    )
