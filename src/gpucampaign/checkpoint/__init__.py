"""Checkpoints as transactions: the manager, the train state's files, the save interval."""

from gpucampaign.checkpoint.manager import CheckpointManager, LoadedCheckpoint, SavedCheckpoint
from gpucampaign.checkpoint.savepolicy import SavePolicy

__all__ = ["CheckpointManager", "LoadedCheckpoint", "SavePolicy", "SavedCheckpoint"]
