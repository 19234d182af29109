"""A finished run's model folder brought up to a recipe file edited only after training.

A run's ID hashes its recipe's training source (``spec.recipefile.training_source``: the file
without the recipe class's ``predict`` and ``score``), so a recipe edited only there keeps its
runs, and a rerun redoes their predictions and scores, not their training. The model folder
records the file it was saved with and keeps a copy of it, and a reload refuses another file;
``refresh_recipe_copy`` replaces that copy and record with the edited file, once it has shown
that the kept copy's training source is the edited file's. The weights are never touched.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path

from gpucampaign.config.recipefile import training_source
from gpucampaign.core.files import TMP_PREFIX, atomic_write_bytes, fsync_dir
from gpucampaign.folder.layout import MODEL_CONFIG


def refresh_recipe_copy(
    folder: str | Path, *, recipe: str, src: Path, file_sha256: str, training_sha256: str
) -> bool:
    """Replace the recipe copy and record of the model folder ``folder`` with ``src``, when
    only the recipe's ``predict`` or ``score`` changed since the model was saved.

    Args:
        folder: The model folder (``runs/<run_id>/model``).
        recipe: The recipe's import path (``module:Class``).
        src: The recipe's file now (found where the run IDs found it).
        file_sha256: ``src``'s sha256, as the run was resolved.
        training_sha256: The training source's sha256 of ``src``, part of the run ID.

    Returns:
        True when the folder was brought up to ``src``; False when it already records that
        file, records no recipe file (a built-in recipe), or its kept copy's training source
        differs (the folder is then left as it is, and a reload says why it refuses).
    """
    folder = Path(folder)
    info = json.loads((folder / MODEL_CONFIG).read_text(encoding="utf-8"))
    rel = f"recipe/{info.get('recipe_file')}"
    kept = folder / rel
    if (
        info.get("recipe") != recipe
        or not info.get("recipe_file")
        or info.get("recipe_sha256") == file_sha256
        or not kept.is_file()
    ):
        return False
    old = kept.read_bytes()
    if hashlib.sha256(training_source(recipe, old)).hexdigest() != training_sha256:
        return False
    data = src.read_bytes()
    if hashlib.sha256(data).hexdigest() != file_sha256:  # changed again since the run IDs
        return False
    tmp = kept.with_name(f"{TMP_PREFIX}{kept.name}.{uuid.uuid4().hex[:8]}")
    try:
        tmp.write_bytes(data)
        tmp.replace(kept)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(kept.parent)
    info["recipe_sha256"] = file_sha256
    info.setdefault("files", {})[rel] = {"sha256": file_sha256, "bytes": len(data)}
    text = json.dumps(info, indent=2, sort_keys=True) + "\n"
    atomic_write_bytes(folder / MODEL_CONFIG, text.encode())
    return True
