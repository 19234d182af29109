"""The training engine: one run from setup to finish (``loop``), saves, devices, restarts."""

from gpucampaign.engine.loop import train_run

__all__ = ["train_run"]
