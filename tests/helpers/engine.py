"""Helpers for the engine tests: the digits corpus written once, tiny specs, short runs."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from gpucampaign.config import CampaignSpec, parse_spec
from gpucampaign.data.corpus import Corpus, load_corpus
from gpucampaign.data.tables import write_digits_corpus
from gpucampaign.engine.loop import train_run
from gpucampaign.folder.layout import RunFolder
from gpucampaign.folder.metrics import read_metrics
from gpucampaign.folder.runresult import RunResult
from gpucampaign.storage import LocalStore

# Tiny but real: 1259 train rows at batch 128 = 10 steps per epoch.
TINY = {"recipe": "mlp", "hidden": [16], "batch_size": 128, "epochs": 2, "lr": 0.01, "threads": 1}


@pytest.fixture(scope="session")
def digits_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """``(path, sha256)`` of the digits corpus, written once per test session."""
    path = tmp_path_factory.mktemp("digits") / "digits.csv"
    return path, write_digits_corpus(path)


def make_spec(base: Path, digits: tuple[Path, str], **overrides: Any) -> CampaignSpec:
    """A campaign in ``base`` with the digits corpus copied beside it; ``overrides`` replace
    top-level sections (``control`` is merged into the tiny control)."""
    src, sha = digits
    (base / "data").mkdir(parents=True, exist_ok=True)
    if not (base / "data" / "digits.csv").exists():
        shutil.copyfile(src, base / "data" / "digits.csv")
    data: dict[str, Any] = {
        "name": "t",
        "packages": [{"gpu": "rtx4090", "days": 3}],
        "calendar": [{"name": "prep", "kind": "human", "hours": 1}],
        "corpus": {"path": "data/digits.csv", "sha256": sha},
        "control": dict(TINY),
        "decision_rule": {"metric": "accuracy", "threshold": 0.0},  # stop-rule tests raise it
        "pilot": {"steps": 5},
    }
    data["control"].update(overrides.pop("control", {}))
    data.update(overrides)
    return parse_spec(data)


def corpus_of(base: Path, spec: CampaignSpec) -> Corpus:
    assert spec.corpus is not None
    return load_corpus(base / spec.corpus.path, corpus_spec=spec.corpus)


def run(
    spec: CampaignSpec, base: Path, *, name: str = "control", out: str = "out", **kw: Any
) -> RunResult:
    """``train_run`` with the campaign layout ``base/out/{checkpoints, runs/<run_id>}``."""
    return train_run(
        spec,
        run=spec.resolve_run(name),
        corpus=corpus_of(base, spec),
        store=LocalStore(base / out / "checkpoints"),
        run_folder=RunFolder.of(base / out, spec.resolve_run(name).run_id),
        **kw,
    )


def run_dir(spec: CampaignSpec, base: Path, *, name: str = "control", out: str = "out") -> Path:
    return base / out / "runs" / spec.resolve_run(name).run_id


def train_losses(path: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in read_metrics(path) if r["kind"] == "train"]
