"""The one preflight of ``campaign plan``, ``campaign run`` and the deployment flow: the spec,
its pinned files, the corpus, the recipes and the store, checked before anything starts."""

from gpucampaign.preflight.checks import Preflight, preflight
from gpucampaign.preflight.paths import check_pinned, pin_command

__all__ = ["Preflight", "check_pinned", "pin_command", "preflight"]
