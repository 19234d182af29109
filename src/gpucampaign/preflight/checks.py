"""The preflight: everything a campaign needs from its inputs, checked before anything starts.

``campaign plan``, ``campaign run`` (before the embedded Prefect server starts and before the
output folder is written) and the deployment flow (before its audit) call ``preflight``. It
writes nothing and raises ``SpecError`` (exit 2, one paragraph) at the first problem:

1. the spec (loaded by ``load_spec``: size, no YAML alias, every number finite and within
   its limit, run IDs computable);
2. the catalog file it names;
3. every pinned path: inside the spec's folder, no link out of it (a folder's files
   included), not empty, the pinned sha256 (a mismatch names both hashes and the
   ``campaign pin`` command that prints the right one); the recipe files are found without
   running them and may not be links out of the spec's folder either;
4. the corpus table's columns and the splits the campaign needs;
5. each distinct recipe: imports, class, methods, and one batch through ``datasets``,
   ``model``, ``loss`` and ``evaluate`` (which must return the decision metric), and
   ``predict`` and ``score`` (when it has them) on one batch of each split the close calls
   them on, on the CPU: the whole recipe runs once before anything trains;
6. the store: ``local``, or the URL, keys, bucket and a probe object of ``s3://``;
7. the tracking server's URI when ``MLFLOW_TRACKING_URI`` names it (the spec's own is
   checked with the spec): ``http(s)://host``, nothing another scheme would make of it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpucampaign.config import (
    BUILTIN_RECIPES,
    CampaignSpec,
    SpecError,
    check_tracking_uri,
    resolve_inside,
    run_size,
)
from gpucampaign.config.recipefile import RecipeError, recipe_file, use_recipe_dir
from gpucampaign.core import clock
from gpucampaign.core.errors import SettingError
from gpucampaign.core.stoprules import StopRule
from gpucampaign.core.storageurl import is_local
from gpucampaign.data.corpus import empty_splits, open_corpus
from gpucampaign.data.pins import resolve_inputs
from gpucampaign.plan.inputs import too_wide
from gpucampaign.plan.lots import refuse_ended_rental
from gpucampaign.plan.tariffs import load_catalog, resolve_package
from gpucampaign.preflight.ownership import closed_for_good
from gpucampaign.preflight.paths import check_pinned, inside
from gpucampaign.recipe.contract import load_recipe
from gpucampaign.recipe.runtime import try_recipes
from gpucampaign.storage import check_storage


@dataclass(frozen=True)
class Preflight:
    """What the preflight checked, one short line per item (``campaign plan`` prints them)."""

    checked: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """The ``preflight`` entry of ``campaign plan --json``."""
        return {"checked": list(self.checked)}


def preflight(
    spec: CampaignSpec,
    *,
    base_dir: str | Path,
    out: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    store_wait_s: float = 0.0,
) -> Preflight:
    """Check everything ``spec`` names before a campaign starts; nothing is written.

    Args:
        spec: The validated spec (``load_spec`` has checked the file itself).
        base_dir: The spec's folder: its paths are relative to it, its recipes import from it.
        out: The output folder of a rerun, whose kept copies of the pinned inputs count.
        env: The environment the store's variables come from (default: ``os.environ``).
        store_wait_s: How long the store's probe waits for a store that does not answer (a
            campaign's start: ``storage.read_wait_s``; ``campaign plan``: 0).

    Raises:
        SpecError: The first problem found, in one paragraph naming the field or file and
            the fix (a bad recipe is a ``RecipeError``).
    """
    base = Path(base_dir).resolve()
    use_recipe_dir(base)
    runs = spec.run_names()
    checked = [
        f"spec '{spec.name}': {len(spec.calendar)} calendar step(s), {len(runs)} run(s); "
        "every number finite and within its limit"
    ]
    if out is None or closed_for_good(out) is None:  # a closed one is only verified again
        refuse_ended_rental(spec, now=clock.now())
    _gpus_and_storage(spec)
    catalog = load_catalog(spec=spec, base_dir=base)
    if spec.catalog is not None:
        checked.append(
            f"catalog '{spec.catalog}': inside the spec's folder, {len(catalog.lots)} lot(s)"
        )
    checked += _gpus_fit_a_lot(spec, catalog=catalog)
    checked += _recipe_files(spec, base=base)
    corpus_path = None
    if spec.corpus is not None:
        corpus_path = resolve_inside(base, spec.corpus.path, field="corpus.path")
        what = check_pinned(
            corpus_path,
            sha256=spec.corpus.sha256,
            field="corpus",
            shown=spec.corpus.path,
            label="corpus",
        )
        checked.append(f"corpus '{spec.corpus.path}': {what}, sha256 as pinned, no link out")
    input_paths = _input_paths(spec, base=base, out=out)
    for name, path in input_paths.items():
        item = spec.inputs[name]
        what = check_pinned(
            path,
            sha256=item.sha256,
            field=f"inputs.{name}",
            shown=item.path,
            label=f"input '{name}'",
        )
        checked.append(f"input '{name}' ('{item.path}'): {what}, sha256 as pinned, no link out")
    if corpus_path is not None:
        checked += _corpus_and_recipes(spec, path=corpus_path, base=base, inputs=input_paths)
    elif spec.control is not None:
        for recipe in sorted({spec.run_config(r).recipe for r in runs}):
            load_recipe(recipe)
            checked.append(f"recipe '{recipe}': imports, class and methods (no corpus to try)")
    check_storage(spec.storage.url, env=env, wait_s=store_wait_s)
    _check_tracking_env(spec, env=os.environ if env is None else env)
    checked.append(
        "storage local: checkpoints in the output folder"
        if is_local(spec.storage.url)
        else f"storage {spec.storage.url}: URL, keys and bucket answered a probe object"
    )
    return Preflight(checked=tuple(checked))


def _gpus_and_storage(spec: CampaignSpec) -> None:
    """A data-parallel run (``gpus`` above 1) keeps its checkpoints in the output folder: its
    training processes cannot be handed a client of a remote store, which the pilot would
    otherwise find out after the campaign started."""
    if spec.control is None or is_local(spec.storage.url):
        return
    wide = [(r, spec.run_config(r).gpus) for r in spec.base_names()]
    wide = [(r, n) for r, n in wide if n > 1]
    if wide:
        run, gpus = wide[0]
        field = "control.gpus" if run == "control" else f"variants.{run}.changes.gpus"
        raise SpecError(
            f"fields '{field}' and 'storage.url': run '{run}' trains on gpus: {gpus} "
            f"(data-parallel), and storage.url is '{spec.storage.url}'; a data-parallel run "
            "keeps its checkpoints in the output folder. Set storage.url: local, or gpus: 1 "
            "for that run.",
            field="gpus",
        )


def _gpus_fit_a_lot(spec: CampaignSpec, *, catalog: Any) -> list[str]:
    """Every run's ``gpus`` fits one lot's machine: a data-parallel run takes that many slots
    of the GPU lock at once, and more than any lot holds would never be granted. The planner
    refuses such a calendar step; this covers every run the campaign trains, on the calendar
    or not, before ``campaign run`` starts anything."""
    if spec.control is None:
        return []
    packages = tuple(resolve_package(p, catalog, index=i) for i, p in enumerate(spec.packages))
    largest = max((p.gpus_per_lot for p in packages), default=0)
    steps = {s.run: s.name for s in reversed(spec.calendar) if s.run}
    for run in spec.base_names():
        gpus = run_size(spec.run_config(run)).processes
        if gpus > largest:
            field = "control.gpus" if run == "control" else f"variants.{run}.changes.gpus"
            step = steps.get(run)
            what = (
                f"calendar step '{step}' runs '{run}' with gpus: {gpus}"
                if step
                else f"field '{field}': run '{run}' trains with gpus: {gpus}"
            )
            raise too_wide(what, gpus, packages)
    wide = max(run_size(spec.run_config(r)).processes for r in spec.base_names())
    return [f"gpus: {wide} for the widest run, within one lot's {largest}"] if wide > 1 else []


def _check_tracking_env(spec: CampaignSpec, *, env: Mapping[str, str]) -> None:
    """``MLFLOW_TRACKING_URI`` checked as the spec's URI is (credentials aside: the
    environment is where they belong), when the spec names no server of its own."""
    uri = env.get("MLFLOW_TRACKING_URI")
    if not uri or (spec.tracking.mlflow is not None and spec.tracking.mlflow.uri):
        return
    try:
        check_tracking_uri(uri, credentials=True)
    except ValueError as exc:
        raise SettingError(
            f"MLFLOW_TRACKING_URI '{uri}': {exc}; or unset it to run without tracking.",
            field="MLFLOW_TRACKING_URI",
        ) from None


def _recipe_files(spec: CampaignSpec, *, base: Path) -> list[str]:
    """The spec's own recipe files, found without running them: a file found in the spec's
    folder may not be a link out of it (installed packages are outside it by design)."""
    lines = []
    recipes = sorted({spec.run_config(r).recipe for r in spec.run_names()} - set(BUILTIN_RECIPES))
    for recipe in recipes:
        path = recipe_file(recipe)
        found_here = base == path.parent or base in path.parents
        if found_here and not inside(path, root=base):
            raise RecipeError(
                recipe,
                "import",
                f"'{path.relative_to(base).as_posix()}' is a link to '{path.resolve()}', outside "
                "the spec's folder; copy the file into the folder instead of linking it",
            )
        where = path.relative_to(base).as_posix() if found_here else str(path)
        lines.append(f"recipe file of '{recipe}': {where}")
    return lines


def _input_paths(spec: CampaignSpec, *, base: Path, out: str | Path | None) -> dict[str, Path]:
    """Where each pinned input is (``pins.resolve_inputs``): the spec's folder, or the copy
    a rerun's output folder keeps."""
    if not spec.inputs:
        return {}
    kept = Path(out) if out is not None and Path(out).is_dir() else None
    return resolve_inputs(spec, base_dir=base, out=kept)


