"""The job a data-parallel run hands to its ranks: JSON, never pickle, kept outside the output
folder and checked by its sha256.

``launch.py`` writes it (``job_bytes``, ``write_private``) into its private temporary folder
(``tempfile.mkdtemp``: mode 0700, outside the output folder, removed after the run); each rank
(``worker.py``) reads it back (``open_job``, ``build_job``), given the sha256 on its command
line, and refuses a file that does not match it. The job holds data only, no code and no copy of the
corpus:

- the spec as its validated JSON (parsed again in the rank) and the run's name and ID (the rank
  resolves the run itself and must find the same ID: a recipe file changed since the launch is
  refused);
- where the pinned corpus and inputs are, with their sha256: each rank loads and checks them
  itself, as the launching process did;
- the local checkpoint store's folder, the run folder, the call's arguments, the folders
  recipes are imported from, and the two files of the launch (rank 0's outcome, the launcher's
  stop request), beside the job in the same private folder.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpucampaign.config import CampaignSpec, SpecError, parse_spec
from gpucampaign.config.recipefile import RECIPE_DIRS, use_recipe_dir
from gpucampaign.core.files import sha256_bytes
from gpucampaign.data.corpus import Corpus, load_corpus
from gpucampaign.data.pins import Pinned, pin
from gpucampaign.engine.setup import RunJob
from gpucampaign.folder.layout import RunFolder
from gpucampaign.storage import LocalStore

#: The version of the job's JSON; a rank refuses any other.
JOB_FORMAT = 1


class JobRefused(RuntimeError):
    """A rank's job file is not the one its launcher wrote (replaced, altered or unreadable):
    nothing of it is used."""


@dataclass(frozen=True, kw_only=True)
class HandedJob:
    """What a rank reads from its job: the training call and the launch's two files."""

    job: RunJob
    outcome_file: Path
    stop_file: Path


def job_bytes(job: RunJob, *, outcome_file: Path, stop_file: Path) -> bytes:
    """The JSON every rank of ``job`` reads (its sha256 goes on the ranks' command line).

    Raises:
        SpecError: The corpus or the store cannot be handed to other processes (an S3 store, a
            corpus that is not a pinned file or folder).
    """
    spec = job.spec.model_dump(mode="json")
    if job.spec.control is not None:  # a replicate's seeds are left out of a config's dump
        spec["control"]["seeds"] = list(job.spec.control.seeds)
    data = {
        "format": JOB_FORMAT,
        "spec": spec,
        "run": {"name": job.run.name, "run_id": job.run.run_id},
        "corpus": _corpus_record(job),
        "store": _store_record(job),
        "run_folder": {
            "path": os.path.abspath(job.run_folder.path),
            "out": os.path.abspath(job.run_folder.out) if job.run_folder.out else None,
        },
        "stop_after_steps": job.stop_after_steps,
        "checkpoint_every": job.checkpoint_every,
        "lane": job.lane,
        "probe_eval": job.probe_eval,
        "recipe_dirs": list(RECIPE_DIRS),
        "outcome_file": str(outcome_file),
        "stop_file": str(stop_file),
    }
    return json.dumps(data, sort_keys=True, allow_nan=False).encode("utf-8")


def _refusal(job: RunJob, what: str) -> SpecError:
    return SpecError(
        f"field 'gpus': run {job.run.run_id} has gpus: {job.run.config.gpus}, and its {what} "
        "cannot be handed to the training processes; use a local store and the spec's pinned "
        "corpus, or gpus: 1.",
        field="gpus",
    )


def _corpus_record(job: RunJob) -> dict[str, Any]:
    corpus = job.corpus
    if isinstance(corpus, Corpus):
        pinned = job.spec.corpus
        if pinned is None or pinned.sha256 != corpus.sha256:
            raise _refusal(job, "corpus (not the spec's pinned one)")
        kind = "table"
    elif isinstance(corpus, Pinned):
        kind = "pinned"
    else:
        raise _refusal(job, f"corpus ({type(corpus).__name__})")
    return {
        "kind": kind,
        "path": os.path.abspath(corpus.path),
        "sha256": corpus.sha256,
        "inputs": {
            name: {"path": os.path.abspath(p.path), "sha256": p.sha256}
            for name, p in corpus.inputs.items()
        },
    }


