"""The preflight of the files a spec pins: where they are, that no link leads out of their
folder, and that their sha256 is the pinned one (a mismatch says how to pin the file).
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from gpucampaign.config import SpecError
from gpucampaign.data.pins import input_sha256


def inside(path: Path, *, root: Path) -> bool:
    """True when ``path`` (resolved) is ``root`` (resolved) or under it."""
    target, top = path.resolve(), root.resolve()
    return target == top or top in target.parents


def refuse_links_out(folder: Path, *, field: str, shown: str) -> int:
    """Every link under a pinned ``folder`` must point inside it; the files under it.

    The walk does not follow links, so a linked folder is judged by its own target.

    Raises:
        SpecError: A link under ``folder`` points outside it (or nowhere).
    """
    files = 0
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        for name in (*dirnames, *filenames):
            p = Path(dirpath) / name
            if not p.is_symlink():
                files += name in filenames
                continue
            rel = p.relative_to(folder).as_posix()
            if not p.exists() or not inside(p, root=folder):
                raise SpecError(
                    f"field '{field}': '{shown}/{rel}' is a link to '{os.readlink(p)}', outside "
                    f"the pinned folder '{shown}' (or to nothing); copy the file into the folder "
                    "instead of linking it, and pin the folder again.",
                    field=field,
                )
            files += name in filenames
    return files


def pin_command(path: Path) -> str:
    """The ``campaign pin`` command that prints ``path``'s pin, as the user would type it."""
    try:
        shown = path.relative_to(Path.cwd())
    except ValueError:
        shown = path
    return f"campaign pin {shlex.quote(str(shown))}"


def check_pinned(path: Path, *, sha256: str, field: str, shown: str, label: str) -> str:
    """``path`` (already resolved inside the spec's folder) exists, is not empty, has no link
    out of its folder, and has the pinned ``sha256``; what it is, in a few words.

    Args:
        path: The pinned file or folder.
        sha256: The pin the spec gives.
        field: The spec field of the path (``corpus``, ``inputs.base``).
        shown: The path as the spec writes it.
        label: What the path is (``corpus``, ``input 'base'``).

    Raises:
        SpecError: Missing, empty, a link out of its folder, or another sha256 (the message
            names both hashes and the ``campaign pin`` command that prints the right one).
    """
    if not path.exists():
        raise SpecError(
            f"field '{field}.path': '{shown}' does not exist (looked at {path}); give the path "
            "of the file or folder, relative to the spec's folder.",
            field=f"{field}.path",
        )
    if path.is_dir():
        files = refuse_links_out(path, field=f"{field}.path", shown=shown)
        what = f"folder of {files} file(s)"
    else:
        files = 1 if path.stat().st_size else 0
        what = f"file of {path.stat().st_size} bytes"
    if not files:
        raise SpecError(
            f"field '{field}.path': '{shown}' is empty ({what}); give the {label} its data, or "
            "the path of the file or folder that holds it.",
            field=f"{field}.path",
        )
    actual = input_sha256(path)
    if actual != sha256:
        raise SpecError(
            f"field '{field}.sha256': '{shown}' is not the pinned {label}: its "
            f"sha256 is {actual}, the spec pins {sha256}. If '{shown}' is the one you mean, "
            f"`{pin_command(path)}` prints the sha256 to put in {field}.sha256 (a new pin "
            "starts a new campaign); otherwise restore what was pinned.",
            field=f"{field}.sha256",
        )
    return what
