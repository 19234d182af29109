"""What a restart check of kept checkpoints resumes and compares: ``RestartTarget``.

The checks that resume a run's saved checkpoint in a fresh process (``verify_checkpoint_resume``,
``check_latest_checkpoint``, ``verify_early_save``) take this one value instead of the same
seven arguments each.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gpucampaign.spec import CampaignSpec, ResolvedRun
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
    """

    spec: CampaignSpec
    run: ResolvedRun
    corpus_path: Path
    store: Store
    run_dir: Path
    workdir: Path
    inputs: Mapping[str, Path] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("corpus_path", "run_dir", "workdir"):
            object.__setattr__(self, name, Path(getattr(self, name)))
        object.__setattr__(self, "inputs", dict(self.inputs or {}))
