"""The scheduled check of an existing campaign output: resume a kept checkpoint, replay.

``verify_checkpoint_resume`` fetches the run's latest kept checkpoint from its store (and the
previous kept one when the latest is the final step), resumes m steps in a fresh process and
compares with the losses the original run recorded after that step. It never falls back to an
older checkpoint: a check of the latest fails when the latest is missing or altered
(``CheckpointCheckFailed``, its ``problem`` says what). ``check_latest_checkpoint`` returns the
same answer as a ``ScheduledCheck``, naming the older checkpoint a resume would still use.
``ReplayCheck`` is the part it shares with the campaign's early-save check
(``earlysave.verify_early_save``).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpucampaign.checkpoint.layout import PAYLOAD_FILES
from gpucampaign.checkpoint.manager import CheckpointManager, LoadedCheckpoint
from gpucampaign.checkpoint.verify import (
    CHECKSUM_MISMATCH,
    MISSING,
    SHA256_MISMATCH,
    CheckpointInvalid,
)
from gpucampaign.config import CampaignSpec, ResolvedRun, SpecError, load_spec
from gpucampaign.core.stoprules import NoUsableRestart
from gpucampaign.data.pins import resolve_inputs
from gpucampaign.folder.layout import (
    CHECKPOINT_LATEST,
    CHECKPOINT_META,
    CHECKPOINTS_DIR,
    METRICS_FILE,
    MODEL_DIR,
    SPEC_COPY,
    checkpoint_step_dir,
    run_relpath,
)
from gpucampaign.folder.records import StopRecord, read_stops
from gpucampaign.restartcheck.child import child_args, spawn, wait, write_child_spec
from gpucampaign.restartcheck.compare import (
    Comparer,
    RestartReport,
    compare_final_models,
    require_identical,
    train_losses,
)
from gpucampaign.restartcheck.target import RestartTarget, pinned_corpus
from gpucampaign.storage import LocalStore, StorageError, Store, open_store
from gpucampaign.storage.open import read_wait_s


@dataclass
class Replay:
    """A kept checkpoint resumed in a fresh process from ``start`` to ``n``."""

    local: LocalStore  # the copy of the checkpoint of ``start``, and the replay's own saves
    resumed: dict[str, Any]  # the fresh process's ``RunResult``
    cmp: Comparer  # its losses compared with the original run's; more comparisons go here
    start: int
    n: int


@dataclass
class ReplayCheck:
    """Resume kept checkpoints of ``target.run`` from its store in fresh processes (in
    ``target.workdir``) and compare them with what the original run recorded in
    ``target.run_dir``."""

    target: RestartTarget
    t0: float = field(default_factory=time.perf_counter)

    @property
    def run_id(self) -> str:
        """The run's ID."""
        return self.target.run.run_id

    def original(self) -> dict[int, float]:
        """Step -> the training loss the original run recorded."""
        return train_losses(self.target.run_dir / METRICS_FILE)

    def replay(self, *, start: int, original: dict[int, float], steps: list[int]) -> Replay:
        """Copy the checkpoint of ``start`` out of the store, resume it in a fresh process up
        to the last of ``steps``, and compare its losses there with the ``original`` run's:
        exactly on CPU, within ``GPU_ATOL`` on a GPU."""
        self.target.workdir.mkdir(parents=True, exist_ok=True)
        local = _copy_checkpoint(
            self.target.store,
            run_id=self.run_id,
            step=start,
            dst=self.target.workdir / CHECKPOINTS_DIR,
        )
        n = steps[-1]
        resumed = _resume_in_child(
            self.target.spec,
            run=self.target.run,
            corpus_path=self.target.corpus_path,
            inputs=self.target.inputs,
            store=local,
            workdir=self.target.workdir,
            start=start,
            n=n,
        )
        cmp = Comparer.for_device(resumed.get("device", "cpu"))
        cmp.losses(original, train_losses(self.target.workdir / "run" / METRICS_FILE), steps)
        return Replay(local=local, resumed=resumed, cmp=cmp, start=start, n=n)

    def compare_final_models(self, rep: Replay) -> None:
        """Compare the replay's final model with the original run's (when it kept one)."""
        compare_final_models(
            rep.cmp, self.target.run_dir / MODEL_DIR, self.target.workdir / "run" / MODEL_DIR
        )

    def report(self, rep: Replay, *, mode: str, save_s: float | None) -> RestartReport:
        """The report of ``rep``; ``save_s``: the recorded cost of the resumed save, if known."""
        key = f"{self.run_id}/{checkpoint_step_dir(rep.start)}/{CHECKPOINT_META}"
        spe = int(json.loads(rep.local.read_bytes(key)).get("steps_per_epoch") or 1)
        return RestartReport.from_check(
            rep.cmp,
            rep.resumed,
            run=self.target.run,
            mode=mode,
            k=rep.start,
            n=rep.n,
            steps_per_epoch=spe,
            save_s=save_s,
            t0=self.t0,
        )


