"""Experiment tracking, optional and off by default: MLflow. ``mlflow.py``: the MLflow run of
each campaign run (``RunTracker``, fed by the training loop's tracker hook, ``engine/tracked.py``);
``campaign.py``: the campaign's parent run at the close.

mlflow itself is imported only when tracking is on (the ``tracking`` extra installs it).
"""

from gpucampaign.tracking.campaign import (
    sealed_tracking_uri,
    tag_manifest,
    track_close,
    track_sealed,
)
from gpucampaign.tracking.mlflow import META_KEY, RunTracker, tracking_note, tracking_uri

__all__ = [
    "META_KEY",
    "RunTracker",
    "sealed_tracking_uri",
    "tag_manifest",
    "track_close",
    "track_sealed",
    "tracking_note",
    "tracking_uri",
]
