"""The campaign's output folder: its file names and its atomic writes.

Layout: ``manifest.json``, ``plan.json`` (never rewritten) with ``plan.sha256``, ``spec.yaml``,
``campaign.json``, ``runs/<run_id>/{params.json, metrics.jsonl, result.json, predictions.csv,
scores-<split>.csv, error_analysis.json, in_progress.json, evals/, model/}``,
``stops.jsonl``, ``decisions.jsonl``, ``timeline.jsonl``, ``ledger.jsonl``, ``report.md``,
``RELOAD.md``, ``figures/*.png`` and ``data/`` (a corpus copy when small).

Every file and folder name of the output folder is defined here and nowhere else
(``tests/test_names.py`` fails on a literal copy elsewhere), and so are the names of a
checkpoint in its store: the storage spool (which cannot import ``checkpoint``) and the
checkpoint manager both read them from here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from gpucampaign.core.errors import FolderError
from gpucampaign.core.files import (
    append_jsonl,
    atomic_copy,
    atomic_write_bytes,
    json_bytes,
    read_jsonl,
    sha256_bytes,
    sha256_file,
)

MANIFEST = "manifest.json"
PLAN = "plan.json"
PLAN_SHA = "plan.sha256"
SPEC_COPY = "spec.yaml"
RELOAD = "RELOAD.md"
REPORT_JSON, REPORT_MD, REPORT_HTML = "report.json", "report.md", "report.html"
INPUTS = "inputs.json"
STOPS, DECISIONS, TIMELINE = "stops.jsonl", "decisions.jsonl", "timeline.jsonl"
ROUNDS = "rounds.jsonl"  # the rounds of seeds bought beyond the plan (close/rounds.py)
# A campaign extended in place (preflight/extension.py): its earlier specs and plans, and why.
SPECS_DIR, SPEC_HISTORY = "specs", "spec-history.jsonl"
CAMPAIGN_FILE = "campaign.json"  # the campaign ID, written at the flow's first start
# Written first into a new output folder (after the writer's .lock): the folder is this tool's,
# so a rerun may go on in it (preflight/ownership.py refuses any other folder with files).
OWNER_FILE = "gpucampaign-folder.json"
REFORECAST_FILE, PILOT_FILE = "reforecast.json", "pilot.json"
LEDGER_FILE = "ledger.jsonl"  # expenses recorded after the start
RESTART_FILE = "restart.json"  # the restart check's result, kept so a resumed flow skips it
AUDIT_FILE = "audit.json"  # the data audit's report
ESTIMATES_FILE = "estimates.json"  # the forecast's estimates at the close
RUNS_DIR = "runs"  # runs/<run_id>/: one folder per run (see run_relpath, run_path)
FIGURES_DIR = "figures"
CALENDAR_PNG, CURVES_PNG, CONFUSION_PNG = (
    f"{FIGURES_DIR}/calendar.png",
    f"{FIGURES_DIR}/curves.png",
    f"{FIGURES_DIR}/confusion.png",
)
ATTRIBUTION_PNG = f"{FIGURES_DIR}/attribution.png"  # the lots' time by cause, one bar a machine
DATA_DIR = "data"  # a copy of the corpus when it is small
INPUTS_DIR = "inputs"  # copies of the catalogs the spec names
SPOOL_DIR = "spool"  # checkpoint files waiting for the S3 server (never in the manifest)
LOCK_FILE = ".lock"  # the one writer's lock (never in the manifest or the mirror)
PARAMS_FILE = "params.json"
METRICS_FILE = "metrics.jsonl"
PREDICTIONS_FILE = "predictions.csv"  # on the report split; predictions-<split>.csv on others
PREDICTIONS_PREFIX = "predictions-"
RECIPE_ERROR_FILE = "recipe-error.txt"  # the traceback of a recipe method that raised
RESULT_FILE = "result.json"  # a run's outcome, written last by its training call
IN_PROGRESS_FILE = "in_progress.json"  # a run training now (resume: inference finds it)
SCORES_PREFIX = "scores-"  # scores-<split>.csv: per-example scores (see scores_file)
SCORES_ERROR_FILE = "scores-error.txt"  # why a recipe's score() wrote no scores at the close
ERROR_ANALYSIS_FILE = "error_analysis.json"
# runs/<run_id>/mlflow.json: the run's MLflow run ID and the last step sent per metric; and
# mlflow-outbox.jsonl: metric values not yet taken by the tracking server (absent when none).
MLFLOW_STATE_FILE = "mlflow.json"
MLFLOW_OUTBOX_FILE = "mlflow-outbox.jsonl"
# runs/<run_id>/progress.json: the live state of a training call (rewritten about once a second;
# transient, so not in the manifest): what `campaign run` and `campaign watch` show.
PROGRESS_FILE = "progress.json"
# runs/<run_id>/progress-restart.json: the same for the restart check of that run (its new
# process trains elsewhere; the check relays its progress here).
CHECK_PROGRESS_FILE = "progress-restart.json"


#: In a data-parallel run's folder: the records of its ranks above 0, ``.ranks/<rank>/``.
RANKS_DIR = ".ranks"
STAGING_DIR = ".staging"  # in a run's folder: its checkpoints before they are written


def is_live_progress(relative: str) -> bool:
    """True for a run's live ``progress.json`` or ``progress-restart.json`` (``relative``: a
    posix path relative to the output folder): rewritten while it trains, never sealed in the
    manifest nor compared with it."""
    parts = PurePosixPath(relative).parts
    if len(parts) == 5 and parts[2] == RANKS_DIR:  # a data-parallel run's rank k > 0
        parts = parts[:2] + parts[4:]
    return (
        len(parts) == 3
        and parts[0] == RUNS_DIR
        and parts[2] in (PROGRESS_FILE, CHECK_PROGRESS_FILE)
    )


MODEL_DIR = "model"
MODEL_CONFIG = "config.json"  # in MODEL_DIR: the run config, recipe, sizes, hashes
CHECKPOINTS_DIR = "checkpoints"  # a local store's checkpoints, inside the output folder
WEIGHTS_FILE = "model.safetensors"  # in MODEL_DIR and in each checkpoint
MODEL_WEIGHTS = f"{MODEL_DIR}/{WEIGHTS_FILE}"  # in a run's folder
RUN_FILES = (PARAMS_FILE, METRICS_FILE, PREDICTIONS_FILE, ERROR_ANALYSIS_FILE)
MODEL_FILES = (WEIGHTS_FILE, MODEL_CONFIG)

# A checkpoint in its store (``<run_id>/step-<9 digits>/``): here, not in ``checkpoint``,
# because the storage spool (ranked below ``checkpoint``) must know them too.
CHECKPOINT_LATEST = "LATEST"  # pins the newest meta by its sha256
CHECKPOINT_META = "meta.json"
CHECKPOINT_STATE = "state.pt"
CHECKPOINT_STEP_PREFIX = "step-"


def checkpoint_step_dir(step: int) -> str:
    """``step-000000020``: one checkpoint's folder in the store; sorts by step as text."""
    return f"{CHECKPOINT_STEP_PREFIX}{step:09d}"