def verify_checkpoint_resume(
    target: RestartTarget, *, m_steps: int = 20, check: bool = True
) -> RestartReport:
    """Resume a finished or running campaign's latest good checkpoint in a fresh process.

    Args:
        target: The run, its store, pinned inputs and records, and an empty scratch folder.
        m_steps: Steps to resume and compare.
        check: Raise ``NoUsableRestart`` on a difference (default).

    Raises:
        NoUsableRestart: No usable checkpoint, nothing recorded to compare with, a failed
            process, or a difference (``check``).
    """
    assert target.spec.corpus is not None, "a restart check needs the spec's corpus"
    probe = ReplayCheck(target)
    ck = _resume_point(target.run, store=target.store)
    start, planned = ck.step, int(ck.meta["planned_steps"])
    original = probe.original()
    steps = [s for s in range(start + 1, min(planned, start + m_steps) + 1) if s in original]
    checked = _why_checked(ck, latest=_latest_step(target), stopped=target.stopped)
    if target.stopped is not None and (not steps or target.no_replay):
        # A stopped run ends where it stopped: what its last checkpoint can show is that it
        # loads whole (every hash, the complete state, done by ``_resume_point``).
        return _loaded_only(probe, ck, checked=checked, why_no_replay=target.no_replay)
    if not steps:
        raise NoUsableRestart(
            probe.run_id,
            f"the original run recorded no loss after step {start} to compare with",
            step=start,
        )
    rep = probe.replay(start=start, original=original, steps=steps)
    if rep.n == planned:
        probe.compare_final_models(rep)
    save_s = float(ck.meta.get("write_s", 0.0)) + float(ck.meta.get("upload_s", 0.0))
    report = probe.report(rep, mode="checkpoint", save_s=save_s)
    report.checked = f"{checked}; replayed steps {steps[0]}..{rep.n} in a fresh process"
    return require_identical(
        report,
        check=check,
        start=start,
        what=f"resuming the checkpoint of step {start} does not reproduce the recorded run",
    )


def _latest_step(target: RestartTarget) -> int | None:
    """The step ``LATEST`` names (already read and checked by ``_resume_point``)."""
    run = target.run
    ptr = CheckpointManager(
        target.store, run_id=run.run_id, config_sha256=run.config_sha256
    ).latest_pointer()
    return int(ptr["step"]) if ptr else None


def _why_checked(ck: LoadedCheckpoint, *, latest: int | None, stopped: StopRecord | None) -> str:
    """Which checkpoint a check resumed, and why that one."""
    planned = int(ck.meta["planned_steps"])
    text = f"checkpoint of step {ck.step} of {planned}"
    if latest is not None and latest != ck.step:
        text += (
            f" (LATEST names step {latest}, the final one, which leaves nothing to resume: "
            "the kept checkpoint before it)"
        )
    else:
        text += " (the latest kept, LATEST's)"
    if stopped is not None:
        at = "" if stopped.step is None else f" at step {stopped.step}"
        text += f"; the run stopped{at} ({stopped.rule}, {stopped.stop_id})"
    return text


def _loaded_only(
    probe: ReplayCheck, ck: LoadedCheckpoint, *, checked: str, why_no_replay: str
) -> RestartReport:
    """The report of a stopped run's checkpoint that was loaded and verified, not replayed."""
    why = why_no_replay or f"the run recorded no step after step {ck.step} to replay"
    run = probe.target.run
    return RestartReport(
        identical=True,
        compared_steps=0,
        max_abs_diff=0.0,
        save_s=None,
        restore_s=ck.read_s,
        total_s=time.perf_counter() - probe.t0,
        k=ck.step,
        n=ck.step,
        threads=run.config.threads,
        run_id=run.run_id,
        mode="stopped",
        resume=run.config.resume,
        compared=["loads", "sha256 and checksums", "complete train state"],
        checked=f"{checked}; it loads, its hashes match and its state is complete; no replay: "
        f"{why}",
    )


