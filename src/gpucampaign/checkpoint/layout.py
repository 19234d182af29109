"""A checkpoint's names in its store: the run's step folders, the files of one checkpoint, the
``LATEST`` pointer and the format tag its meta carries. The names themselves are
``folder.layout``'s (the one owner of every file name, below ``storage``, whose spool reads
them too); this module gives them the checkpoint's words."""

from __future__ import annotations

import re

from gpucampaign.folder.layout import (
    CHECKPOINT_LATEST,
    CHECKPOINT_META,
    CHECKPOINT_STATE,
    CHECKPOINT_STEP_PREFIX,
    WEIGHTS_FILE,
    checkpoint_step_dir,
)

FORMAT = "gpucampaign-checkpoint/1"
MODEL_FILE = WEIGHTS_FILE
STATE_FILE = CHECKPOINT_STATE
META_FILE = CHECKPOINT_META
LATEST_FILE = CHECKPOINT_LATEST
PAYLOAD_FILES: tuple[str, ...] = (MODEL_FILE, STATE_FILE)
STEP_DIR = re.compile(rf"^{CHECKPOINT_STEP_PREFIX}(\d{{9}})$")


def step_dirname(step: int) -> str:
    """``step-000000020``: sorts by step as text."""
    return checkpoint_step_dir(step)
