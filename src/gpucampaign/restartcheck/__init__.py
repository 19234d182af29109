"""Restart checks in a fresh process: the early save, the exact comparison, the scheduled check."""

from gpucampaign.restartcheck.check import verify_checkpoint_resume, verify_restart
from gpucampaign.restartcheck.earlysave import campaign_restart_check

__all__ = ["campaign_restart_check", "verify_checkpoint_resume", "verify_restart"]