@dataclass(frozen=True)
class CheckpointProblem:
    """What is wrong with the checkpoint a scheduled check expected.

    ``kind``: ``"missing object"``, ``"checksum mismatch"`` (a file against its meta, both
    checksums and their ``algorithm``), ``"sha256 mismatch"`` (an object against the store's
    record, both hashes), ``"invalid"``
    (refused for another reason: the pointer, the meta, the tensors), ``"unreadable"`` (the
    store failed), ``"no checkpoint"`` or ``"not resumable"`` (the fresh process failed or
    did not reproduce the run).
    """

    kind: str
    detail: str
    step: int | None = None  # the checkpoint found wrong
    obj: str | None = None  # the object at fault (a key in the store)
    expected_sha256: str | None = None
    actual_sha256: str | None = None
    algorithm: str = "sha256"  # of the two values above

    def describe(self) -> str:
        """One line: what, where, and both hashes of a mismatch."""
        where = f" {self.obj}" if self.obj else ""
        text = f"{self.kind}{where}"
        if self.kind in (SHA256_MISMATCH, CHECKSUM_MISMATCH):
            algo = self.algorithm
            text += f" (expected {algo} {self.expected_sha256}, got {algo} {self.actual_sha256})"
        elif self.kind != MISSING:
            text += f": {self.detail}"
        return text


class CheckpointCheckFailed(NoUsableRestart):
    """The checkpoint a check expected is not usable (``problem`` says what, when known)."""

    problem: CheckpointProblem | None = None


def _refused(exc: Exception, *, step: int | None) -> CheckpointProblem:
    if isinstance(exc, CheckpointInvalid):
        return CheckpointProblem(
            kind=exc.kind,
            detail=exc.reason,
            step=step,
            obj=exc.obj,
            expected_sha256=exc.expected,
            actual_sha256=exc.actual,
            algorithm=exc.algorithm,
        )
    return CheckpointProblem(kind="unreadable", detail=str(exc), step=step)


def _fail(run_id: str, problem: CheckpointProblem) -> CheckpointCheckFailed:
    err = CheckpointCheckFailed(run_id, problem.describe(), step=problem.step)
    err.problem = problem
    return err


def _resume_point(run: ResolvedRun, *, store: Store) -> LoadedCheckpoint:
    """The checkpoint ``LATEST`` names, or the kept one just before it when it is the final
    step (resuming the final step would train nothing); both must load, without falling back:
    a check of the latest never passes on an older checkpoint.

    Raises:
        CheckpointCheckFailed: With the problem found (missing object, sha256 mismatch, ...).
    """
    run_id = run.run_id
    manager = CheckpointManager(store, run_id=run_id, config_sha256=run.config_sha256, keep=10**6)
    try:
        ptr = manager.latest_pointer()
    except CheckpointInvalid as exc:
        raise _fail(run_id, _refused(exc, step=None)) from None
    except StorageError as exc:
        raise _fail(run_id, CheckpointProblem(kind="unreadable", detail=str(exc))) from None
    if ptr is None:
        steps = manager.step_dirs()
        if not steps:
            raise _fail(
                run_id,
                CheckpointProblem(kind="no checkpoint", detail="no usable checkpoint in the store"),
            )
        raise _fail(
            run_id,
            CheckpointProblem(
                kind=MISSING,
                detail=f"{CHECKPOINT_LATEST} is missing",
                obj=f"{run_id}/{CHECKPOINT_LATEST}",
                step=steps[-1],
            ),
        )
    latest = int(ptr["step"])
    try:
        ck = manager.load(latest, meta_sha256=str(ptr["meta_sha256"]))
    except (CheckpointInvalid, StorageError) as exc:
        raise _fail(run_id, _refused(exc, step=latest)) from None
    if ck.step >= int(ck.meta["planned_steps"]):
        before = [s for s in manager.step_dirs() if s < latest]
        if not before:
            raise _fail(
                run_id,
                CheckpointProblem(
                    kind="not resumable",
                    step=latest,
                    detail="only the final checkpoint is kept: there is no earlier one to "
                    "resume (keep >= 2 checkpoints)",
                ),
            )
        try:
            ck = manager.load(before[-1])
        except (CheckpointInvalid, StorageError) as exc:
            raise _fail(run_id, _refused(exc, step=before[-1])) from None
    return ck


def _still_resumes(run: ResolvedRun, *, store: Store, below: int | None) -> int | None:
    """The newest checkpoint before ``below`` that loads (what a resume would fall back to)."""
    if below is None:
        return None
    manager = CheckpointManager(
        store, run_id=run.run_id, config_sha256=run.config_sha256, keep=10**6
    )
    try:
        ck, _ = manager.load_latest(max_step=below - 1)
    except (CheckpointInvalid, StorageError):
        return None
    return ck.step if ck is not None else None


