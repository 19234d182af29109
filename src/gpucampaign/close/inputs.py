"""The inputs the close reads, whole or not: the corpus as pinned, from the copy the output folder
kept at the start when the original changed during the campaign, and the names of the inputs
that changed (the report says them).

A close never needs a changed input to be whole: it reads the kept copy, and without one it
closes all the same, with the runs that would need the corpus not reload-checked.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpucampaign.config import CampaignSpec, resolve_inside
from gpucampaign.core.errors import InputError
from gpucampaign.core.stoprules import EssentialInputMissing
from gpucampaign.data.corpus import corpus_path, open_corpus
from gpucampaign.data.pins import input_sha256, resolve_inputs
from gpucampaign.restartcheck.target import pinned_corpus


@dataclass
class ClosingInputs:
    """The corpus the close reads (None when no file holds its pinned hash), where it was
    read, and one line per input that changed during the campaign."""

    corpus: Any = None
    path: Path | None = None
    changed: list[str] = field(default_factory=list)


def _now_sha256(path: Path) -> str | None:
    return input_sha256(path) if path.exists() else None


def _changed_line(
    what: str, path: Path, *, pinned: str, kept: Path | None, root: Path
) -> str | None:
    """The line saying that ``what`` at ``path`` no longer holds its pin, or None. Paths are
    said as the spec gives them and inside the output folder (which moves)."""
    now = _now_sha256(path)
    if now == pinned:
        return None
    state = "is missing" if now is None else f"has sha256 {now}, not the pinned {pinned}"
    inside = kept.resolve().is_relative_to(root) if kept is not None else False
    read = (
        f"; the close read the copy kept in the output folder "
        f"({kept.resolve().relative_to(root).as_posix() if inside else kept.name})"
        if kept is not None
        else "; the output folder keeps no copy of it"
    )
    return f"{what} changed during the campaign: it {state}{read}"


def closing_inputs(spec: CampaignSpec, *, root: str | Path, base_dir: str | Path) -> ClosingInputs:
    """The corpus and pinned inputs as the close reads them (see the module's docstring)."""
    if spec.corpus is None:
        return ClosingInputs()
    found, _ = pinned_corpus(spec, out=root, spec_dir=base_dir)
    original = corpus_path(spec, base_dir=base_dir)
    changed: list[str] = []
    if found is None or found.resolve() != original.resolve():  # else the original holds its pin
        line = _changed_line(
            f"the corpus '{spec.corpus.path}'",
            original,
            pinned=spec.corpus.sha256,
            kept=found,
            root=Path(root).resolve(),
        )
        changed += [line] if line else []
    paths = resolve_inputs(spec, base_dir=base_dir, out=root)
    for name, item in spec.inputs.items():
        path = resolve_inside(Path(base_dir), item.path, field=f"inputs.{name}.path")
        there = paths.get(name)
        kept = there if there is not None and there != path and there.exists() else None
        line = _changed_line(
            f"the input '{name}' ({item.path})",
            path,
            pinned=item.sha256,
            kept=kept,
            root=Path(root).resolve(),
        )
        if line:
            changed.append(line)
    if found is None:
        return ClosingInputs(changed=changed)
    try:
        corpus = open_corpus(found, spec=spec, base_dir=base_dir, input_paths=paths)
    except (EssentialInputMissing, InputError):
        return ClosingInputs(path=found, changed=changed)
    return ClosingInputs(corpus=corpus, path=found, changed=changed)
