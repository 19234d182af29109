"""The output folder is this tool's or nobody's: what ``--out`` may be, checked before anything
is written.

A campaign writes only into a folder that is missing, empty, or one it created itself: the
first file a start writes (after the writer's lock) is ``gpucampaign-folder.json``, the owner
mark, so a folder holding it is one this tool made (its ``spec.yaml`` then says which
campaign's). A folder of the user's own files (notes, data, a backup of a spec) is refused
whole: a campaign's files would land among them and ``report.md`` would replace theirs. The
spec's own folder and every folder above the spec are refused too, even when the rest is
ours: the close seals everything in the output folder, the user's sources with it.

``closed_for_good`` says which of the tool's folders are sealed for good: a rerun only verifies
them (``verify/sealed.py``).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from gpucampaign.core.errors import FolderError
from gpucampaign.core.files import atomic_write_bytes
from gpucampaign.folder.layout import CAMPAIGN_FILE, LOCK_FILE, MANIFEST, OWNER_FILE, SPEC_COPY

OWNER_FORMAT = "gpucampaign.folder/1"
_SEALED_FORMAT = "gpucampaign.manifest/"


def refuse_foreign_folder(out: str | Path, *, spec_home: str | Path) -> None:
    """Refuse an output folder that is not this tool's, before anything is written there.

    Args:
        out: The output folder (``--out``).
        spec_home: The spec file's folder (a spec object's: the folder its paths are relative
            to).

    Raises:
        FolderError: ``out`` is the spec's folder or a folder above it, or holds files this
            tool did not write (the first of them is named, with the fix); nothing was written.
    """
    root, home = Path(out).resolve(), Path(spec_home).resolve()
    if root == home or root in home.parents:
        where = "the spec's own folder" if root == home else f"a folder above the spec ({home})"
        raise FolderError(
            f"option '--out': '{out}' is {where}; a campaign seals everything in its output "
            "folder, your spec and sources with it. Nothing was written; give a folder of its "
            "own, e.g. --out out/<name> (a new or empty folder).",
            field="--out",
        )
    if not root.is_dir() or is_owned(root):
        return
    foreign = sorted(p.name for p in root.iterdir() if not _ours_before_the_mark(p))
    if foreign:
        raise FolderError(
            f"option '--out': '{out}' holds files this tool did not write (first: "
            f"'{foreign[0]}', {len(foreign)} in all) and no {OWNER_FILE}: a campaign writes "
            "only into a new or empty folder, or one it started itself. Nothing was written "
            "there; give a new --out (e.g. a subfolder of it) or empty the folder first.",
            field="--out",
        )


def is_owned(root: str | Path) -> bool:
    """Whether ``root`` is an output folder this tool started: its owner mark, or (a folder
    started before the mark existed) its ``spec.yaml`` with the campaign ID or the sealed
    manifest beside it."""
    base = Path(root)
    mark = _read_json(base / OWNER_FILE)
    if isinstance(mark, dict) and mark.get("format") == OWNER_FORMAT:
        return True
    if not (base / SPEC_COPY).is_file():
        return False
    sealed = _read_json(base / MANIFEST)
    # close/manifest.py's format (a rank above this package): any version of it
    if isinstance(sealed, dict) and str(sealed.get("format")).startswith(_SEALED_FORMAT):
        return True
    return isinstance(_read_json(base / CAMPAIGN_FILE), dict)


def mark_owned(root: str | Path, *, campaign: str) -> None:
    """Write the owner mark into a new output folder (a no-op where the folder has its spec
    copy already: a folder started before the mark existed is left as it is)."""
    base = Path(root)
    if (base / OWNER_FILE).exists() or (base / SPEC_COPY).exists():
        return
    mark = {"format": OWNER_FORMAT, "campaign": campaign}
    atomic_write_bytes(base / OWNER_FILE, json.dumps(mark, sort_keys=True).encode() + b"\n")


def _ours_before_the_mark(entry: Path) -> bool:
    """The writer's lock file: the one file a start writes before its mark (or an empty one,
    the lock released)."""
    if entry.name != LOCK_FILE or entry.is_symlink() or not entry.is_file():
        return False
    record = _read_json(entry, empty={})
    return isinstance(record, dict) and set(record) <= {"pid", "host", "since", "what"}


def _read_json(path: Path, *, empty: Any = None) -> Any:
    try:
        if path.is_symlink() or not path.is_file():
            return None
        text = path.read_text(encoding="utf-8")
        return json.loads(text) if text.strip() else empty
    except (OSError, ValueError):
        return None


#: A run left in one of these states is work a rerun still does (the campaign closed resumable,
#: at a lot's end or a stop); "not_run" because the question was re-posed is final.
_UNFINISHED = ("not_run", "interrupted")
_FINAL_REASONS = ("the question was re-posed",)


def closed_for_good(root: str | Path) -> str | None:
    """The sha256 of ``manifest.json`` when ``root`` holds a campaign closed for good (sealed,
    every run in a final state), else None.

    Such a folder is never rewritten: a rerun would repeat no training, yet a new close would
    write a new manifest (a new sha256) and the anchor kept from the first close would no
    longer match it. A folder closed resumable (a lot ended, runs left) is not closed for good.
    """
    try:
        data = (Path(root) / MANIFEST).read_bytes()
    except OSError:
        return None
    return sealed_for_good(data)


def sealed_for_good(data: bytes) -> str | None:
    """The sha256 of a ``manifest.json``'s bytes when they seal a campaign closed for good
    (every run in a final state), else None (a folder's, or the copy its mirror keeps in the
    store: ``preflight/stale.py``)."""
    try:
        sealed = json.loads(data)
    except ValueError:
        return None
    runs = sealed.get("runs") if isinstance(sealed, dict) else None
    if not isinstance(runs, dict) or not runs:
        return None
    for run in runs.values():
        status = run.get("status") if isinstance(run, dict) else None
        if status in _UNFINISHED and run.get("reason") not in _FINAL_REASONS:
            return None
    return hashlib.sha256(data).hexdigest()
