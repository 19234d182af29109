"""The stop rules that watch a training call, as hooks (``engine/hooks.py``).

``non_finite_loss``: a step's training loss is NaN or infinite (checked when the waiting losses
are fetched: the stop names the first non-finite step, and since a checkpoint snapshot fetches
them first, no checkpoint ever holds a step after it). On a data-parallel run the loop also
checks the all-reduced loss of every step before its backward pass (``engine/loop.py``).

``below_threshold``: the run's final decision metric on the selection split misses the quality
floor (``stop_rules.quality_floor``, else the decision rule's threshold).

``not_learning``: a variant whose training loss is not below its start after the grace, and
whose decision metric (when its evaluations report it) is no better than at its first
evaluation: a loss with a scheduled term (a regulariser ramped up) may rise while the model
gets better at what it is for, and such a run learns. At each
evaluation of its full training call (never in the pilot, never at its last step) from the
grace on (``stop_rules.grace`` of its planned steps, and at least two windows), the mean
training loss over its last ``window`` steps is compared with the mean over its first
``window`` steps; ``window`` is one epoch when the run plans two or more, else half the grace.
Unless the recent mean is below the start by more than ``LEARNING_TOLERANCE`` of it, the run
does not learn: the rule asks the loop to stop it as it stops a futile run (its step saved, its
model evaluated and kept as evidence, ``NotLearning`` raised: ``futility.keep_evidence``). It
reads the training loss only, so it holds for any recipe, with or without ``score()``; never the
control nor its seeds (the reference is compared, not judged), nor a data-parallel run (rank 0
alone would stop). Each check is a ``not_learning`` row in ``metrics.jsonl``. The losses it
needs (the first window's, the last window's) are its state, kept in every checkpoint: a
resumed run decides as the uninterrupted one would.

The futility rule is in ``engine/futility.py``.
"""

from __future__ import annotations

import math
from typing import Any

from gpucampaign.config import CampaignSpec
from gpucampaign.core.stoprules import BelowThreshold, NonFiniteLoss, NotLearning
from gpucampaign.core.text import say_exact, say_number
from gpucampaign.engine.futility import CONTROL, keep_evidence
from gpucampaign.engine.hooks import Hook, HookArgs, RunView, StopRequest

#: How far below its start the recent mean training loss must be for a run to be learning
#: (a share of the start's magnitude): a change of a few parts in ten thousand is not learning.
LEARNING_TOLERANCE = 1e-3


class NonFiniteLossRule(Hook):
    """``stop_rules.non_finite_loss``: stop at the first step whose training loss is not finite."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id

    @classmethod
    def for_run(cls, r: RunView, args: HookArgs) -> NonFiniteLossRule | None:
        """The rule of this run, or None when it is off."""
        return cls(r.run_id) if r.spec.stop_rules.non_finite_loss else None

    def on_train_row(self, row: dict[str, Any]) -> StopRequest | None:
        """Asks to stop, with nothing saved, when the row's loss is NaN or infinite."""
        loss = row.get("loss")
        if isinstance(loss, float) and not math.isfinite(loss):
            stop = NonFiniteLoss(
                self.run_id,
                f"training loss is {loss} at step {row['step']} (epoch {row['epoch']}, "
                f"lr {row['lr']:g}); the last checkpoint precedes it",
                step=row["step"],
            )
            return StopRequest.of(stop, save=False)
        return None

    def on_train_rows(self, rows: list[dict[str, Any]]) -> tuple[int, StopRequest] | None:
        """The first non-finite ``train`` row of a flush; one sum when there is none: a sum
        of floats is finite only when each one is (a NaN or an infinity makes it NaN or
        infinite), so only a batch whose sum is not (or overflows) is looked at row by row."""
        try:
            if math.isfinite(sum([r["loss"] for r in rows if r.get("kind") == "train"])):
                return None
        except (KeyError, TypeError):  # a train row without a float loss: the rows one by one
            pass
        return super().on_train_rows(rows)


class QualityFloor(Hook):
    """``stop_rules.below_threshold``: the run's final metric misses the floor."""

    def __init__(self, r: RunView) -> None:
        self.r = r

    @classmethod
    def for_run(cls, r: RunView, args: HookArgs) -> QualityFloor | None:
        """The floor of this run, or None when the rule is off (or there is no decision rule)."""
        if r.spec.decision_rule is None or not r.spec.stop_rules.below_threshold:
            return None
        return cls(r)

    def at_end(self, metrics: dict[str, float]) -> BelowThreshold | None:
        r = self.r
        return quality_stop(r.spec, r.run_id, metrics, step=r.step)


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