def run_relpath(run_id: str, *names: str) -> str:
    """``runs/<run_id>/<names...>``: a run's file, relative to the output folder."""
    return "/".join((RUNS_DIR, run_id, *names))


def run_path(out: str | Path, run_id: str, *names: str) -> Path:
    """``out/runs/<run_id>/<names...>`` as a path (nothing created, nothing checked)."""
    return Path(out, RUNS_DIR, run_id, *names)


def run_id_of(run_dir: str | Path) -> str | None:
    """The run ID of a run's folder ``OUT/runs/<run_id>``; None for any other folder."""
    p = Path(run_dir)
    return p.name if p.parent.name == RUNS_DIR else None


def scores_file(split: str) -> str:
    """``scores-<split>.csv``: a run's per-example scores on one split (the recipe's
    ``score``), from which the verdict's paired interval is computed."""
    return f"{SCORES_PREFIX}{split}.csv"


EVAL_SCORES_DIR = "evals"  # runs/<run_id>/evals/scores-<step>.npz: the control's, per evaluation
EVAL_SCORES_GLOB = f"{SCORES_PREFIX}*.npz"  # in EVAL_SCORES_DIR: every evaluation's file


def eval_scores_file(step: int) -> str:
    """``evals/scores-<step>.npz``: the control's per-example scores of the decision metric on
    the selection split at one evaluation during training (the futility stop compares with it)."""
    return f"{EVAL_SCORES_DIR}/{SCORES_PREFIX}{step:09d}.npz"


