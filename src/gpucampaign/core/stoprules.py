"""Stop rules: typed exceptions that carry the rule, the run and a stop ID.

They are raised inside library code (the rules that watch a training call are the loop's
hooks: ``engine/rules.py``, ``engine/futility.py``) and, under Prefect, inside tasks, where
they fail the task and are never retried. Prefect pickles task exceptions, so every
constructor passes all its arguments to ``super().__init__``.
"""

from __future__ import annotations

import uuid
from typing import Any

# The fields of a ``stops.jsonl`` line, in order.
_RECORD_FIELDS = ("stop_id", "rule", "run_id", "step", "reason")


def new_stop_id() -> str:
    """``stop-<12 hex>``: a fresh ID for each stop."""
    return f"stop-{uuid.uuid4().hex[:12]}"


#: Every stop rule by its ``rule`` name (how a ``stops.jsonl`` line or a rank's outcome is read
#: back into its class); a subclass that names its rule is added when it is defined.
STOP_RULES: dict[str, type[StopRule]] = {}


class StopRule(Exception):
    """A stop rule fired. ``rule`` names it; subclasses fix it (and are then in
    ``STOP_RULES``)."""

    rule: str = "stop"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "rule" in cls.__dict__:
            STOP_RULES[cls.rule] = cls

    def __init__(
        self, run_id: str, reason: str, step: int | None = None, stop_id: str | None = None
    ) -> None:
        stop_id = stop_id or new_stop_id()
        super().__init__(run_id, reason, step, stop_id)
        self.run_id = run_id
        self.reason = reason
        self.step = step
        self.stop_id = stop_id

    def __str__(self) -> str:
        return f"{self.rule}: {self.reason} (stop {self.stop_id}, run {self.run_id})"

    def to_record(self) -> dict[str, Any]:
        """The JSON line kept in ``stops.jsonl``."""
        return {k: getattr(self, k) for k in _RECORD_FIELDS}


class NonFiniteLoss(StopRule):
    """The training loss became NaN or infinite."""

    rule = "non_finite_loss"


class BelowThreshold(StopRule):
    """The run's final quality is below the floor written before the experiments."""

    rule = "below_threshold"


class Futile(StopRule):
    """A variant that cannot win: at an evaluation after the pilot, the optimistic end of its
    paired interval against the control at the same step cannot clear the min gain.
    ``numbers`` keeps what decided it (step, the control's step, gain, interval, min gain,
    examples); its model at that step is kept and evaluated as evidence."""

    rule = "futile"

    def __init__(
        self,
        run_id: str,
        reason: str,
        step: int | None = None,
        stop_id: str | None = None,
        numbers: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(run_id, reason, step, stop_id)
        self.numbers = dict(numbers or {})
        self.args = (run_id, reason, step, self.stop_id, self.numbers)  # pickled whole

    def to_record(self) -> dict[str, Any]:
        """The ``stops.jsonl`` line, with the numbers that decided the stop."""
        return {**super().to_record(), "numbers": self.numbers}


class NotLearning(Futile):
    """A variant that does not learn: at an evaluation after the grace, its mean training loss
    over its last steps is not below the mean over its first steps. ``numbers`` keeps the two
    means, their windows and the step; its model at that step is kept as evidence."""

    rule = "not_learning"


#: The stop rules that end a run after it measured its metric and wrote its model: the run's
#: values are evidence the verdict reads, so such a stop of an essential run does not stop the
#: campaign (it ends with its decision; the stop is shown with the verdict).
EVIDENCE_RULES: tuple[str, ...] = (BelowThreshold.rule, Futile.rule, NotLearning.rule)

#: The stop rules that end a variant before its last step: its values are those of an earlier
#: model, never compared with a finished control (the verdict names the step instead).
EARLY_RULES: tuple[str, ...] = (Futile.rule, NotLearning.rule)


def stops_the_campaign(stop: StopRule) -> bool:
    """Whether this stop of an essential run ends the campaign without a decision (every
    stop but those of ``EVIDENCE_RULES``)."""
    return stop.rule not in EVIDENCE_RULES


class EssentialInputMissing(StopRule):
    """An essential input is missing, cut off or altered (hash mismatch)."""

    rule = "essential_input_missing"


class NoUsableRestart(StopRule):
    """No checkpoint could be restored, or the restart did not reproduce the run."""

    rule = "no_usable_restart"


class IncompleteRun(StopRule):
    """The run ended with fewer steps than planned: never an accepted delivery."""

    rule = "incomplete_run"


class InterruptedRun(StopRule):
    """A run whose config says ``resume: inference`` was interrupted: its learning ends at its
    last good checkpoint, whose model is kept and evaluated as evidence at that step, never as
    an accepted delivery."""

    rule = "interrupted"
