"""A checkpoint's names in its store: the run's step folders, the files of one checkpoint, the
``LATEST`` pointer and the format tag its meta carries."""

from __future__ import annotations

import re

FORMAT = "gpucampaign-checkpoint/1"
MODEL_FILE = "model.safetensors"
STATE_FILE = "state.pt"
META_FILE = "meta.json"
LATEST_FILE = "LATEST"
PAYLOAD_FILES: tuple[str, ...] = (MODEL_FILE, STATE_FILE)
STEP_DIR = re.compile(r"^step-(\d{9})$")


def step_dirname(step: int) -> str:
    """``step-000000020``: sorts by step as text."""
    return f"step-{step:09d}"