def model_config(run_id: str) -> str:
    """``runs/<run_id>/model/config.json``, relative to the output folder."""
    return run_relpath(run_id, MODEL_DIR, MODEL_CONFIG)


@dataclass(frozen=True)
class RunFolder:
    """One run's folder, ``OUT/runs/<run_id>/``, and the files in it: one value, built once
    from the output folder (``OutputFolder.run``) and passed down. Nothing is created on a
    read; ``create`` makes the folder (refusing a link on the way).

    Attributes:
        path: The folder.
        run_id: The run's ID.
        out: The campaign's output folder that holds it (None for a scratch run folder: a
            restart check's copy, a benchmark).
    """

    path: Path
    run_id: str
    out: Path | None = None

    @classmethod
    def of(cls, out: str | Path, run_id: str) -> RunFolder:
        """Run ``run_id``'s folder in the output folder ``out``."""
        return cls(path=run_path(out, run_id), run_id=run_id, out=Path(out))

    @classmethod
    def scratch(cls, path: str | Path, run_id: str) -> RunFolder:
        """A run folder outside any output folder (a restart check's copy, a benchmark)."""
        return cls(path=Path(path), run_id=run_id)

    def of_run(self, run_id: str) -> RunFolder:
        """Another run's folder in the same output folder (the control's, say).

        Raises:
            ValueError: This folder is not in an output folder.
        """
        if self.out is None:
            raise ValueError(f"{self.path} is a scratch run folder: it has no other runs")
        return RunFolder.of(self.out, run_id)

    def at_rank(self, rank: int) -> RunFolder:
        """Where rank ``rank`` of a data-parallel run writes its own records: this folder for
        rank 0, else a private folder inside it (``.ranks/<rank>``)."""
        if rank == 0:
            return self
        return RunFolder(path=self.path / RANKS_DIR / str(rank), run_id=self.run_id, out=self.out)

    def refuse_links(self) -> None:
        """The folder, or a rank's run folder, ``.ranks`` and the rank's folder, must not be a
        link (a run writes nothing through one).

        Raises:
            FolderError: A link where one of them is (named, never followed).
        """
        ranked = self.path.parent.name == RANKS_DIR
        for p in (self.path.parent.parent, self.path.parent, self.path) if ranked else (self.path,):
            refuse_link(p)

    def create(self) -> Path:
        """Make the folder (and its parents), refusing links first (``refuse_links``).

        Raises:
            FolderError: A link where the folder is (named, never followed).
        """
        self.refuse_links()
        self.path.mkdir(parents=True, exist_ok=True)
        return self.path

    # The files in it, named once here: plain attributes (a value, nothing to compute).
    params: Path = field(init=False, repr=False, compare=False)
    metrics: Path = field(init=False, repr=False, compare=False)
    result: Path = field(init=False, repr=False, compare=False)
    model: Path = field(init=False, repr=False, compare=False)
    progress: Path = field(init=False, repr=False, compare=False)
    in_progress: Path = field(init=False, repr=False, compare=False)
    #: Where the run's checkpoints are staged before they are written to the store.
    staging: Path = field(init=False, repr=False, compare=False)
    eval_scores_dir: Path = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = {
            "params": PARAMS_FILE,
            "metrics": METRICS_FILE,
            "result": RESULT_FILE,
            "model": MODEL_DIR,
            "progress": PROGRESS_FILE,
            "in_progress": IN_PROGRESS_FILE,
            "staging": STAGING_DIR,
            "eval_scores_dir": EVAL_SCORES_DIR,
        }
        for attribute, name in names.items():
            object.__setattr__(self, attribute, self.path / name)  # frozen: set once, here

    def eval_scores(self, step: int) -> Path:
        """The control's per-example scores at evaluation ``step``."""
        return self.path / eval_scores_file(step)


