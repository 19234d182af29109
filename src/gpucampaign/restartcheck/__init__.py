"""Restart checks in a fresh process: the early save, the exact comparison, the scheduled check."""

from gpucampaign.restartcheck.check import verify_restart
from gpucampaign.restartcheck.earlysave import campaign_restart_check
from gpucampaign.restartcheck.scheduled import verify_checkpoint_resume

__all__ = ["campaign_restart_check", "verify_checkpoint_resume", "verify_restart"]