@dataclass(frozen=True)
class ScheduledCheck:
    """What the scheduled check found for one run: its report when the latest kept checkpoint
    resumes exactly, else the problem and the older checkpoint a resume would still use."""

    run: str
    run_id: str
    expected_step: int | None  # the latest kept checkpoint (``LATEST``'s)
    report: RestartReport | None = None
    problem: CheckpointProblem | None = None
    resumes_from: int | None = None  # an older checkpoint that still loads

    @property
    def ok(self) -> bool:
        """True when the expected checkpoint resumed and reproduced the run."""
        return self.problem is None and self.report is not None and self.report.identical

    def summary(self) -> str:
        """One line for a log or a table."""
        if self.ok and self.report is not None:
            if self.report.mode == "stopped":
                return f"{self.run}: stopped, its last checkpoint checked: {self.report.checked}"
            return f"{self.run}: resumes exactly: {self.report.checked}"
        problem = self.problem.describe() if self.problem else "not identical"
        older = (
            f"; step {self.resumes_from} would still resume"
            if self.resumes_from is not None
            else "; no older checkpoint would resume"
        )
        return f"{self.run}: checkpoint of step {self.expected_step}: {problem}{older}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the report's fields (when there is one), the verdict and the problem."""
        out: dict[str, Any] = self.report.to_dict() if self.report is not None else {}
        out.update(
            run=self.run,
            run_id=self.run_id,
            ok=self.ok,
            identical=self.ok,
            expected_step=self.expected_step,
            problem=asdict(self.problem) if self.problem else None,
            resumes_from=self.resumes_from,
            summary=self.summary(),
        )
        return out


def check_latest_checkpoint(target: RestartTarget, *, m_steps: int = 20) -> ScheduledCheck:
    """``verify_checkpoint_resume`` as a result, not an exception: the scheduled check's
    answer for one run, naming the expected checkpoint, what was wrong with it and the older
    checkpoint that would still resume."""
    run, store = target.run, target.store
    expected: int | None
    try:
        ptr = CheckpointManager(
            store, run_id=run.run_id, config_sha256=run.config_sha256
        ).latest_pointer()
        expected = int(ptr["step"]) if ptr else None
    except (CheckpointInvalid, StorageError):
        expected = None
    try:
        report = verify_checkpoint_resume(target, m_steps=m_steps)
    except NoUsableRestart as exc:
        problem = getattr(exc, "problem", None) or CheckpointProblem(
            kind="not resumable", detail=exc.reason, step=exc.step
        )
        if expected is None and problem.step is not None:
            expected = problem.step
        return ScheduledCheck(
            run=run.name,
            run_id=run.run_id,
            expected_step=expected,
            problem=problem,
            resumes_from=_still_resumes(run, store=store, below=problem.step),
        )
    return ScheduledCheck(run=run.name, run_id=run.run_id, expected_step=expected, report=report)


def _copy_checkpoint(store: Store, *, run_id: str, step: int, dst: Path) -> LocalStore:
    """A local store holding only the checkpoint of ``step``, with ``LATEST`` pointing at it."""
    local = LocalStore(dst)
    src = f"{run_id}/{checkpoint_step_dir(step)}"
    for name in (*PAYLOAD_FILES, CHECKPOINT_META):
        key, dst_file = f"{src}/{name}", local.root / src / name
        if not _linked(store, key=key, dst=dst_file):
            store.get_file(key, dst=dst_file)
    meta_sha = hashlib.sha256(local.read_bytes(f"{src}/{CHECKPOINT_META}")).hexdigest()
    pointer = {"step": step, "dir": checkpoint_step_dir(step), "meta_sha256": meta_sha}
    local.write_bytes(f"{run_id}/{CHECKPOINT_LATEST}", data=json.dumps(pointer).encode())
    return local


def _linked(store: Store, *, key: str, dst: Path) -> bool:
    """Hard-link ``key`` of a local store to ``dst``; False where it cannot (another file
    system, a store that is not a folder). Checkpoint files are never written in place (every
    write is a new file renamed into place), so the link cannot change under the live run, and
    a checkpoint of many GB is not copied and fsynced only to be read once by the check (the
    fresh process verifies every byte when it loads it)."""
    path = store.local_path(key)
    if path is None or not path.is_file():
        return False
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(path, dst)
    except OSError:
        return False
    return True


