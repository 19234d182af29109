"""A run is resolved once: ``CampaignSpec.resolve_run`` gives the run IDs runs always had, a
training task resolves its run once, and a recipe file is read once per process."""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import sys
import textwrap
import uuid
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpucampaign.config import CampaignSpec, ResolvedRun, canonical_json, load_spec
from gpucampaign.config import recipefile as recipefile_module
from gpucampaign.core import files
from tests.recipe.test_recipe import make_spec, write_recipe

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# The IDs of the digits example's runs before runs were resolved once: they must not change.
DIGITS_IDS = {
    "control": "control-d5aa9d6bd3",
    "lr-high": "lr-high-29bdaa0198",
    "bf16": "bf16-16fcf305c4",
    "short": "short-c355eed5f6",
}


def test_a_resolved_run_has_the_run_id_runs_always_had(tmp_path: Path) -> None:
    spec = load_spec(EXAMPLES / "digits" / "campaign.yaml")
    for name, rid in DIGITS_IDS.items():
        run = spec.resolve_run(name)
        assert (run.name, run.run_id, run.config) == (name, rid, spec.run_config(name))
        assert run.config_sha256.startswith(rid.rpartition("-")[2]) and len(run.config_sha256) == 64
        assert run.recipe_sha256 is None and run.device == run.config.device == "auto"
        assert (
            spec.resolve_run(name).run_id == rid
            and spec.resolve_run(name).config_sha256 == run.config_sha256
        )

    # A recipe given by import path: the hash of its training source is in the ID.
    module = write_recipe(tmp_path)
    spec = make_spec(tmp_path, module)
    for name in ("control", "wide"):
        run = spec.resolve_run(name)
        recipe_sha = hashlib.sha256((tmp_path / f"{module}.py").read_bytes()).hexdigest()
        payload = {
            "config": spec.run_config(name).identity(),
            "corpus_sha256": spec.corpus.sha256,
            # No predict or score in this file: its training source is the whole file, and
            # its run IDs are the ones it always had.
            "recipe_sha256": recipe_sha,
        }
        sha = hashlib.sha256(canonical_json(payload).encode()).hexdigest()
        assert (run.run_id, run.config_sha256, run.recipe_sha256, run.training_sha256) == (
            f"{name}-{sha[:10]}",
            sha,
            recipe_sha,
            recipe_sha,
        )


def test_a_resolved_run_is_a_frozen_keyword_only_value() -> None:
    run = load_spec(EXAMPLES / "digits" / "campaign.yaml").resolve_run("control")
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.run_id = "control-0000000000"  # type: ignore[misc]
    with pytest.raises(TypeError):
        ResolvedRun("control", run.config, run.run_id, run.config_sha256, None)  # type: ignore[misc]
    assert ResolvedRun(**dataclasses.asdict(run) | {"config": run.config}) == run


def _count_calls(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, counts: dict) -> None:
    """Count the calls of ``owner.name`` (by first argument) in ``counts[name]``."""
    real = getattr(owner, name)
    calls = counts.setdefault(name, [])

    def counted(*args: Any, **kw: Any) -> Any:
        calls.append(args[-1] if args else None)
        return real(*args, **kw)

    monkeypatch.setattr(owner, name, counted)