class NotLearningRule(Hook):
    """``stop_rules.not_learning``: stop a variant whose training loss is not below its start
    after the grace (the module's docstring has the rule).

    Its state is the examples-weighted losses of the first ``window`` steps and of the last
    ``window`` steps seen, kept in each checkpoint (``key``): built in the pilot's call too, so
    the full call that resumes from the pilot's checkpoint has the steps before it.
    """

    key = "not_learning"

    def __init__(self, r: RunView) -> None:
        self.r = r
        self.grace = r.spec.stop_rules.grace_step(planned=r.planned)
        two_epochs = 2 * r.steps_per_epoch <= r.planned
        self.window = r.steps_per_epoch if two_epochs else max(1, self.grace // 2)
        # step -> (loss, examples), of steps 1..window and of the last window steps seen.
        self.first: dict[int, tuple[float, float]] = {}
        self.recent: dict[int, tuple[float, float]] = {}
        # The decision metric at the first evaluation seen (what the run is for): a loss with
        # a scheduled term (a regulariser ramped up) may rise while the metric improves.
        self.first_metric: float | None = None

    @classmethod
    def for_run(cls, r: RunView, args: HookArgs) -> NotLearningRule | None:
        """The rule of this run, or None: off, the control or its seeds, or a data-parallel
        run. In the pilot's call it only keeps the losses (no check there)."""
        replicate = r.spec.replicate_of(r.run)
        control = r.run == CONTROL or (replicate is not None and replicate[0] == CONTROL)
        if not r.spec.stop_rules.not_learning or control:
            return None
        return cls(r) if r.dist.world_size == 1 else None

    def on_train_row(self, row: dict[str, Any]) -> None:
        loss = row.get("loss")
        if not (isinstance(loss, int | float) and math.isfinite(loss)):
            return None
        # Weighted by its examples: an epoch's short last batch counts for what it holds.
        rate, secs = row.get("samples_per_s"), row.get("step_s")
        n = (
            round(rate * secs)
            if isinstance(rate, int | float) and isinstance(secs, int | float)
            else 1
        )
        step = int(row["step"])
        if step <= self.window:
            self.first[step] = (float(loss), float(n or 1))
        self.recent[step] = (float(loss), float(n or 1))
        for old in [s for s in self.recent if s <= step - self.window]:
            del self.recent[old]
        return None

    def state_dict(self) -> dict[str, Any]:
        return {
            "first": [[s, x, n] for s, (x, n) in sorted(self.first.items())],
            "recent": [[s, x, n] for s, (x, n) in sorted(self.recent.items())],
            "first_metric": self.first_metric,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.first = {int(s): (float(x), float(n)) for s, x, n in state.get("first", [])}
        self.recent = {int(s): (float(x), float(n)) for s, x, n in state.get("recent", [])}
        got = state.get("first_metric")
        self.first_metric = float(got) if isinstance(got, int | float) else None

    def _metric_moved(self, metrics: dict[str, float]) -> tuple[float | None, bool]:
        """The decision metric of this evaluation, and whether it improved on the first
        evaluation's by more than ``LEARNING_TOLERANCE`` of it (the first one seen is kept)."""
        rule = self.r.spec.decision_rule
        value = metrics.get(rule.metric) if rule is not None else None
        if rule is None or not isinstance(value, int | float) or not math.isfinite(value):
            return None, False
        if self.first_metric is None:
            self.first_metric = float(value)
            return float(value), False
        margin = LEARNING_TOLERANCE * abs(self.first_metric)
        better = (
            value > self.first_metric + margin
            if rule.direction == "maximize"
            else value < self.first_metric - margin
        )
        return float(value), better

    @staticmethod
    def _mean(losses: dict[int, tuple[float, float]], first: int, last: int) -> float | None:
        """The examples-weighted mean training loss of steps ``first``..``last`` (None when a
        step's loss is missing: not finite, named by ``non_finite_loss``)."""
        got = [losses.get(s) for s in range(first, last + 1)]
        if any(g is None for g in got):
            return None
        pairs = [g for g in got if g is not None]
        return sum(x * n for x, n in pairs) / sum(n for _, n in pairs)

    def after_eval(self, metrics: dict[str, float]) -> StopRequest | None:
        """Asks to stop, the model kept as evidence, when the recent training loss is not below
        its start."""
        r, w = self.r, self.window
        step = r.step
        metric, improved = self._metric_moved(metrics)
        if r.target < r.planned or step < max(self.grace, 2 * w) or step >= r.planned:
            return None  # never in the pilot, within the grace, nor at the last step
        start = self._mean(self.first, 1, w)
        now = self._mean(self.recent, step - w + 1, step)
        if start is None or now is None:
            return None
        # Learning: the training loss fell, or the decision metric improved (the loss may
        # hold a scheduled term that rises while the model gets better at what it is for).
        learning = now < start - LEARNING_TOLERANCE * abs(start) or improved
        numbers = {
            "step": step,
            "grace_step": self.grace,
            "window": w,
            "start_loss": start,
            "recent_loss": now,
            "first_metric": self.first_metric,
            "metric": metric,
            "metric_improved": improved,
            "tolerance": LEARNING_TOLERANCE,
            "learning": learning,
        }
        r.record({"kind": "not_learning", **numbers})
        if learning:
            return None
        reason = (
            f"does not learn: at step {step} its mean training loss over steps "
            f"{step - w + 1}-{step} is {say_number(now, against=start)}, not below its start "
            f"{say_number(start)} (steps 1-{w}) by {LEARNING_TOLERANCE:g} of it"
            + (
                f", nor is its {r.spec.decision_rule.metric} ({say_number(metric)}) better "
                f"than at its first evaluation ({say_number(self.first_metric)})"
                if metric is not None
                and self.first_metric is not None
                and r.spec.decision_rule is not None
                else ""
            )
            + f"; the grace ended at step {self.grace}"
        )
        return keep_evidence(r, NotLearning, reason=reason, numbers=numbers)
