"""Restart verification of a fresh run, in NEW processes: ``verify_restart``.

A reference process trains n steps uninterrupted; a second process trains k < n steps (k inside
an epoch), checkpoints and exits; a third loads that checkpoint and continues to n. Per-step
losses, final parameters and the whole optimizer state must be exactly equal on CPU (atol=0);
on a GPU a small tolerance is allowed and recorded.

The parts live beside it: the fresh process (``child.py``), what is compared and the report
(``compare.py``), the scheduled check of an existing output (``scheduled.py``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpucampaign.checkpoint.manager import CheckpointManager
from gpucampaign.config import CampaignSpec, ResolvedRun, SpecError
from gpucampaign.core.errors import ArgumentError
from gpucampaign.core.stoprules import NoUsableRestart
from gpucampaign.data.corpus import corpus_path as spec_corpus_path
from gpucampaign.data.corpus import open_corpus
from gpucampaign.data.pins import resolve_inputs
from gpucampaign.folder.layout import CHECKPOINTS_DIR, METRICS_FILE
from gpucampaign.recipe.runtime import train_rows
from gpucampaign.restartcheck.child import child_args, spawn, wait, write_child_spec
from gpucampaign.restartcheck.compare import (
    Comparer,
    RestartReport,
    compare_states,
    require_identical,
    train_losses,
)
from gpucampaign.storage import LocalStore


def default_steps(*, planned_steps: int, steps_per_epoch: int) -> tuple[int, int]:
    """``(n, k)``: k in the middle of the second epoch, n past the next epoch boundary."""
    spe = max(1, steps_per_epoch)
    k = spe + max(1, spe // 2)
    n = 2 * spe + max(1, spe // 4)
    if n > planned_steps:
        n = planned_steps
        k = max(1, n // 2)
        if spe > 1 and k % spe == 0:
            k -= 1
    if not 0 < k < n:
        raise SpecError(
            f"the run has only {planned_steps} planned step(s): a restart check needs at least 2.",
            field="control",
        )
    return n, k


# --- verification of a fresh run -------------------------------------------------------------
def verify_restart(
    spec: CampaignSpec,
    *,
    run: ResolvedRun,
    workdir: Path,
    corpus_path: Path | None = None,
    base_dir: str | Path | None = None,
    inputs: Mapping[str, Path] | None = None,
    n_steps: int | None = None,
    k_steps: int | None = None,
    check: bool = True,
) -> RestartReport:
    """Train n steps uninterrupted vs k steps + exit + resume to n, in fresh processes.

    The reference and the first half run side by side (one thread each by default), then the
    resume. The compared state is each side's checkpoint at step n.

    Args:
        spec: The campaign spec.
        run: The run whose config is checked (``spec.resolve_run("control")`` usually).
        workdir: An empty scratch folder.
        corpus_path: The corpus file (checked against its pinned sha256 by every process).
        base_dir: Or: the spec's folder, where the spec's corpus path is resolved.
        inputs: Where the spec's pinned inputs are (``pins.resolve_inputs``); by default
            resolved from ``base_dir``.
        n_steps: Steps to compare; default: past the end of the second epoch.
        k_steps: Where the interruption happens; default: the middle of the second epoch.
        check: Raise ``NoUsableRestart`` on any difference (default); False returns the report.

    Raises:
        NoUsableRestart: A process failed or the comparison found a difference (``check``).
        SpecError: Invalid n/k.
    """
    t0 = time.perf_counter()
    corpus_path = _restart_corpus(spec, corpus_path=corpus_path, base_dir=base_dir)
    if inputs is None:
        inputs = resolve_inputs(spec, base_dir=base_dir)
    n, k, spe = _fresh_steps(
        spec, run=run, corpus_path=corpus_path, inputs=inputs, n_steps=n_steps, k_steps=k_steps
    )
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    ref, rst = workdir / "reference", workdir / "restarted"
    first, resumed = _run_three_processes(
        spec,
        run=run,
        workdir=workdir,
        corpus_path=corpus_path,
        inputs=inputs,
        ref=ref,
        rst=rst,
        n=n,
        k=k,
    )
    cmp = Comparer.for_device(resumed.get("device", "cpu"))
    cmp.losses(
        train_losses(ref / "run" / METRICS_FILE),
        train_losses(rst / "run" / METRICS_FILE),
        list(range(1, n + 1)),
    )
    _compare_checkpoints(cmp, run=run, ref=ref / CHECKPOINTS_DIR, rst=rst / CHECKPOINTS_DIR, n=n)
    report = RestartReport.from_check(
        cmp,
        resumed,
        run=run,
        mode="fresh",
        k=k,
        n=n,
        steps_per_epoch=spe,
        save_s=(first["timings"]["save_s"] or [None])[-1],
        t0=t0,
    )
    return require_identical(
        report,
        check=check,
        start=k,
        what=f"restart from step {k} is not identical to the uninterrupted run",
    )


def _restart_corpus(
    spec: CampaignSpec, *, corpus_path: Path | None, base_dir: str | Path | None
) -> Path:
    """The corpus file a restart check trains on: given, or resolved from the spec's folder."""
    if (corpus_path is None) == (base_dir is None):
        raise SpecError(
            "verify_restart needs exactly one of corpus_path and base_dir.", field="corpus"
        )
    if corpus_path is None:
        corpus_path = spec_corpus_path(spec, base_dir=base_dir)  # type: ignore[arg-type]
    if spec.corpus is None:
        raise SpecError("a restart check needs the spec's corpus section.", field="corpus")
    return Path(corpus_path).resolve()


