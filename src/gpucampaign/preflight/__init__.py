"""The one preflight of ``campaign plan``, ``campaign run`` and the deployment flow: the spec,
its pinned files, the corpus, the recipes and the store, checked before anything starts; and
the one entry of a campaign (``open_campaign``), which runs it once."""

from gpucampaign.preflight.checks import Preflight, preflight
from gpucampaign.preflight.opening import (
    OpenCampaign,
    open_campaign,
    refuse_sealed_rewrite,
    start_folder,
)
from gpucampaign.preflight.ownership import closed_for_good
from gpucampaign.preflight.paths import check_pinned, pin_command

__all__ = [
    "OpenCampaign",
    "Preflight",
    "check_pinned",
    "open_campaign",
    "pin_command",
    "preflight",
    "closed_for_good",
    "refuse_sealed_rewrite",
    "start_folder",
]
