"""The reloadable model folder a run leaves at the end (``model/``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpucampaign.config.recipefile import recipe_file
from gpucampaign.modelfolder import save_model_dir
from gpucampaign.recipe.runtime import recipe_record

if TYPE_CHECKING:
    from gpucampaign.engine.setup import LiveRun


def save_model(r: LiveRun, metrics: dict[str, float]) -> None:
    """The reloadable model folder: weights, and a config naming recipe, args and inputs."""
    spec, record = r.spec, recipe_record(r.resolved)
    # Paths as the spec gives them (relative to its folder): never an absolute path.
    pins = {
        name: {"path": spec.inputs[name].path, "sha256": p.sha256, "kind": p.kind}
        for name, p in r.ctx.inputs.items()
    }
    corpus = r.ctx.corpus
    assert corpus is not None  # a training run's context always pins its corpus
    sources = (
        {f"recipe/{record['recipe_file']}": recipe_file(r.config.recipe)}
        if "recipe_file" in record
        else {}
    )
    save_model_dir(
        r.state.model,
        r.run_folder.model,
        config=r.config,
        sources=sources,
        extra={
            **r.described,
            **record,
            "corpus_sha256": r.corpus.sha256,
            "corpus": {
                "path": spec.corpus.path if spec.corpus else None,
                "sha256": corpus.sha256,
                "kind": corpus.kind,
            },
            "inputs": pins,
            "run_id": r.run_id,
            "run": r.run,
            "steps": r.state.global_step,
            "metrics": metrics,
        },
    )
