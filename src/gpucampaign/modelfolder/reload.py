"""Reload a run's model with its recipe and predict on new input, like Lightning's
``load_from_checkpoint`` and MLflow's ``pyfunc.load_model(uri).predict(data)``::

    import gpucampaign

    loaded = gpucampaign.load_model("out", "wider")      # a run's name or its run ID
    rows = loaded.predict("new-images/")                   # the recipe's own predict, with IDs

The weights are read from safetensors only (no pickle). A user's recipe is imported as
installed or from ``recipes`` (folders of the user's recipe files, e.g. the spec's folder) when
its file has the recorded sha256; the copy kept in the output folder runs only with
``trust_folder_code=True`` (the rule of ``campaign verify``). ``campaign predict OUT RUN
--input PATH --to CSV`` is the same from the shell.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gpucampaign.config import BUILTIN_RECIPES, RunConfig, SpecError, load_spec
from gpucampaign.config.recipefile import use_recipe_dir
from gpucampaign.core.errors import ArgumentError, InputError
from gpucampaign.data.corpus import load_corpus
from gpucampaign.data.pins import Pinned, input_sha256
from gpucampaign.folder.layout import SPEC_COPY, OutputFolder, model_config, read_manifest
from gpucampaign.modelfolder.recipe_reload import corpus_for, prediction_rows, recipe_predict_rows
from gpucampaign.modelfolder.saveload import load_run_model, predict
from gpucampaign.recipe.contract import Recipe, load_recipe
from gpucampaign.recipe.runtime import build_datasets, recipe_context

#: The splits predicted on new input, in this order, when the caller names none.
INPUT_SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class LoadedModel:
    """A run's reloaded model (CPU, eval mode) with the recipe that made it.

    Attributes:
        out: The output folder.
        run_id: The run's ID (``runs/<run_id>/``).
        run: The run's name in the spec (``control``, a variant, ``wider.s1``).
        model: The ``torch.nn.Module``, weights loaded from ``model.safetensors``.
        recipe: The recipe instance (``gpucampaign.Recipe``) whose ``model`` built it.
        config: The run's config (``RunConfig``): recipe, args, batch size, seed...
        info: The model folder's ``config.json``.
    """

    out: Path
    run_id: str
    run: str
    model: torch.nn.Module
    recipe: Recipe
    config: RunConfig
    info: Mapping[str, Any] = field(repr=False)

    @property
    def builtin(self) -> bool:
        """Whether a built-in table recipe (``mlp``, ``cnn``) trained the model."""
        return self.config.recipe in BUILTIN_RECIPES

    def predict(
        self, path: str | Path, *, splits: Sequence[str] | None = None
    ) -> list[dict[str, Any]]:
        """The rows the recipe predicts for the examples of ``path``, keyed by their IDs.

        ``path`` is input of the corpus's kind (a file or a folder the recipe's ``datasets``
        reads; a feature table for the built-in recipes). Every split the recipe makes of it
        is predicted in order (``splits`` to choose), each row ``{"id", "split", ...}``: the
        dataset's ``ids`` when it has them, else the position in the split.

        Raises:
            SpecError: The input is missing, or the recipe defines no ``predict``.
        """
        src = Path(path)
        if not src.exists():
            raise ArgumentError(
                f"--input '{src}' does not exist: give a file or a folder.", field="input"
            )
        if self.builtin:
            return self._table_rows(src, splits=splits)
        if type(self.recipe).predict is Recipe.predict:
            raise SpecError(
                f"recipe '{self.config.recipe}' defines no predict(model, batch): add one that "
                "returns a row (a dict) per example of the batch to predict new input.",
                field="recipe",
            )
        corpus = Pinned(
            path=src,
            sha256=input_sha256(src),
            kind="folder" if src.is_dir() else "file",
            inputs=_pinned_inputs(self.info),
        )
        ctx = recipe_context(
            self.config, corpus=corpus, run_id=self.run_id, device=torch.device("cpu")
        )
        datasets = build_datasets(self.recipe, self.config, ctx)
        rows: list[dict[str, Any]] = []
        for name in _chosen(datasets, splits):
            got = recipe_predict_rows(self.recipe, self.model, datasets[name], config=self.config)
            rows += [{"id": r["id"], "split": name, **_without_id(r)} for r in got]
        return rows

    def _table_rows(self, src: Path, *, splits: Sequence[str] | None) -> list[dict[str, Any]]:
        """A built-in recipe's classes and confidences for the rows of a feature table."""
        spec = load_spec(self.out / SPEC_COPY, recipe_folder=False)
        if spec.corpus is None:
            raise SpecError("this campaign has no corpus to read columns from", field="corpus")
        corpus_spec = spec.corpus.model_copy(update={"sha256": input_sha256(src)})
        table = load_corpus(src, corpus_spec=corpus_spec)
        trained = [str(c) for c in self.info.get("classes") or table.classes]
        rows: list[dict[str, Any]] = []
        for name in _chosen(table.splits, splits):
            part = table.split(name)
            pred, conf = predict(self.model, part.X)
            rows += [
                {
                    "id": str(i),
                    "split": name,
                    "label": str(table.classes[int(y)]),
                    "prediction": trained[int(p)] if int(p) < len(trained) else int(p),
                    "confidence": float(c),
                }
                for i, y, p, c in zip(
                    part.ids.tolist(), part.y.tolist(), pred.tolist(), conf.tolist(), strict=True
                )
            ]
        return rows


