"""The bounded restart check of a campaign: resume the control's own early save.

The live run already saved early (its first, measuring save) and recorded every step's loss.
``verify_early_save`` copies that checkpoint out of the store, resumes it in one fresh
process (which loads and verifies it as a real resume would), replays ``m`` steps (up to the
run's next kept save, capped) and compares:

- the replayed losses with the ones the live run recorded at those steps;
- the parameters and the whole train state with the live run's checkpoint of the last
  replayed step (or its final model folder when that step is the last one).

Exact on CPU; a recorded tolerance, with its reason, on a GPU. The cost is one process start
plus ``m`` steps plus one checkpoint read: it does not grow with the length of the run.
``campaign_restart_check`` falls back to the three-process check (``check.verify_restart``)
when the store keeps no checkpoint before the final step.
"""

from __future__ import annotations

import json
import time
from collections.abc import Container
from pathlib import Path

from gpucampaign.checkpoint.manager import CheckpointManager
from gpucampaign.config import CampaignSpec, ResolvedRun
from gpucampaign.core.stoprules import NoUsableRestart
from gpucampaign.data.corpus import corpus_path
from gpucampaign.data.pins import resolve_inputs
from gpucampaign.folder.layout import CHECKPOINT_META, checkpoint_step_dir, run_path
from gpucampaign.folder.records import StopRecord
from gpucampaign.restartcheck.check import verify_restart
from gpucampaign.restartcheck.compare import RestartReport, compare_states, require_identical
from gpucampaign.restartcheck.scheduled import ReplayCheck, verify_checkpoint_resume
from gpucampaign.restartcheck.target import RestartTarget, pinned_corpus
from gpucampaign.storage import NotFound, open_store
from gpucampaign.storage.open import read_wait_s

DEFAULT_MAX_STEPS = 200


def early_resume_point(
    manager: CheckpointManager, *, recorded: Container[int] | None = None
) -> tuple[int, int, int | None] | None:
    """``(start, planned, next kept save)`` of the earliest kept save before the final step.

    With ``recorded`` (the steps whose loss this folder's live run recorded), only a save
    whose next step is among them: a run resumed on another host into a fresh folder recorded
    only what it trained there.

    Only ``meta.json`` is read here: the fresh process verifies the payload when it loads it.
    None when the store keeps no checkpoint before the final step.
    """
    steps = manager.step_dirs()
    for i, step in enumerate(steps):
        key = f"{manager.run_id}/{checkpoint_step_dir(step)}/{CHECKPOINT_META}"
        try:
            meta = json.loads(manager.store.read_bytes(key))
        except (NotFound, ValueError):
            continue
        planned = int(meta.get("planned_steps") or 0)
        if step < planned and (recorded is None or step + 1 in recorded):
            later = steps[i + 1] if i + 1 < len(steps) else None
            return step, planned, later
    return None


def verify_early_save(
    target: RestartTarget, *, max_steps: int = DEFAULT_MAX_STEPS, check: bool = True
) -> RestartReport:
    """Resume the run's earliest kept save in a fresh process and replay up to its next save.

    Args:
        target: The run whose save is checked (the control usually), its store, pinned
            inputs and live run folder, and an empty scratch folder.
        max_steps: The most steps replayed (the cap on the cost).
        check: Raise ``NoUsableRestart`` on a difference (default).

    Raises:
        NoUsableRestart: No save before the final step, nothing recorded to compare with, a
            failed or non-resuming process, or a difference (``check``).
    """
    probe = ReplayCheck(target)
    run, store = target.run, target.store
    cfg_sha = run.config_sha256
    manager = CheckpointManager(store, run_id=run.run_id, config_sha256=cfg_sha, keep=10**6)
    original = probe.original()
    point = early_resume_point(manager, recorded=original) or early_resume_point(manager)
    if point is None:
        raise NoUsableRestart(probe.run_id, "no checkpoint before the final step is kept")
    start, planned, later = point
    n = min(later or planned, start + max(1, max_steps), planned)
    steps = list(range(start + 1, n + 1))
    if not all(s in original for s in steps):
        raise NoUsableRestart(
            probe.run_id,
            f"the live run recorded no loss for steps {start + 1}..{n} to compare with",
            step=start,
        )
    rep = probe.replay(start=start, original=original, steps=steps)
    if n == later:
        replayed = CheckpointManager(rep.local, run_id=probe.run_id, config_sha256=cfg_sha)
        # The live run shared its process with the orchestrator, whose threads may draw from
        # python's and numpy's generators; training does not, and any draw it made would
        # show in the losses and parameters compared here.
        compare_states(rep.cmp, manager.load(n), replayed.load(n), skip_rng=("python", "numpy"))
    elif n == planned:
        probe.compare_final_models(rep)
    return require_identical(
        probe.report(rep, mode="early-save", save_s=None),
        check=check,
        start=start,
        what=f"resuming the early save of step {start} in a fresh process does not reproduce "
        "the live run",
    )