def _corpus_and_recipes(
    spec: CampaignSpec, *, path: Path, base: Path, inputs: dict[str, Path]
) -> list[str]:
    """The corpus opened as the runs will open it (a table: its columns and splits), and
    each distinct recipe tried on one batch of it."""
    assert spec.corpus is not None
    try:
        corpus = open_corpus(path, spec=spec, base_dir=base, input_paths=inputs)
    except StopRule as exc:  # the pins were checked above; a file changed since
        raise SpecError(
            f"field 'corpus': {exc.reason}; rerun once the files stay put.", field="corpus"
        ) from None
    lines = []
    if hasattr(corpus, "splits"):
        hard = [
            f["message"]
            for f in empty_splits(
                corpus, decision_split=spec.decision_split, select_split=spec.selection_split
            )
            if f["severity"] == "hard"
        ]
        if hard:
            raise SpecError(
                f"field 'corpus': the table '{spec.corpus.path}' has no rows for what the "
                f"campaign needs: {'; '.join(hard)}; fix: mark rows of the table with these "
                f"splits in column '{spec.corpus.split_column}' (train, val, test) and pin it "
                "again.",
                field="corpus",
            )
        sizes = ", ".join(f"{n} {len(s)}" for n, s in corpus.splits.items())
        checked = (
            f"corpus table: columns {spec.corpus.id_column}, {spec.corpus.split_column}, "
            f"{spec.corpus.label_column} + {corpus.n_features} feature(s); rows {sizes}"
        )
        lines.append(checked)
    if spec.control is None:
        return lines

    metric = spec.decision_rule.metric if spec.decision_rule else None
    for tried in try_recipes(spec, corpus=corpus):
        sizes = ", ".join(f"{n} {k}" for n, k in tried["splits"].items())
        returns = f"evaluate returns '{metric}'" if metric else "evaluate ran"
        lines.append(
            f"recipe '{tried['recipe']}' ({', '.join(tried['runs'])}): imports, datasets "
            f"({sizes}), model, one batch through loss, {returns}{tried['outputs']} (on the CPU)"
        )
    return lines
