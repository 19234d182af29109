"""Pinned inputs: a file or a folder whose exact bytes the spec fixes by one sha256.

A file is pinned by the sha256 of its bytes. A folder is pinned by a manifest: one row per
file (relative POSIX path, size, sha256), sorted by path; the pin is the sha256 of the
manifest's canonical JSON, so adding, removing, renaming or changing any file changes it.
A missing or changed input is the essential-input stop.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpucampaign.config import CampaignSpec, SpecError, canonical_json, resolve_inside
from gpucampaign.core.files import TMP_PREFIX, sha256_bytes, sha256_file
from gpucampaign.core.stoprules import EssentialInputMissing


@dataclass(frozen=True)
class Pinned:
    """A pinned input (the corpus or one of ``inputs``): a file or a folder, verified.

    A corpus loaded for a run also carries the spec's other pinned ``inputs``.
    """

    path: Path
    sha256: str
    kind: str = "file"
    load_s: float = field(default=0.0, compare=False)
    inputs: dict[str, Pinned] = field(default_factory=dict, compare=False)


def folder_manifest(folder: str | Path) -> list[dict[str, Any]]:
    """``[{path, size, sha256}]`` of every file under ``folder`` (sorted; temp files skipped).

    A link is never followed: a pinned folder holds its own files, so a link in it (to a
    file or a folder, inside or out) is refused with its name before anything is read.

    Raises:
        SpecError: The folder holds a link.
    """
    root = Path(folder)
    rows = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            if p.is_symlink():
                raise SpecError(
                    f"'{p}' in the pinned folder '{root}' is a link (to '{os.readlink(p)}'): a "
                    "pinned folder holds its own files and no link is followed; copy the file "
                    "in instead.",
                    field="path",
                )
        for name in filenames:
            p = Path(dirpath) / name
            rel = p.relative_to(root)
            if not p.is_file() or any(part.startswith(TMP_PREFIX) for part in rel.parts):
                continue
            rows.append(
                {"path": rel.as_posix(), "size": p.stat().st_size, "sha256": sha256_file(p)}
            )
    return sorted(rows, key=lambda r: r["path"].split("/"))  # the order Path sorts in


def manifest_sha256(rows: list[dict[str, Any]]) -> str:
    """The one sha256 over a folder manifest (its canonical JSON)."""
    return sha256_bytes(canonical_json(rows).encode())


def input_sha256(path: str | Path) -> str:
    """The pin of a file (its bytes) or a folder (its manifest)."""
    p = Path(path)
    return manifest_sha256(folder_manifest(p)) if p.is_dir() else sha256_file(p)


def pin(path: Path, *, sha256: str, run_id: str, label: str) -> Pinned:
    """Check ``path`` against its pinned ``sha256``.

    Raises:
        EssentialInputMissing: The file or folder is missing or its content changed.
    """
    t0 = time.perf_counter()
    if not path.exists():
        raise EssentialInputMissing(run_id, f"{label} is missing (looked at {path})")
    kind = "folder" if path.is_dir() else "file"
    actual = input_sha256(path)
    if actual != sha256:
        what = (
            "a file in the folder was added, removed or changed"
            if kind == "folder"
            else ("the file was altered")
        )
        raise EssentialInputMissing(
            run_id, f"{label} changed ({what}): sha256 {actual} is not the pinned {sha256}"
        )
    return Pinned(path=path, sha256=actual, kind=kind, load_s=time.perf_counter() - t0)


def resolve_inputs(
    spec: CampaignSpec, *, base_dir: str | Path | None = None, out: str | Path | None = None
) -> dict[str, Path]:
    """Where each pinned input of ``spec`` is, by name: the first place holding its pinned hash
    among the copy an output folder keeps (its ``inputs.json``), the spec's path from the
    spec's folder ``base_dir``, and the same path inside ``out``; else the first of them
    (pinning it then says what is wrong).

    Raises:
        SpecError: The spec pins inputs and neither folder is given.
    """
    # Here, not at the top: the folder package imports torch, and `import gpucampaign` stays
    # without it.
    from gpucampaign.folder.layout import INPUTS, corpus_file

    if spec.inputs and base_dir is None and out is None:
        raise SpecError(
            "the spec pins 'inputs': their paths need the spec's folder or the campaign's "
            "output folder.",
            field="inputs",
        )
    kept: dict[str, Any] = {}
    record = Path(out) / INPUTS if out is not None else None
    if record is not None and record.is_file():
        kept = json.loads(record.read_text(encoding="utf-8")).get("pinned") or {}
    found: dict[str, Path] = {}
    for name, item in spec.inputs.items():
        field = f"inputs.{name}.path"
        ref = kept.get(name) or {}
        places = (
            [corpus_file(out, ref)]
            if out is not None and ref.get("kind") in ("copied", "external")
            else []
        )
        places += [resolve_inside(d, item.path, field=field) for d in (base_dir, out) if d]
        found[name] = next(
            (p for p in places if p.exists() and input_sha256(p) == item.sha256), places[0]
        )
    return found


def pin_inputs(spec: CampaignSpec, *, paths: Mapping[str, Path], run_id: str) -> dict[str, Pinned]:
    """Every pinned input of ``spec.inputs`` at its resolved path (``resolve_inputs``),
    checked, by name."""
    return {
        name: pin(
            Path(paths[name]),
            sha256=item.sha256,
            run_id=run_id,
            label=f"input '{name}' ('{item.path}')",
        )
        for name, item in spec.inputs.items()
    }


def describe_pin(p: Pinned) -> dict[str, Any]:
    """What the manifest and a model's ``config.json`` record of a pinned input."""
    out: dict[str, Any] = {"path": str(p.path), "sha256": p.sha256, "kind": p.kind}
    if p.kind == "folder":
        rows = folder_manifest(p.path)
        out.update(files=len(rows), bytes=sum(r["size"] for r in rows))
    else:
        out["bytes"] = p.path.stat().st_size
    return out
