"""Experiment tracking, optional and off by default: MLflow (``tracking/mlflow.py``).

mlflow itself is imported only when tracking is on (the ``tracking`` extra installs it).
"""

from gpucampaign.tracking.mlflow import (
    META_KEY,
    OUTBOX_FILE,
    STATE_FILE,
    RunTracker,
    track_close,
    track_sealed,
    tracking_note,
    tracking_uri,
)

__all__ = [
    "META_KEY",
    "OUTBOX_FILE",
    "STATE_FILE",
    "RunTracker",
    "track_close",
    "track_sealed",
    "tracking_note",
    "tracking_uri",
]
