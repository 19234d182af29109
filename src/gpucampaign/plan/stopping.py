"""Which stop ends the campaign: the flow's answer to each stop its phases raised.

A stop of an optional run is recorded and the campaign goes on. A stop of an essential run
after it measured what the verdict needs (``core.stoprules.EVIDENCE_RULES``) is evidence: the
campaign goes on to its decision. Any other stop of an essential run ends the campaign, and so
does a failed restart check when the spec requires a verified restart. Before the runs, a stop
in an essential run's pilot re-poses the question and ends the campaign too.

Which part futility plays in a run's training calls (``futility_role``: the control records, a
variant checks) is decided here too, once: the engine's hook and the re-forecast follow it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from gpucampaign.config import CampaignSpec
from gpucampaign.core.stoprules import StopRule, stops_the_campaign

__all__ = [
    "FutilityRole",
    "StopEffect",
    "campaign_stop",
    "essential_pilot_stops",
    "futility_role",
    "stop_effect",
]

#: What a run's stop does: ``ends`` the campaign, is ``evidence`` for the verdict, or is only
#: ``recorded`` (an optional run).
StopEffect = Literal["ends", "evidence", "recorded"]

#: What futility does in a training call: the control ``record``s the selection split's
#: per-example scores at each evaluation, a variant ``check``s its own against them, or ``off``.
FutilityRole = Literal["record", "check", "off"]


def futility_role(spec: CampaignSpec, *, run: str, pilot: bool = False) -> tuple[FutilityRole, str]:
    """What futility does in a training call of ``run`` (``engine.futility``), from the spec:
    the one rule the hook, the pilot's probe of its looks and the re-forecast's count of them
    follow. With why it is off where a variant would have been checked (else "").

    The control records when futility is on and the spec has variants (someone compares with
    it); its seeds never look (they are never stopped as futile); a variant's full training
    call checks, not its pilot (``pilot``: never stopped there), nor a data-parallel run (rank
    0 alone evaluates: its stop would leave the other ranks in a collective). Whether the
    recipe scores per example is the engine's to add."""
    if spec.decision_rule is None:
        return "off", ""
    if run == "control":
        return ("record", "") if spec.stop_rules.futility and spec.variants else ("off", "")
    replicate = spec.replicate_of(run)
    if replicate is not None and replicate[0] == "control":
        return "off", ""
    if not spec.stop_rules.futility:
        return "off", "futility is off (stop_rules.futility: false)"
    if pilot:
        return "off", ""
    if spec.run_config(run).gpus > 1:
        return "off", "a data-parallel run (gpus > 1) is not checked"
    return "check", ""


def stop_effect(spec: CampaignSpec, *, run: str, stop: StopRule) -> StopEffect:
    """What the stop of ``run`` does to the campaign (see the module's docstring)."""
    if spec.tier_of(run) != "essential":
        return "recorded"
    return "ends" if stops_the_campaign(stop) else "evidence"


def campaign_stop(
    spec: CampaignSpec, *, run_stops: Mapping[str, StopRule], restart_stop: StopRule | None
) -> StopRule | None:
    """The stop that ends the campaign after its runs, or None when it goes on to its close.

    Args:
        spec: The campaign spec (tiers, ``stop_rules.require_restart``).
        run_stops: The stop each run raised, by run name (runs that did not stop are absent).
        restart_stop: The restart check's stop, if it raised one.

    Returns:
        The first essential run's stop that ends the campaign (in tier order), else the restart
        check's stop when a verified restart is required, else None.
    """
    for run in spec.runs_by_tier():
        stop = run_stops.get(run)
        if stop is not None and stop_effect(spec, run=run, stop=stop) == "ends":
            return stop
    if restart_stop is not None and spec.stop_rules.require_restart:
        return restart_stop
    return None


def essential_pilot_stops(
    spec: CampaignSpec, *, pilot_stops: Mapping[str, StopRule]
) -> list[tuple[str, StopRule]]:
    """The pilot stops of essential runs, in the pilots' order: with a re-posed question, the
    first of them is the stop that ends the campaign."""
    return [(run, stop) for run, stop in pilot_stops.items() if spec.tier_of(run) == "essential"]