class _NoProgress:
    """The progress artifact of a task, without a Prefect server."""

    id = None

    def __init__(self, phase: str, **where: Any) -> None:
        pass

    def __call__(self, info: dict[str, Any]) -> None:
        pass

    def start(self) -> None:
        pass

    def live_tables(self, info: dict[str, Any], *, final: bool = False) -> None:
        pass

    def finish(self) -> None:
        pass

    def drain(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_a_training_task_resolves_its_run_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pilot task and the train task of one run: each resolves the run once and asks for
    the recipe file's hash once; nothing below them resolves it again."""
    import gpucampaign_prefect.tasks.train as train_tasks

    module = write_recipe(tmp_path)
    spec = make_spec(tmp_path, module)
    recipe = tmp_path / f"{module}.py"
    # The task's Prefect parts (the GPU lock, the progress artifact) are not what is counted.
    monkeypatch.setattr(train_tasks, "gpu_slot", lambda *a, **kw: nullcontext())
    monkeypatch.setattr(train_tasks, "TrainingView", _NoProgress)
    counts: dict[str, list] = {}
    for name in ("resolve_run", "_resolve_once"):
        _count_calls(monkeypatch, CampaignSpec, name, counts)
    _count_calls(monkeypatch, recipefile_module, "sha256_file", counts)

    common = {"base_dir": str(tmp_path), "out": str(tmp_path / "out"), "run": "control"}
    measured = train_tasks.pilot.fn(spec, **common)
    once = {"resolve_run": ["control"], "_resolve_once": ["control"], "sha256_file": [recipe]}
    assert counts == once
    run_id = spec.resolve_run("control").run_id
    assert measured["run_id"] == run_id
    for calls in counts.values():
        calls.clear()

    result = train_tasks.train.fn(spec, **common)
    assert result["completed"] and result["run_id"] == run_id
    assert result["resumed_from_step"] == spec.pilot.steps
    # The same spec: the run is looked up, never resolved (nor its recipe file read) again.
    assert counts == {"resolve_run": ["control"], "_resolve_once": [], "sha256_file": []}


def test_a_recipe_file_is_read_once_per_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every run of a recipe hashes the same file: it is read once, until it changes."""
    module = write_recipe(tmp_path)
    spec = make_spec(tmp_path, module)
    monkeypatch.setattr(files, "_RACY_NS", 0)  # the file was just written: cache it anyway
    reads: list[int] = []

    def counting_sha256(*args: Any) -> Any:
        reads.append(1)
        return hashlib.sha256(*args)

    monkeypatch.setattr(files, "hashlib", SimpleNamespace(sha256=counting_sha256))
    first = {name: spec.resolve_run(name).run_id for name in ("control", "wide")}
    again = {name: spec.model_copy().resolve_run(name).run_id for name in ("control", "wide")}
    assert again == first and len(reads) == 1
    recipe = tmp_path / f"{module}.py"
    recipe.write_text(recipe.read_text() + "\n# edited\n")
    # The spec resolved its runs once: its IDs stay; a new spec object sees the edit.
    assert spec.resolve_run("control").run_id == first["control"] and len(reads) == 1
    assert spec.model_copy().resolve_run("control").run_id != first["control"]
    assert len(reads) == 2


def test_the_run_id_covers_the_training_code_not_predict_or_score(tmp_path: Path) -> None:
    """Editing predict or score (decorators and all) keeps every run ID; editing the model,
    the datasets, the loss or a module-level line gives new ones."""
    from tests.helpers.specs import REGRESS_RECIPE

    outputs = (
        "\n    @staticmethod\n    def _unused():\n        return 0\n"
        "\n    def predict(self, model, batch):\n"
        "        x, y = batch\n"
        "        return [{'y': float(v)} for v in model(x).flatten()]\n"
        "\n    def score(self, model, batch):\n"
        "        x, y = batch\n"
        "        return {'mse': ((model(x) - y) ** 2).flatten()}\n"
    )

    def ids(body: str) -> dict[str, str]:
        folder = tmp_path / uuid.uuid4().hex[:8]
        folder.mkdir()
        shutil.copy(tmp_path / "points.txt", folder / "points.txt")
        (folder / "recipe_under_edit.py").write_text(textwrap.dedent(body))
        sys.modules.pop("recipe_under_edit", None)
        return make_spec(folder, "recipe_under_edit").run_ids()

    make_spec(tmp_path, write_recipe(tmp_path))  # writes points.txt once
    base = ids(REGRESS_RECIPE + outputs)
    edited = outputs.replace("'y': float(v)", "'yhat': round(float(v), 3)").replace(
        "** 2).flatten()", "** 2).flatten() * 1.0"
    )
    assert edited != outputs and ids(REGRESS_RECIPE + edited) == base
    decorated = edited.replace("    def predict", "    @torch.no_grad()\n    def predict")
    assert ids(REGRESS_RECIPE + decorated) == base
    for training_edit in (
        REGRESS_RECIPE.replace("torch.nn.Tanh()", "torch.nn.ReLU()"),  # the model
        REGRESS_RECIPE.replace("mse_loss(model(x), y)", "l1_loss(model(x), y)"),  # the loss
        REGRESS_RECIPE.replace("n // 2]", "n // 3]"),  # the datasets
        "SCALE = 2\n" + REGRESS_RECIPE,  # module level
    ):
        assert training_edit != REGRESS_RECIPE
        changed = ids(training_edit + outputs)
        assert all(changed[r] != base[r] for r in base), training_edit[:60]
