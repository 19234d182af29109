"""The registry of the loop's hooks: every factory here builds its hook for each training call.

A factory (``HookFactory``) takes a read-only view of the run (``RunView``) and the call's
``HookArgs`` and returns its hook, or None when its rule is off for this run; the hooks are
called in this order. Adding a stop rule
is one ``Hook`` class and one line here (``register`` from elsewhere, e.g. a test); the loop
does not change. ``ARCHITECTURE.md`` walks through an example.
"""

from __future__ import annotations

from gpucampaign.engine.futility import Futility
from gpucampaign.engine.hooks import HookArgs, HookFactory, Hooks, RunView
from gpucampaign.engine.live import ProgressHook
from gpucampaign.engine.lotend import LotDeadline
from gpucampaign.engine.rules import NonFiniteLossRule, NotLearningRule, QualityFloor
from gpucampaign.engine.tracked import Tracker

HOOKS: list[HookFactory] = [
    NonFiniteLossRule.for_run,  # stop_rules.non_finite_loss
    QualityFloor.for_run,  # stop_rules.below_threshold
    NotLearningRule.for_run,  # stop_rules.not_learning
    Futility.hook,  # stop_rules.futility
    Tracker.for_run,  # tracking.mlflow (or MLFLOW_TRACKING_URI)
    ProgressHook.for_run,  # progress.json, the progress callback, the bar
    LotDeadline.for_run,  # lots with starts_at: save and stop before the lot ends
]


def register(factory: HookFactory) -> HookFactory:
    """Add ``factory`` to the registry (its hooks come after the others); returns it, so it
    can decorate."""
    HOOKS.append(factory)
    return factory


def build_hooks(view: RunView, args: HookArgs) -> Hooks:
    """The hooks of one training call, in the registry's order, each on the run's view."""
    return Hooks.of(h for factory in HOOKS if (h := factory(view, args)) is not None)