def _chosen(parts: Mapping[str, Any], splits: Sequence[str] | None) -> list[str]:
    names = [s for s in (splits or INPUT_SPLITS) if s in parts and len(parts[s])]
    if splits and not names:
        raise ArgumentError(
            f"--split {', '.join(splits)}: the input has no such split (it has "
            f"{', '.join(sorted(parts)) or 'none'}).",
            field="split",
        )
    return names


def _without_id(row: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k != "id"}


def _pinned_inputs(info: Mapping[str, Any]) -> dict[str, Pinned]:
    return {
        name: Pinned(path=Path(p["path"]), sha256=p["sha256"], kind=p.get("kind", "file"))
        for name, p in (info.get("inputs") or {}).items()
    }


def resolve_run(out: str | Path, run: str) -> tuple[str, str]:
    """``(run_id, run name)`` of ``run``, a run's name or ID in the folder's manifest (or, before
    the seal, a folder under ``runs/``).

    Raises:
        SpecError: No run by that name or ID, naming the runs that have a model.
    """
    folder = OutputFolder(out)
    try:
        runs = read_manifest(out).get("runs") or {}
    except InputError:
        runs = {}
    names = {rid: str(v.get("run") or rid) for rid, v in runs.items() if isinstance(v, Mapping)}
    if run in names:
        return run, names[run]
    by_name = [rid for rid, name in names.items() if name == run]
    if len(by_name) == 1:
        return by_name[0], run
    if folder.path(model_config(run)).is_file():
        return run, run
    with_model = sorted(
        f"{names.get(rid, rid)} ({rid})"
        for rid in names
        if folder.path(model_config(rid)).is_file()
    )
    raise ArgumentError(
        f"run '{run}' has no model in '{out}': give a run's name or ID; those with a model: "
        f"{', '.join(with_model) or 'none'}.",
        field="RUN",
    )


def load_model(
    out: str | Path,
    run: str,
    *,
    trust_folder_code: bool = False,
    recipes: Iterable[str | Path] = (),
) -> LoadedModel:
    """Reload a run's model and its recipe from a campaign's output folder, on CPU.

    Args:
        out: The output folder ``campaign run --out`` wrote.
        run: The run's name in the spec (``control``, ``wider``) or its run ID.
        trust_folder_code: Import the user's recipe from the copy kept in the folder (only for
            a folder you made, or whose manifest ``campaign verify OUT --expect SHA256``
            checked).
        recipes: Folders of the user's recipe files (the spec's folder), put first on
            ``sys.path``; the recipe file found must have the sha256 recorded with the model.

    Returns:
        The ``LoadedModel``: ``.model``, ``.recipe``, ``.config``, ``.predict(path)``.

    Raises:
        SpecError: No such run or model folder, or the weights fail their hash.
        RecipeCodeNotTrusted: The recipe's only code is the folder's copy, not trusted here.
    """
    root = Path(out)
    for folder in recipes:
        if not Path(folder).is_dir():
            raise ArgumentError(f"--recipes '{folder}' is not a folder.", field="recipes")
        use_recipe_dir(Path(folder))
    run_id, name = resolve_run(root, run)
    info = dict(OutputFolder(root).read_json(model_config(run_id)) or {})
    config = RunConfig.model_validate(info["run_config"])
    threads = torch.get_num_threads()
    model = load_run_model(root, run_id, trust_folder_code=trust_folder_code)
    torch.set_num_threads(threads)
    recipe = load_recipe(config.recipe)
    return LoadedModel(
        out=root,
        run_id=run_id,
        run=str(info.get("run") or name),
        model=model,
        recipe=recipe,
        config=config,
        info=info,
    )


def decision_rows(loaded: LoadedModel, *, split: str) -> list[dict[str, Any]]:
    """The rows of ``predictions.csv`` again: the recipe's prediction of the campaign's own
    corpus (the folder's copy, else where the model recorded it) on ``split``."""
    pinned = corpus_for(loaded.out, dict(loaded.info), None)
    ctx = recipe_context(
        loaded.config, corpus=pinned, run_id=loaded.run_id, device=torch.device("cpu")
    )
    datasets = build_datasets(loaded.recipe, loaded.config, ctx)
    dataset = datasets.get(split) or datasets["train"]
    return prediction_rows(loaded.recipe, loaded.model, dataset, config=loaded.config)