def _resume_in_child(
    spec: CampaignSpec,
    *,
    run: ResolvedRun,
    corpus_path: Path,
    inputs: Mapping[str, Path],
    store: LocalStore,
    workdir: Path,
    start: int,
    n: int,
) -> dict[str, Any]:
    """Resume the checkpoint of ``start`` to ``n`` in a fresh process; its result."""
    run_id = run.run_id
    proc = spawn(
        child_args(
            spec_json=write_child_spec(spec, workdir),
            run=run.name,
            corpus=corpus_path.resolve(),
            inputs=inputs,
            out=workdir / "run",
            store=store.root,
            result=workdir / "resumed.json",
            stop_after=n,
            checkpoint_every=n,
        ),
        threads=run.config.threads,
        workdir=workdir,
        name="resumed",
    )
    resumed = wait(proc, run_id=run_id, what=f"resumed (load step {start}, continue to {n})")
    if resumed.get("resumed_from_step") != start:
        raise NoUsableRestart(
            run_id, f"the fresh process did not resume from step {start}", step=start
        )
    return resumed


@dataclass(frozen=True)
class OutputCheckTarget:
    """What the scheduled check of an output folder needs: the spec, the pinned corpus, the runs."""

    spec: CampaignSpec
    corpus_path: Path
    store: Store
    runs: dict[str, str]  # run name -> run ID, for runs with checkpoints in the store
    inputs: dict[str, Path] = field(default_factory=dict)  # pinned input name -> its file
    stops: dict[str, StopRecord] = field(default_factory=dict)  # run ID -> the stop that ended it

    def for_run(self, run: str, *, out: str | Path, workdir: Path) -> RestartTarget:
        """The restart target of ``run`` (one of ``runs``) of the output folder ``out``."""
        return RestartTarget(
            spec=self.spec,
            run=self.spec.resolve_run(run),
            corpus_path=self.corpus_path,
            store=self.store,
            run_dir=Path(out) / run_relpath(self.runs[run]),
            workdir=workdir,
            inputs=self.inputs,
            stopped=self.stops.get(self.runs[run]),
        )


def output_check_target(
    out: str | Path, *, spec_path: str | Path | None = None
) -> OutputCheckTarget:
    """Find the spec, corpus and checkpointed runs of a campaign output folder.

    The spec is ``OUT/spec.yaml`` (the copy kept at the start) unless ``spec_path`` is given.
    The corpus is the first file holding the pinned sha256 among: the copy the manifest (or
    ``inputs.json``, written at the start) names, the spec's path relative to the spec file's
    folder, and the same path inside ``OUT``.
    The store is the one the spec's ``storage.url`` names (``OUT/checkpoints`` for 'local').
    Pinned inputs are found as ``pins.resolve_inputs`` finds them (the copies in ``OUT`` first).

    Raises:
        SpecError: No spec, or no file with the pinned corpus hash.
        NoUsableRestart: No run of the spec has a checkpoint in the store.
    """
    out = Path(out)
    src = Path(spec_path) if spec_path is not None else out / SPEC_COPY
    # The copy in OUT never puts OUT on sys.path: a recipe is the installed one or the given
    # spec's, never a file of the output folder.
    spec = load_spec(src, recipe_folder=spec_path is not None)
    if spec.corpus is None:
        raise SpecError(
            "the spec has no 'corpus' section: a restart check resumes training on it.",
            field="corpus",
        )
    corpus, candidates = pinned_corpus(spec, out=out, spec_dir=src.resolve().parent)
    if corpus is None:
        pinned = spec.corpus.sha256
        raise SpecError(
            f"field 'corpus.sha256': no file with the pinned hash {pinned[:12]}... was found at "
            + ", ".join(str(c) for c in candidates)
            + "; give --spec the campaign's own spec file so its corpus path resolves.",
            field="corpus.sha256",
        )
    store = open_store(spec.storage.url, out=out, read_wait_s=read_wait_s(spec))
    ids = spec.run_ids()
    runs = {r: rid for r, rid in ids.items() if store.list(rid)}
    if not runs:
        raise NoUsableRestart(
            spec.name,
            f"no run of campaign '{spec.name}' has a checkpoint "
            f"in {store.url}: "
            "nothing can be restarted before the rental ends",
        )
    inputs = resolve_inputs(spec, base_dir=src.resolve().parent, out=out)
    stops: dict[str, StopRecord] = {}
    for rec in read_stops(out):  # a run's first stop is the one that ended it
        if rec.run_id in runs.values() and rec.phase != "restart":  # not a failed check's
            stops.setdefault(rec.run_id, rec)
    return OutputCheckTarget(
        spec=spec, corpus_path=corpus, store=store, runs=runs, inputs=inputs, stops=stops
    )
