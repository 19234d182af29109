"""The ground floor: file helpers, stop requests (signals), stop rules, durations in words."""

from gpucampaign.core.interrupt import Interrupted, stop_requested
from gpucampaign.core.stoprules import (
    STOP_RULES,
    BelowThreshold,
    EssentialInputMissing,
    Futile,
    IncompleteRun,
    InterruptedRun,
    NonFiniteLoss,
    NotLearning,
    NoUsableRestart,
    StopRule,
)

__all__ = [
    "BelowThreshold",
    "EssentialInputMissing",
    "Futile",
    "IncompleteRun",
    "Interrupted",
    "InterruptedRun",
    "NoUsableRestart",
    "NonFiniteLoss",
    "NotLearning",
    "STOP_RULES",
    "StopRule",
    "stop_requested",
]
