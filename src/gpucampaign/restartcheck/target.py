"""What a restart check of kept checkpoints resumes and compares: ``RestartTarget``.

The checks that resume a run's saved checkpoint in a fresh process (``verify_checkpoint_resume``,
``check_latest_checkpoint``, ``verify_early_save``) take this one value instead of the same
seven arguments each.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gpucampaign.config import CampaignSpec, ResolvedRun, resolve_inside
from gpucampaign.data.pins import input_sha256
from gpucampaign.folder.layout import INPUTS, MANIFEST, corpus_file
from gpucampaign.folder.records import StopRecord
from gpucampaign.storage import Store


@dataclass(frozen=True, kw_only=True)
class RestartTarget:
    """A run's kept checkpoints, its pinned inputs and its records, and where to work.

    Attributes:
        spec: The campaign's spec.
        run: The run (``spec.resolve_run(name)``): its config and ID, resolved once.
        corpus_path: The pinned corpus file (the fresh process checks its hash once).
        store: The campaign's checkpoint store.
        run_dir: The original run folder ``OUT/runs/<run_id>/`` (its ``metrics.jsonl``, its
            model folder).
        workdir: An empty scratch folder.
        inputs: Where the spec's pinned inputs are (``pins.resolve_inputs``).
        stopped: The stop that ended the run, when a stop rule did: its last checkpoint is
            checked for what it can show (it loads, its state is complete, its hashes match,
            and the replay of the steps recorded after it), never taken for a failed restart.
        no_replay: Why no fresh process may replay the run (its corpus changed), if so: the
            checkpoint is then only loaded and verified.
    """

    spec: CampaignSpec
    run: ResolvedRun
    corpus_path: Path
    store: Store
    run_dir: Path
    workdir: Path
    inputs: Mapping[str, Path] = field(default_factory=dict)
    stopped: StopRecord | None = None
    no_replay: str = ""

    def __post_init__(self) -> None:
        for name in ("corpus_path", "run_dir", "workdir"):
            object.__setattr__(self, name, Path(getattr(self, name)))
        object.__setattr__(self, "inputs", dict(self.inputs or {}))


def pinned_corpus(
    spec: CampaignSpec, *, out: str | Path, spec_dir: str | Path
) -> tuple[Path | None, list[Path]]:
    """The first file holding the corpus's pinned sha256, and every place looked at.

    The places, in order: the copy the output folder keeps (its manifest's or ``inputs.json``'s
    record), the spec's path from the spec's folder ``spec_dir``, the same path inside
    ``out``. A corpus changed during the campaign is found in the copy kept at its start.
    """
    assert spec.corpus is not None, "the spec pins a corpus"
    out = Path(out)
    candidates: list[Path] = []
    for record in (MANIFEST, INPUTS):
        if (out / record).is_file():
            ref = json.loads((out / record).read_text(encoding="utf-8")).get("corpus") or {}
            if ref.get("kind") == "copied" and ref.get("path"):
                candidates.append(corpus_file(out, ref))
    candidates += [
        resolve_inside(Path(spec_dir).resolve(), spec.corpus.path, field="corpus.path"),
        resolve_inside(out, spec.corpus.path, field="corpus.path"),
    ]
    candidates = list(dict.fromkeys(candidates))
    pinned = spec.corpus.sha256
    found = next((c for c in candidates if c.exists() and input_sha256(c) == pinned), None)
    return found, candidates
