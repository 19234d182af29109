"""What a checkpoint's names mean beyond the names: the format tag its meta carries, the files
that hold its tensors, and the pattern of a step folder. The names themselves are
``folder.layout``'s (the one owner of every file name, below ``storage``, whose spool reads
them too): ``CHECKPOINT_LATEST``, ``CHECKPOINT_META``, ``CHECKPOINT_STATE``, ``WEIGHTS_FILE``,
``checkpoint_step_dir``."""

from __future__ import annotations

import re

from gpucampaign.folder.layout import CHECKPOINT_STATE, CHECKPOINT_STEP_PREFIX, WEIGHTS_FILE

FORMAT = "gpucampaign-checkpoint/1"
#: The files of one checkpoint that hold tensors (the meta names them with their checksums).
PAYLOAD_FILES: tuple[str, ...] = (WEIGHTS_FILE, CHECKPOINT_STATE)
#: A step folder's name (``checkpoint_step_dir``), its step as nine digits.
STEP_DIR = re.compile(rf"^{CHECKPOINT_STEP_PREFIX}(\d{{9}})$")
