"""A model folder: save a trained model as a reloadable folder, load it back, predict.

A model folder holds ``model.safetensors`` (weights and the input statistics) and
``config.json`` (the run config, recipe, sizes, library versions, git commit, file hashes).
``load_model_dir`` rebuilds the model from ``config.json`` alone: no pickle is ever loaded.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from gpucampaign.builtin.models import build_model
from gpucampaign.checkpoint.state import rng_untouched
from gpucampaign.config import RunConfig, SpecError
from gpucampaign.config.recipefile import check_recipe_source, recipe_file, use_recipe_dir
from gpucampaign.core.errors import FolderError
from gpucampaign.core.files import (
    TMP_PREFIX,
    atomic_write_bytes,
    git_commit,
    replace_dir,
    sha256_file,
)
from gpucampaign.core.version import __version__
from gpucampaign.folder.layout import (
    MANIFEST,
    MODEL_CONFIG,
    MODEL_DIR,
    PARAMS_FILE,
    WEIGHTS_FILE,
    OutputFolder,
    model_config,
    run_relpath,
)
from gpucampaign.recipe.contract import Pinned, RecipeContext, call, load_recipe

MODEL_FORMAT = "gpucampaign-model/1"


@functools.cache
def _git_state() -> dict[str, Any]:
    """``{"commit": sha or None, "dirty": bool or None}`` of the checkout holding the library
    (none for an installed copy).

    Asked once a process: the library that trains is the one this process imported at its
    start, whatever is committed later; and each ask runs three ``git`` processes (6-15 ms
    at every run's end, more than the rest of the demo's model folder).
    """
    here = Path(__file__).resolve()
    commit = git_commit(here.parent, tracking=here)
    if commit is None:
        return {"commit": None, "dirty": None}
    return {"commit": commit.removesuffix("-dirty"), "dirty": commit.endswith("-dirty")}


def library_versions() -> dict[str, str]:
    """Versions that a reload must match or at least know about."""
    import safetensors

    return {
        "gpucampaign": __version__,
        "torch": torch.__version__,
        "safetensors": safetensors.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
    }


def save_model_dir(
    model: nn.Module,
    path: str | Path,
    *,
    config: RunConfig,
    n_features: int | None = None,
    n_classes: int | None = None,
    extra: dict[str, Any] | None = None,
    sources: dict[str, Path] | None = None,
) -> dict[str, Any]:
    """Write ``path/model.safetensors`` and ``path/config.json``, replacing ``path`` atomically.

    Args:
        model: The trained model (any device).
        path: The model folder to create (e.g. ``OUT/runs/<run_id>/model``).
        config: The run config that built the model.
        n_features: Input width (built-in recipes).
        n_classes: Number of classes (built-in recipes).
        extra: More JSON fields for ``config.json`` (run_id, classes, corpus sha256, the
            recipe's args and file hash...).
        sources: Files copied into the folder at these relative paths (a user's recipe
            source, so the folder rebuilds its model on its own); hashed in ``files``.

    Returns:
        The content written to ``config.json``.
    """
    from safetensors.torch import save_file

    dst = Path(path)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f"{TMP_PREFIX}{dst.name}-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    try:
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
        save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": MODEL_FORMAT})
        with open(tmp / WEIGHTS_FILE, "rb+") as f:
            os.fsync(f.fileno())
        weights = tmp / WEIGHTS_FILE
        copied = _copy_sources(tmp, sources or {})
        info = {
            "format": MODEL_FORMAT,
            "recipe": config.recipe,
            "args": config.args,
            "run_config": config.model_dump(mode="json"),
            **({"n_features": n_features, "n_classes": n_classes} if n_features else {}),
            "versions": library_versions(),
            "git": dict(_git_state()),  # a copy: the cached one stays as asked
            "base_model_revision": None,
            "files": {
                WEIGHTS_FILE: {"sha256": sha256_file(weights), "bytes": weights.stat().st_size},
                **copied,
            },
            **(extra or {}),
        }
        text = json.dumps(info, indent=2, sort_keys=True) + "\n"
        atomic_write_bytes(tmp / MODEL_CONFIG, text.encode())
        replace_dir(dst, tmp)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return info


def _copy_sources(folder: Path, sources: dict[str, Path]) -> dict[str, dict[str, Any]]:
    """Copy ``sources`` into ``folder`` at their relative paths; their ``files`` entries."""
    copied = {}
    for rel, src in sources.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, folder / rel)
        copied[rel] = {"sha256": sha256_file(folder / rel), "bytes": (folder / rel).stat().st_size}
    return copied


class RecipeCodeNotTrusted(SpecError):
    """A user's recipe that is not rebuilt: the only code found for it is the model folder's
    own copy (or a file with another sha256: ``found``, its path), and that copy is not
    trusted here."""

    found: str | None = None


def load_model_dir(
    path: str | Path, *, map_location: str = "cpu", trust_folder_code: bool = False
) -> nn.Module:
    """Rebuild a model saved by ``save_model_dir`` (safetensors only), in eval mode.

    Args:
        path: the model folder.
        map_location: the device the weights are read onto.
        trust_folder_code: a user's recipe may be imported from the copy kept in the folder
            (only for a folder whose manifest is anchored, or that the user vouches for);
            otherwise it is imported as installed or from a spec's folder on ``sys.path``.

    Raises:
        SpecError: The folder, a file or a field is missing, or the weights fail their hash.
        RecipeCodeNotTrusted: A user's recipe found only in the folder, untrusted.
    """
    from safetensors.torch import load_file

    folder = Path(path)
    cfg_path, w_path = folder / MODEL_CONFIG, folder / WEIGHTS_FILE
    if not cfg_path.is_file() or not w_path.is_file():
        raise FolderError(
            f"'{folder}' is not a model folder: it needs {MODEL_CONFIG} and {WEIGHTS_FILE}.",
            field="model",
        )
    info = json.loads(cfg_path.read_text(encoding="utf-8"))
    if info.get("format") != MODEL_FORMAT:
        raise FolderError(
            f"'{cfg_path}': unknown format {info.get('format')!r} (want {MODEL_FORMAT}).",
            field="model",
        )
    want = info.get("files", {}).get(WEIGHTS_FILE, {}).get("sha256")
    if want and sha256_file(w_path) != want:
        raise FolderError(
            f"'{w_path}' does not match the sha256 recorded in {MODEL_CONFIG}.", field="model"
        )
    config = RunConfig.model_validate(info["run_config"])
    with rng_untouched():  # runs may train in other threads of this process (their RNG slots)
        if config.builtin:
            model = build_model(
                config, n_features=int(info["n_features"]), n_classes=int(info["n_classes"])
            )
        else:
            model = rebuild_recipe_model(
                info,
                config=config,
                folder=folder,
                device=map_location,
                trust_folder_code=trust_folder_code,
            )
    model.load_state_dict(load_file(str(w_path), device=map_location), strict=True)
    return model.to(map_location).eval()


def rebuild_recipe_model(
    info: dict[str, Any],
    *,
    config: RunConfig,
    folder: Path,
    device: str,
    trust_folder_code: bool = False,
) -> nn.Module:
    """The untrained model of a user's recipe, rebuilt through the recipe from ``config.json``.

    With ``trust_folder_code``, the copy of the recipe's source kept in ``folder/recipe/`` is
    put first on ``sys.path``; without it, the recipe is imported as installed (or from a
    spec's folder on ``sys.path``), never from the output folder holding the model. Either way
    its file must have the recorded sha256, so the weights meet the code that made them.
    Pinned paths are the spec's (relative).

    Raises:
        SpecError: The recipe does not import, or its file changed since the model was saved.
        RecipeCodeNotTrusted: Without ``trust_folder_code``, no trusted file of the recipe
            with the recorded sha256 was found (nothing of the folder was imported).
    """

    want = info.get("recipe_sha256")
    if not isinstance(want, str) or not want:
        # The sha256 is what ties the weights to the code: without it no file is trusted.
        raise FolderError(
            f"recipe '{config.recipe}': '{folder / MODEL_CONFIG}' records no recipe_sha256, so "
            "no recipe file can be checked and none is imported; reload a model folder as the "
            "campaign saved it (its config.json records the recipe file's sha256).",
            field="recipe_sha256",
        )
    if trust_folder_code:
        if (folder / "recipe").is_dir():
            use_recipe_dir(folder / "recipe")
        origin = recipe_file(config.recipe)
        if sha256_file(origin) != want:
            raise FolderError(
                f"recipe '{config.recipe}': its file changed since the model was saved "
                f"(recorded sha256 {want}); restore that version to reload.",
                field="model",
            )
    else:
        origin = _trusted_recipe_file(config.recipe, want=want, folder=folder)
    check_recipe_source(config.recipe, origin)  # resolved and hashed: only now imported
    recipe = load_recipe(config.recipe)
    pins = {
        name: Pinned(path=Path(p["path"]), sha256=p["sha256"], kind=p.get("kind", "file"))
        for name, p in (info.get("inputs") or {}).items()
    }
    corpus = info.get("corpus")
    ctx = RecipeContext(
        args=dict(config.args),
        device=torch.device(device),
        seed=config.seed,
        run_id=str(info.get("run_id", "")),
        inputs=pins,
        config=config,
        corpus=(
            Pinned(
                path=Path(corpus["path"]), sha256=corpus["sha256"], kind=corpus.get("kind", "file")
            )
            if corpus and corpus.get("path")
            else None
        ),
    )
    return call(config.recipe, "model", recipe.model, ctx)


def _output_folder_of(folder: Path) -> Path:
    """The output folder holding a model folder (the first parent with a manifest), else the
    model folder itself."""
    folder = folder.resolve()
    return next((p for p in (folder, *folder.parents) if (p / MANIFEST).is_file()), folder)


def _trusted_recipe_file(recipe: str, *, want: str, folder: Path) -> Path:
    """The recipe's file found on ``sys.path`` outside the output folder, with the recorded
    sha256 (found without running it).

    Raises:
        RecipeCodeNotTrusted: None found, or the one found is in the output folder or has
            another sha256.
    """
    from gpucampaign.config.recipefile import RecipeError, recipe_file

    try:
        origin: Path | None = recipe_file(recipe)
    except RecipeError:
        origin = None
    owner = _output_folder_of(folder)
    if origin is not None and origin.resolve().is_relative_to(owner):
        origin = None  # the folder's own code: trusted only when asked
    if origin is not None and sha256_file(origin) != want:
        why = f"the recipe's file found, '{origin}', has another sha256 than the recorded {want}"
    elif origin is None:
        why = (
            "only the output folder holds its code; no installed or spec-folder copy of the "
            f"module was found (recorded sha256 {want})"
        )
    else:
        return origin
    refused = RecipeCodeNotTrusted(
        f"recipe '{recipe}' not imported: {why}. The folder's copy of the code runs only when "
        "the manifest is anchored (`campaign verify OUT --expect SHA256`, the sha256 the close "
        "printed) or with `--trust-folder-code`; or give the recipe's folder with "
        "`--recipes DIR`.",
        field="model",
    )
    refused.found = None if origin is None else str(origin)
    raise refused


@torch.no_grad()
def predict(
    model: nn.Module, X: np.ndarray | torch.Tensor, *, batch_size: int = 4096
) -> tuple[np.ndarray, np.ndarray]:
    """Class indices and their softmax probability, in float32 without autocast.

    Deterministic on CPU for a fixed thread count; the model's train/eval mode is restored.
    """
    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        X_t = torch.as_tensor(X, dtype=torch.float32)
        preds, confs = [], []
        for start in range(0, len(X_t), batch_size):
            logits = model(X_t[start : start + batch_size].to(device)).float()
            prob = torch.softmax(logits, dim=1)
            conf, pred = prob.max(dim=1)
            preds.append(pred.cpu())
            confs.append(conf.cpu())
        if not preds:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        return torch.cat(preds).numpy().astype(np.int64), torch.cat(confs).numpy().astype(
            np.float32
        )
    finally:
        model.train(was_training)


def _threads_of(*docs: Any) -> int:
    """The run's torch thread count (model config.json or params.json); 1 when absent."""
    for doc in docs:
        if not isinstance(doc, Mapping):
            continue
        if isinstance(doc.get("threads"), int):
            return int(doc["threads"])
        for key in ("run_config", "config"):
            if isinstance(doc.get(key), Mapping) and isinstance(doc[key].get("threads"), int):
                return int(doc[key]["threads"])
    return 1


def load_run_model(root: str | Path, run_id: str, *, trust_folder_code: bool = False) -> Any:
    """Load ``runs/<run_id>/model/`` on CPU with the run's recorded thread count
    (``trust_folder_code``: see ``load_model_dir``)."""
    import torch

    folder = OutputFolder(root)
    docs = []
    for rel in (model_config(run_id), run_relpath(run_id, PARAMS_FILE)):
        try:
            docs.append(folder.read_json(rel))
        except ValueError:
            docs.append(None)  # an unreadable file is named by load_model_dir / the verifier
    torch.set_num_threads(_threads_of(*docs))
    model = load_model_dir(
        folder.path(run_relpath(run_id, MODEL_DIR)), trust_folder_code=trust_folder_code
    )
    if hasattr(model, "eval"):
        model.eval()
    return model