def campaign_restart_check(
    spec: CampaignSpec,
    *,
    run: ResolvedRun,
    base_dir: str | Path,
    out: str | Path,
    workdir: Path,
    max_steps: int = DEFAULT_MAX_STEPS,
) -> RestartReport:
    """The restart phase of a campaign: the bounded check of the run's early save.

    Falls back to the three-process check when no save before the final step is kept.

    Raises:
        NoUsableRestart: The check failed.
    """
    path = corpus_path(spec, base_dir=base_dir)
    inputs = resolve_inputs(spec, base_dir=base_dir, out=out)
    store = open_store(spec.storage.url, out=Path(out), read_wait_s=read_wait_s(spec))
    manager = CheckpointManager(store, run_id=run.run_id, config_sha256=run.config_sha256)
    if early_resume_point(manager) is None:
        return verify_restart(spec, run=run, corpus_path=path, inputs=inputs, workdir=workdir)
    target = RestartTarget(
        spec=spec,
        run=run,
        corpus_path=path,
        inputs=inputs,
        store=store,
        run_dir=run_path(out, run.run_id),
        workdir=workdir,
    )
    return verify_early_save(target, max_steps=max_steps)


def check_stopped_run(
    spec: CampaignSpec,
    *,
    run: ResolvedRun,
    stop: StopRecord,
    base_dir: str | Path,
    out: str | Path,
    workdir: Path,
    max_steps: int = DEFAULT_MAX_STEPS,
) -> RestartReport:
    """The restart phase for a run a stop rule ended: its last checkpoint, checked for what it
    can show. It loads, its hashes match and its state is complete; the steps the run recorded
    after it are replayed in a fresh process when there are any and its inputs are still the
    pinned ones (the corpus is read from the copy the output folder kept when the original
    changed). The report's ``checked`` says which checkpoint and why; a run that stopped
    before its first save has nothing to check, which is no failed restart either.

    Raises:
        NoUsableRestart: The checkpoint is refused (``CheckpointCheckFailed`` names the file),
            or its replay does not reproduce the run.
    """
    store = open_store(spec.storage.url, out=Path(out))
    manager = CheckpointManager(store, run_id=run.run_id, config_sha256=run.config_sha256)
    if not manager.has_any():
        at = "" if stop.step is None else f" at step {stop.step}"
        return RestartReport(
            identical=True,
            compared_steps=0,
            max_abs_diff=0.0,
            save_s=None,
            restore_s=None,
            total_s=0.0,
            k=0,
            n=0,
            threads=run.config.threads,
            run_id=run.run_id,
            mode="stopped",
            resume=run.config.resume,
            checked=f"no checkpoint: the run stopped{at} ({stop.rule}, {stop.stop_id}) before "
            "its first save; nothing to check",
        )
    t0 = time.perf_counter()
    assert spec.corpus is not None, "a campaign's run trains on its pinned corpus"
    corpus, _ = pinned_corpus(spec, out=out, spec_dir=base_dir)
    no_replay = ""
    if corpus is None:
        no_replay = (
            f"the corpus '{spec.corpus.path}' no longer has its pinned sha256 and the output "
            "folder keeps no copy of it"
        )
    target = RestartTarget(
        spec=spec,
        run=run,
        corpus_path=corpus or corpus_path(spec, base_dir=base_dir),
        inputs=resolve_inputs(spec, base_dir=base_dir, out=out),
        store=store,
        run_dir=run_path(out, run.run_id),
        workdir=workdir,
        stopped=stop,
        no_replay=no_replay,
    )
    report = verify_checkpoint_resume(target, m_steps=max_steps)
    report.total_s = time.perf_counter() - t0
    return report