def refuse_link(path: Path) -> None:
    """Refuse a folder a run writes into that is a link: nothing is written or removed
    through a link planted in the output folder.

    Raises:
        FolderError: ``path`` is a symbolic link; its target is named.
    """
    if path.is_symlink():
        raise FolderError(
            f"'{path}' is a link (to '{os.readlink(path)}'): a run writes only into its own "
            "folder and follows no link there; remove the link and rerun.",
            field="out",
        )


class PlanRewriteError(FolderError):
    """``plan.json`` already holds a different plan: the initial plan is never rewritten."""


class OutputFolder:
    """The campaign's output folder; every path given to it stays inside it."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def path(self, relative: str) -> Path:
        """``root/relative``, refusing an absolute path, one that climbs out, and one that a
        link in the folder takes out of it (the link is named, never followed)."""
        p = PurePosixPath(str(relative).replace("\\", "/"))
        if not str(relative) or p.is_absolute() or ".." in p.parts:
            raise FolderError(
                f"'{relative}' must be a relative path inside the output folder", field="out"
            )
        target = self.root / Path(*p.parts)
        real, root = target.resolve(), self.root.resolve()
        if real != root and not real.is_relative_to(root):
            raise FolderError(
                f"'{target}' leads out of the output folder '{self.root}' through a link (to "
                f"'{real}'): refused, not followed; remove the link.",
                field="out",
            )
        return target

    def run(self, run_id: str) -> RunFolder:
        """Run ``run_id``'s folder (nothing created: ``RunFolder.create``); a link that takes
        ``runs/<run_id>`` out of the folder is refused."""
        return RunFolder(path=self.path(run_relpath(run_id)), run_id=run_id, out=self.root)

    def write_bytes(self, relative: str, data: bytes) -> Path:
        """Write a file atomically."""
        p = self.path(relative)
        atomic_write_bytes(p, data)
        return p

    def write_text(self, relative: str, text: str) -> Path:
        """Write a UTF-8 text file atomically."""
        return self.write_bytes(relative, text.encode("utf-8"))

    def write_json(self, relative: str, obj: Any) -> Path:
        """Write JSON (indented, sorted keys) atomically."""
        return self.write_bytes(relative, json_bytes(obj))

    def read_json(self, relative: str) -> Any:
        """Parsed JSON, or None when the file does not exist."""
        p = self.path(relative)
        if not p.is_file():
            return None
        return json.loads(p.read_text(encoding="utf-8"))

    def append_jsonl(self, relative: str, record: Mapping[str, Any]) -> None:
        """Append one JSON line and fsync it (stops, decisions, timeline, metrics)."""
        append_jsonl(self.path(relative), record)

    def read_jsonl(self, relative: str) -> list[dict[str, Any]]:
        """All records of a JSON-lines file; [] when it does not exist."""
        return read_jsonl(self.path(relative))

    def copy_in(self, source: str | Path, relative: str) -> Path:
        """Copy a file into the folder: a temporary name, fsync, then a rename."""
        return atomic_copy(source, self.path(relative))

    def keep_spec(self, text: bytes, *, source: str, check_only: bool = False) -> None:
        """Keep the campaign's spec as ``spec.yaml``; refuse a folder that holds another one.

        Args:
            text: the spec file's bytes (or the YAML of a spec object).
            source: where the spec comes from, for the error message.
            check_only: only refuse, write nothing (a check before any work starts).

        Raises:
            SpecError: ``spec.yaml`` exists with other content; nothing is changed.
        """
        target = self.path(SPEC_COPY)
        if target.exists():
            if target.read_bytes() != text:
                raise FolderError(
                    f"Output folder '{self.root}' holds another campaign (its spec.yaml differs "
                    f"from {source}): nothing was changed there; choose a new --out or restore "
                    "the spec.",
                    field="out",
                )
            return
        if not check_only:
            self.write_bytes(SPEC_COPY, text)

    def write_plan_once(self, plan: Mapping[str, Any]) -> str:
        """Write ``plan.json`` and ``plan.sha256`` at the start; never rewrite them.

        Writing the same plan again (a resumed campaign) is a no-op; so is writing the plan an
        earlier version of the tool wrote with keys added since (a campaign resumed after an
        upgrade): the file as written stays.

        Returns:
            The plan's sha256 (of the file's bytes).

        Raises:
            PlanRewriteError: ``plan.json`` exists with different content.
        """
        data = json_bytes(plan)
        digest = sha256_bytes(data)
        target = self.path(PLAN)
        if target.exists():
            old = sha256_file(target)
            if old != digest and _plan_of_earlier_version(target, plan):
                digest = old  # the plan as that version wrote it stays: never rewritten
            if old != digest:
                raise PlanRewriteError(
                    f"'{target}' already holds another plan (sha256 {old[:12]}...); the initial "
                    "plan is never rewritten: use a new output folder for a new plan",
                    field="out",
                )
            if not self.path(PLAN_SHA).exists():
                self.write_text(PLAN_SHA, f"{digest}  {PLAN}\n")
            return digest
        self.write_bytes(PLAN, data)
        self.write_text(PLAN_SHA, f"{digest}  {PLAN}\n")
        return digest

    def plan_sha256(self) -> str | None:
        """The plan hash recorded at the start (``plan.sha256``), or None."""
        p = self.path(PLAN_SHA)
        if not p.is_file():
            return None
        text = p.read_text(encoding="utf-8").split()
        return text[0] if text else None


def read_manifest(root: str | Path) -> dict[str, Any]:
    """The parsed ``manifest.json`` of a closed campaign's folder.

    Raises:
        FolderError: the folder has no manifest.
    """
    p = OutputFolder(root).path(MANIFEST)
    if not p.is_file():
        raise FolderError(
            f"'{p}' does not exist: give the output folder of a closed campaign", field="OUT"
        )
    return json.loads(p.read_text(encoding="utf-8"))


def corpus_file(root: str | Path, corpus_ref: Mapping[str, Any]) -> Path:
    """The corpus file a manifest's corpus reference points to."""
    if corpus_ref.get("kind") == "copied":
        return OutputFolder(root).path(corpus_ref["path"])
    return Path(corpus_ref["location"])