def _store_record(job: RunJob) -> dict[str, Any]:
    if type(job.store) is not LocalStore:
        raise _refusal(job, f"checkpoint store ({type(job.store).__name__})")
    return {"kind": "local", "root": str(job.store.root)}


def write_private(path: Path, data: bytes) -> None:
    """Write ``path`` (in the launch's private folder) as a new 0600 file, then rename it
    into place: a reader sees the whole file or none, and no link there is followed."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # 0600, O_EXCL
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def open_job(path: Path, *, sha256: str) -> dict[str, Any]:
    """The job's data at ``path``, once its bytes match ``sha256`` (nothing else is read).

    Raises:
        JobRefused: The file is missing, a link, or not the bytes the launcher wrote.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise JobRefused(f"the job file '{path}' cannot be read ({exc}): refused") from None
    if sha256_bytes(raw) != sha256:
        raise JobRefused(
            f"the job file '{path}' is not the one its launcher wrote (sha256 "
            f"{sha256_bytes(raw)[:16]}..., expected {sha256[:16]}...): refused, nothing of it "
            "is used"
        )
    data: dict[str, Any] = json.loads(raw)
    if data.get("format") != JOB_FORMAT:
        raise JobRefused(f"the job file '{path}' has format {data.get('format')!r}: refused")
    return data


def build_job(data: dict[str, Any]) -> HandedJob:
    """The training call of ``open_job``'s data: the spec parsed, the run resolved again, the
    corpus and inputs loaded and checked against their pins.

    Raises:
        SpecError: The run resolves to another ID here (its recipe file changed).
        EssentialInputMissing: The corpus or an input is missing or altered.
    """
    for folder in reversed(data["recipe_dirs"]):
        use_recipe_dir(folder)
    spec = parse_spec(data["spec"], source="the launcher's job")
    run = spec.resolve_run(data["run"]["name"])
    if run.run_id != data["run"]["run_id"]:
        raise SpecError(
            f"run '{run.name}' resolves to {run.run_id} in a training process and to "
            f"{data['run']['run_id']} in its launcher: its recipe file changed since the launch; "
            "rerun to train the run it now defines.",
            field="control.recipe",
        )
    job = RunJob(
        spec=spec,
        run=run,
        corpus=_load_corpus(data["corpus"], spec=spec, run_id=run.run_id),
        store=LocalStore(data["store"]["root"]),
        run_folder=RunFolder(
            path=Path(data["run_folder"]["path"]),
            run_id=run.run_id,
            out=Path(data["run_folder"]["out"]) if data["run_folder"]["out"] else None,
        ),
        stop_after_steps=data["stop_after_steps"],
        checkpoint_every=data["checkpoint_every"],
        lane=data["lane"],
        probe_eval=bool(data.get("probe_eval", False)),
    )
    return HandedJob(
        job=job, outcome_file=Path(data["outcome_file"]), stop_file=Path(data["stop_file"])
    )


def _load_corpus(record: dict[str, Any], *, spec: CampaignSpec, run_id: str) -> Any:
    """The corpus this rank loads itself: the same file, checked against the same pin."""
    inputs = {
        name: pin(Path(item["path"]), sha256=item["sha256"], run_id=run_id, label=f"input '{name}'")
        for name, item in record["inputs"].items()
    }
    path = Path(record["path"])
    if record["kind"] == "table":
        assert spec.corpus is not None and spec.corpus.sha256 == record["sha256"]
        return replace(load_corpus(path, corpus_spec=spec.corpus, run_id=run_id), inputs=inputs)
    pinned = pin(path, sha256=record["sha256"], run_id=run_id, label=f"corpus '{path}'")
    return replace(pinned, inputs=inputs)