def _fresh_steps(
    spec: CampaignSpec,
    *,
    run: ResolvedRun,
    corpus_path: Path,
    inputs: Mapping[str, Path],
    n_steps: int | None,
    k_steps: int | None,
) -> tuple[int, int, int]:
    """``(n, k, steps_per_epoch)``: the given steps, or the defaults for this run's size."""

    assert spec.corpus is not None
    corpus = open_corpus(
        corpus_path, spec=spec, base_dir=None, run_id=run.run_id, input_paths=inputs
    )
    n_train = train_rows(run, corpus=corpus)
    planned, spe = run.config.planned_steps(n_train), run.config.steps_per_epoch(n_train)
    dn, dk = default_steps(planned_steps=planned, steps_per_epoch=spe)
    n = n_steps or (dn if k_steps is None or k_steps < dn else min(planned, k_steps + spe))
    k = k_steps or (dk if dk < n else max(1, n // 2))
    if not 0 < k < n <= planned:
        raise ArgumentError(
            f"a restart check needs 0 < k < n <= {planned} planned steps (got k={k}, n={n}).",
            field="k_steps",
        )
    return n, k, spe


def _run_three_processes(
    spec: CampaignSpec,
    *,
    run: ResolvedRun,
    workdir: Path,
    corpus_path: Path,
    inputs: Mapping[str, Path],
    ref: Path,
    rst: Path,
    n: int,
    k: int,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Reference to n beside first half to k, then the resume to n; the first and resumed
    processes' results."""
    run_id, threads = run.run_id, run.config.threads
    spec_json = write_child_spec(spec, workdir)

    def args(side: Path, stop: int, tag: str) -> list[str]:
        return child_args(
            spec_json=spec_json,
            run=run.name,
            corpus=corpus_path,
            inputs=inputs,
            out=side / "run",
            store=side / CHECKPOINTS_DIR,
            result=workdir / f"{tag}.json",
            stop_after=stop,
            checkpoint_every=n,
        )

    p_ref = spawn(args(ref, n, "reference"), threads=threads, workdir=workdir, name="reference")
    p_k = spawn(args(rst, k, "first"), threads=threads, workdir=workdir, name="first")
    first = wait(p_k, run_id=run_id, what=f"first (train {k} steps, save, exit)")
    p_resume = spawn(args(rst, n, "resumed"), threads=threads, workdir=workdir, name="resumed")
    wait(p_ref, run_id=run_id, what=f"reference ({n} steps uninterrupted)")
    resumed = wait(p_resume, run_id=run_id, what=f"resumed (load step {k}, continue to {n})")
    if resumed.get("resumed_from_step") != k:
        raise NoUsableRestart(
            run_id,
            f"the resumed process started from step {resumed.get('resumed_from_step')}, "
            f"not from the checkpoint of step {k}",
            step=k,
        )
    return first, resumed


def _compare_checkpoints(cmp: Comparer, *, run: ResolvedRun, ref: Path, rst: Path, n: int) -> None:
    """Compare the two sides' checkpoints of step n: parameters and every train state part."""
    run_id, cfg_sha = run.run_id, run.config_sha256
    ck_ref, why_ref = CheckpointManager(
        LocalStore(ref), run_id=run_id, config_sha256=cfg_sha
    ).load_latest()
    ck_rst, why_rst = CheckpointManager(
        LocalStore(rst), run_id=run_id, config_sha256=cfg_sha
    ).load_latest()
    if ck_ref is None or ck_rst is None or ck_ref.step != n or ck_rst.step != n:
        raise NoUsableRestart(
            run_id, f"no checkpoint of step {n} to compare ({why_ref + why_rst})", step=n
        )
    compare_states(cmp, ck_ref, ck_rst)
