"""Restart checks in a fresh process: the early save, the exact comparison, the scheduled check.

The names below are imported at their first use: the check's fresh process runs
``python -m gpucampaign.restartcheck.child``, which imports this package first, and needs none
of them (its fixed cost is a fresh import and one checkpoint load: issue 47).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpucampaign.restartcheck.check import verify_restart
    from gpucampaign.restartcheck.earlysave import campaign_restart_check
    from gpucampaign.restartcheck.scheduled import verify_checkpoint_resume

__all__ = ["campaign_restart_check", "verify_checkpoint_resume", "verify_restart"]

_MODULES = {
    "verify_restart": "check",
    "campaign_restart_check": "earlysave",
    "verify_checkpoint_resume": "scheduled",
}


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return getattr(importlib.import_module(f"{__name__}.{_MODULES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
