"""The manifest that closes an output folder, and what it records.

``manifest.json`` lists every file with its size and sha256, the runs and their statuses, the
environment a reload depends on and the corpus (copied under ``data/`` when small, else
referenced by location and hash). ``RELOAD.md`` gives the commands to check and reload.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from gpucampaign.config import CampaignSpec, SpecError, resolve_inside, spec_sha256
from gpucampaign.core.errors import FolderError, InputError
from gpucampaign.core.files import git_commit, sha256_file, utc_now
from gpucampaign.data.pins import folder_manifest, manifest_sha256
from gpucampaign.folder.layout import (
    CHECKPOINTS_DIR,
    DATA_DIR,
    FIGURES_DIR,
    INPUTS,
    INPUTS_DIR,
    LOCK_FILE,
    MANIFEST,
    PARAMS_FILE,
    PLAN,
    PLAN_SHA,
    RUNS_DIR,
    SPEC_COPY,
    SPOOL_DIR,
    OutputFolder,
    is_live_progress,
    run_relpath,
)

CORPUS_COPY_LIMIT = 50 * 1024 * 1024
# Names the output folder writes itself: a catalog copied in must not land on one of them.
_RESERVED_TOPS = (
    RUNS_DIR,
    CHECKPOINTS_DIR,
    SPOOL_DIR,
    DATA_DIR,
    INPUTS_DIR,
    FIGURES_DIR,
    SPEC_COPY,
    PLAN,
    PLAN_SHA,
    MANIFEST,
    INPUTS,
)
MANIFEST_FORMAT = "gpucampaign.manifest/1"


def list_files(root: str | Path) -> list[str]:
    """Relative posix paths of every file under ``root`` except ``manifest.json``, sorted.

    The checkpoint spool (files waiting for the S3 server, deleted once uploaded), the
    writer's lock file and the runs' live ``progress.json`` are not files of the campaign's
    output and are left out."""
    base = Path(root)
    out = []
    for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
        dirnames.sort()
        for name in filenames:
            rel = (Path(dirpath) / name).relative_to(base).as_posix()
            if is_live_progress(rel):
                continue  # the live progress of a training call: rewritten, never sealed
            if rel not in (MANIFEST, LOCK_FILE) and not rel.startswith(f"{SPOOL_DIR}/"):
                out.append(rel)
    return sorted(out)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def collect_environment(*, cwd: str | Path | None = None) -> dict[str, Any]:
    """Versions that a reload depends on; no paths, no host names, no credentials."""
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": f"{platform.system()}-{platform.machine()}",
        "gpucampaign": _version("gpucampaign"),
        "torch": _version("torch"),
        "safetensors": _version("safetensors"),
        "numpy": _version("numpy"),
        "scikit-learn": _version("scikit-learn"),
        "prefect": _version("prefect"),
        "git_commit": git_commit(cwd),
    }
    env["cuda"] = torch.version.cuda
    env["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return env


def reference_corpus(
    root: str | Path,
    corpus_path: str | Path,
    *,
    sha256: str | None = None,
    copy_limit_bytes: int = CORPUS_COPY_LIMIT,
    under: str = "data",
    what: str = "corpus",
) -> dict[str, Any]:
    """Keep the corpus with the outputs: a copy under ``data/`` when small, else a reference.

    Args:
        root: the output folder.
        corpus_path: the corpus file (or pinned folder) the campaign used.
        sha256: its pinned hash (checked when given).
        copy_limit_bytes: files below this size are copied (50 MB by default).
        under: the folder of the copy (a pinned input: ``inputs/<name>``).
        what: the spec field it comes from, for errors (``corpus``, ``inputs.<name>``).

    Returns:
        ``{kind: "copied", path: "<under>/<name>", sha256, size}`` or
        ``{kind: "external", location: "<absolute path>", sha256, size}``.

    Raises:
        SpecError: the file is missing or does not have the pinned hash.
    """
    src = Path(corpus_path)
    if src.is_dir():
        return _reference_folder(
            root, src, sha256=sha256, copy_limit_bytes=copy_limit_bytes, under=under, what=what
        )
    if not src.is_file():
        raise SpecError(f"{what} file '{src}' does not exist", field=f"{what}.path")
    digest = sha256_file(src)
    if sha256 is not None and digest != sha256:
        raise SpecError(
            f"{what} file '{src}' has sha256 {digest}, not the pinned {sha256}",
            field=f"{what}.sha256",
        )
    size = src.stat().st_size
    ref: dict[str, Any] = {"sha256": digest, "size": size, "name": src.name}
    if size < copy_limit_bytes:
        rel = f"{under}/{src.name}"
        folder = OutputFolder(root)
        if not folder.path(rel).is_file() or sha256_file(folder.path(rel)) != digest:
            folder.copy_in(src, rel)
        return {"kind": "copied", "path": rel, **ref}
    return {"kind": "external", "location": str(src.resolve()), **ref}


def keep_inputs(root: str | Path, spec: CampaignSpec, *, base_dir: str | Path) -> dict[str, Any]:
    """Copy the files the spec names into the output folder and record them in ``inputs.json``.

    The catalog lands at the same relative path as the spec names it, so the ``spec.yaml``
    kept in the folder resolves it there; the corpus is kept as ``reference_corpus`` keeps it
    (copied under ``data/`` when small). A corpus that is missing or fails its pinned hash is
    left to the data audit, which stops the campaign with its own record.

    Returns:
        ``{"catalog": {path, sha256, size} | None, "corpus": reference_corpus() | None,
        "pinned": {name: {spec_path, sha256, kind: copied | external | missing, ...}}}``; a
        pinned input is kept as ``reference_corpus`` keeps the corpus, under
        ``inputs/<name>/``.

    Raises:
        SpecError: The catalog file is missing, or its path would overwrite a campaign record.
    """
    folder = OutputFolder(root)
    kept: dict[str, Any] = {"catalog": None, "corpus": None}
    if spec.catalog is not None:
        rel = Path(spec.catalog).as_posix()
        if rel.split("/")[0] in _RESERVED_TOPS:
            raise SpecError(
                f"field 'catalog': '{rel}' is a name the output folder uses; move "
                "the catalog file to another name.",
                field="catalog",
            )
        src = resolve_inside(base_dir, spec.catalog, field="catalog")
        if not src.is_file():
            raise SpecError(
                f"field 'catalog': catalog file '{src}' does not exist.", field="catalog"
            )
        digest = sha256_file(src)
        target = folder.path(rel)
        if target.resolve() != src.resolve() and (
            not target.is_file() or sha256_file(target) != digest
        ):
            folder.copy_in(src, rel)
        kept["catalog"] = {"path": rel, "sha256": digest, "size": src.stat().st_size}
    if spec.corpus is not None:
        try:
            kept["corpus"] = reference_corpus(
                root,
                resolve_inside(base_dir, spec.corpus.path, field="corpus.path"),
                sha256=spec.corpus.sha256,
            )
        except InputError:
            kept["corpus"] = None
    # Pinned inputs (a base model, an adapter) by their exact hash: the revision each model of
    # this campaign was trained from, kept like the corpus (copied when small).
    kept["pinned"] = {}
    for name, item in spec.inputs.items():
        ref: dict[str, Any] = {"spec_path": item.path, "sha256": item.sha256, "kind": "missing"}
        try:
            src = resolve_inside(base_dir, item.path, field=f"inputs.{name}.path")
            ref |= reference_corpus(
                root, src, sha256=item.sha256, under=f"{INPUTS_DIR}/{name}", what=f"inputs.{name}"
            )
        except InputError:
            pass  # missing or altered: the run that needs it stops with its own record
        kept["pinned"][name] = ref
    folder.write_json(INPUTS, kept)
    return kept


def _reference_folder(
    root: str | Path, src: Path, *, sha256: str | None, copy_limit_bytes: int, under: str, what: str
) -> dict[str, Any]:
    """``reference_corpus`` for a folder pinned by its manifest."""
    rows = folder_manifest(src)
    digest = manifest_sha256(rows)
    if sha256 is not None and digest != sha256:
        raise SpecError(
            f"{what} folder '{src}' has manifest sha256 {digest}, not the pinned {sha256}",
            field=f"{what}.sha256",
        )
    size = sum(r["size"] for r in rows)
    ref: dict[str, Any] = {
        "sha256": digest,
        "size": size,
        "name": src.name,
        "kind_of": "folder",
        "files": len(rows),
    }
    if size >= copy_limit_bytes:
        return {"kind": "external", "location": str(src.resolve()), **ref}
    folder = OutputFolder(root)
    for r in rows:
        rel = f"{under}/{src.name}/{r['path']}"
        if not folder.path(rel).is_file() or sha256_file(folder.path(rel)) != r["sha256"]:
            folder.copy_in(src / r["path"], rel)
    return {"kind": "copied", "path": f"{under}/{src.name}", **ref}


def build_manifest(
    root: str | Path,
    *,
    spec: CampaignSpec,
    campaign_id: str,
    expected_runs: Mapping[str, Mapping[str, Any]],
    verdict: Any,
    stops: Sequence[Mapping[str, Any]],
    decisions: Sequence[Mapping[str, Any]],
    budget: Mapping[str, Any],
    environment: Mapping[str, Any],
    corpus_ref: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """Write ``manifest.json``: IDs, hashes, runs and statuses, every file with size and sha256.

    Build it last: it lists every file present (except itself), so anything written after it
    shows up in ``verify_output`` as a file missing from the manifest.

    Args:
        root: the output folder.
        spec: the campaign spec (its sha256 is recorded).
        campaign_id: the campaign's ID.
        expected_runs: ``{run_id: {run, tier, status, stop_id?}}`` for every run of the spec;
            status ``completed`` requires the run's files and a reloadable model.
        verdict: the verdict (``Verdict`` or its dict).
        stops: ``stops.jsonl`` records.
        decisions: ``decisions.jsonl`` records.
        budget: the budget close (``close_budget``).
        environment: ``collect_environment()``.
        corpus_ref: ``reference_corpus()``, None when the spec has no corpus.

    Returns:
        The manifest dict written.

    Raises:
        SpecError: ``plan.sha256`` (written at the start) is missing.
    """
    folder = OutputFolder(root)
    plan_sha = folder.plan_sha256()
    if plan_sha is None:
        raise FolderError(
            f"'{folder.path(PLAN_SHA)}' is missing: the plan must be written with "
            "write_plan_once at the start",
            field="out",
        )
    manifest = {
        "format": MANIFEST_FORMAT,
        "campaign_id": campaign_id,
        "campaign": spec.name,
        "question": spec.question,
        "created_at": utc_now(),
        "spec_sha256": spec_sha256(spec),
        # Left out of spec_sha256 (the campaign's identity), sealed here: where the folder
        # says its runs are tracked is read by `campaign track` and checked by `verify`.
        "tracking": spec.tracking.model_dump(mode="json"),
        "plan_sha256": plan_sha,
        "runs": {rid: {**v, **_device_of(folder, rid)} for rid, v in expected_runs.items()},
        "verdict": verdict.to_dict() if hasattr(verdict, "to_dict") else verdict,
        "stops": list(stops),
        "decisions": list(decisions),
        "budget": dict(budget),
        "environment": dict(environment),
        "corpus": None if corpus_ref is None else dict(corpus_ref),
        "inputs": folder.read_json(INPUTS),
        "files": _file_entries(folder.root),
    }
    folder.write_json(MANIFEST, manifest)
    return manifest


def _device_of(folder: OutputFolder, run_id: str) -> dict[str, Any]:
    """``{"device": ...}`` as the run's ``params.json`` recorded it (empty when it never ran)."""
    params = folder.read_json(run_relpath(run_id, PARAMS_FILE)) or {}
    return {"device": params["device"]} if params.get("device") else {}


def _file_entries(root: Path) -> list[dict[str, Any]]:
    return [
        {"path": rel, "size": (root / rel).stat().st_size, "sha256": sha256_file(root / rel)}
        for rel in list_files(root)
    ]