# --- a data-parallel run's launch (engine/launch.py, engine/jobfile.py, engine/worker.py) -----
# Never in the output folder: in the launcher's private temporary folder (``tempfile.mkdtemp``,
# mode 0700, files 0600), removed after the run, whatever its end.
#: The prefix of that temporary folder's name.
LAUNCH_DIR_PREFIX = "gpucampaign-ddp-"
#: The job every rank reads: JSON (no code, no corpus), checked by the sha256 on its command line.
LAUNCH_JOB_FILE = "job.json"
#: Rank 0's outcome: the result, a stop rule, an interruption or an error.
LAUNCH_OUTCOME_FILE = "outcome.json"
#: Written by the launching process when a stop is requested there: rank 0 reads it at each
#: step (the agent forwards signals only from the main thread; a Prefect task runs in another).
LAUNCH_STOP_FILE = "stop"


def _plan_of_earlier_version(target: Path, plan: Mapping[str, Any]) -> bool:
    """Whether ``target`` (a ``plan.json``) holds ``plan`` as an earlier version of the tool
    wrote it: the same, without the keys added since (at the top and in each step, such as
    the machines of the lots). A campaign started before an upgrade then resumes after it."""
    try:
        old = json.loads(target.read_bytes())
    except (OSError, ValueError):
        return False
    if not isinstance(old, dict) or not set(old) <= set(plan):
        return False
    kept: dict[str, Any] = {k: v for k, v in plan.items() if k in old}
    steps, old_steps = kept.get("steps"), old.get("steps")
    if isinstance(steps, list) and isinstance(old_steps, list) and len(steps) == len(old_steps):
        kept["steps"] = [
            {k: v for k, v in step.items() if k in was}
            if isinstance(step, Mapping) and isinstance(was, dict)
            else step
            for step, was in zip(steps, old_steps, strict=True)
        ]
    return bool(json.loads(json_bytes(kept)) == old)
