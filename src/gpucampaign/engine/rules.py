"""The stop rules that watch a training call, as hooks (``engine/hooks.py``).

``non_finite_loss``: a step's training loss is NaN or infinite (checked when the waiting losses
are fetched: the stop names the first non-finite step, and since a checkpoint snapshot fetches
them first, no checkpoint ever holds a step after it). On a data-parallel run the loop also
checks the all-reduced loss of every step before its backward pass (``engine/loop.py``).

``below_threshold``: the run's final decision metric on the selection split misses the quality
floor (``stop_rules.quality_floor``, else the decision rule's threshold).

The futility rule is in ``engine/futility.py``.
"""

from __future__ import annotations

import math
from typing import Any

from gpucampaign.core.stoprules import BelowThreshold, NonFiniteLoss
from gpucampaign.core.text import say_exact, say_number
from gpucampaign.engine.hooks import Hook, HookArgs
from gpucampaign.engine.setup import LiveRun
from gpucampaign.spec import CampaignSpec


class NonFiniteLossRule(Hook):
    """``stop_rules.non_finite_loss``: stop at the first step whose training loss is not finite."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id

    @classmethod
    def for_run(cls, r: LiveRun, args: HookArgs) -> NonFiniteLossRule | None:
        """The rule of this run, or None when it is off."""
        return cls(r.run_id) if r.spec.stop_rules.non_finite_loss else None

    def on_train_row(self, row: dict[str, Any]) -> None:
        """Raises: NonFiniteLoss: The row's loss is NaN or infinite."""
        loss = row.get("loss")
        if isinstance(loss, float) and not math.isfinite(loss):
            raise NonFiniteLoss(
                self.run_id,
                f"training loss is {loss} at step {row['step']} (epoch {row['epoch']}, "
                f"lr {row['lr']:g}); the last checkpoint precedes it",
                step=row["step"],
            )


class QualityFloor(Hook):
    """``stop_rules.below_threshold``: the run's final metric misses the floor."""

    def __init__(self, r: LiveRun) -> None:
        self.r = r

    @classmethod
    def for_run(cls, r: LiveRun, args: HookArgs) -> QualityFloor | None:
        """The floor of this run, or None when the rule is off (or there is no decision rule)."""
        if r.spec.decision_rule is None or not r.spec.stop_rules.below_threshold:
            return None
        return cls(r)

    def at_end(self, metrics: dict[str, float]) -> BelowThreshold | None:
        r = self.r
        return quality_stop(r.spec, r.run_id, metrics, step=r.state.global_step)


def quality_stop(
    spec: CampaignSpec, run_id: str, metrics: dict[str, float], *, step: int
) -> BelowThreshold | None:
    """The stop when the decision metric misses the quality floor, when that rule is on."""
    rule = spec.decision_rule
    if rule is None or not spec.stop_rules.below_threshold:
        return None
    floor = (
        spec.stop_rules.quality_floor
        if spec.stop_rules.quality_floor is not None
        else rule.threshold
    )
    value = metrics.get(rule.metric, math.nan)
    meets = value >= floor if rule.direction == "maximize" else value <= floor
    if meets:
        return None
    side = "below the floor" if rule.direction == "maximize" else "above the ceiling"
    return BelowThreshold(
        run_id,
        f"final {rule.metric} on {rule.select_split} is {say_number(value, against=floor)}, "
        f"{side} {say_exact(floor)}",
        step=step,
    )
