"""Restart verification in NEW processes.

``verify_restart``: a reference process trains n steps uninterrupted; a second process trains
k < n steps (k inside an epoch), checkpoints and exits; a third loads that checkpoint and
continues to n. Per-step losses, final parameters and the whole optimizer state must be
exactly equal on CPU (atol=0); on a GPU a small tolerance is allowed and recorded.

``verify_checkpoint_resume``: the scheduled check of an existing campaign output: fetch the
run's latest good checkpoint from its store (the previous kept one when the latest is the
final step), resume m steps in a fresh process and compare with the losses the original run
recorded after that step.

Both use ``sys.executable -m gpucampaign.restart child ...`` with the run's own thread count
(``threads`` in its config; results differ across thread counts).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from gpucampaign.checkpoint import (
    LATEST_FILE,
    META_FILE,
    PAYLOAD_FILES,
    CheckpointManager,
    LoadedCheckpoint,
    step_dirname,
)
from gpucampaign.metrics import read_metrics
from gpucampaign.recipe import RECIPE_DIRS
from gpucampaign.spec import CampaignSpec, SpecError
from gpucampaign.stoprules import NoUsableRestart, StopRule
from gpucampaign.storage import LocalStore, Store
from gpucampaign.training import METRICS_FILE, MODEL_DIR, run_config_sha256

GPU_ATOL = 1e-5
GPU_TOLERANCE_REASON = (
    "on a GPU, cuBLAS/cuDNN kernels may pick different reduction orders between processes, "
    "so bit-identity is not guaranteed; differences up to the recorded atol are accepted"
)
_IGNORED_COUNTERS = ("steps_s_sum",)  # wall-clock sums differ between runs by nature


@dataclass
class RestartReport:
    """The outcome of one restart verification."""

    identical: bool
    compared_steps: int
    max_abs_diff: float
    save_s: float | None
    restore_s: float | None
    total_s: float
    k: int
    n: int
    threads: int
    run_id: str = ""
    mode: str = "fresh"
    resume: str = "training"
    device: str = "cpu"
    atol: float = 0.0
    k_mid_epoch: bool = True
    tolerance_reason: str = ""
    compared: list[str] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)

    @property
    def applies(self) -> str:
        """Which restart applies to this run after an interruption, in one sentence."""
        return resume_text(self.resume)


def resume_text(resume: str) -> str:
    """What an interruption leads to under a run config's ``resume`` choice."""
    if resume == "inference":
        return (
            "resume: inference: an interruption restarts inference from the last good "
            "model; learning is not resumed: the next start evaluates the latest verified "
            "checkpoint's model and records the run as interrupted (evidence at that step, "
            "never an accepted delivery)"
        )
    return (
        "resume: training: an interruption resumes learning from the full saved state "
        "(model, optimizer, data order, RNG), checked bit for bit"
    )


# --- the child process ---------------------------------------------------------------------
def _child_main(argv: list[str]) -> int:
    from gpucampaign.corpus import open_corpus
    from gpucampaign.spec import parse_spec
    from gpucampaign.training import train_run

    p = argparse.ArgumentParser(prog="python -m gpucampaign.restart child")
    p.add_argument("--spec", required=True, type=Path)
    p.add_argument("--run", required=True)
    p.add_argument("--corpus", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--store", required=True, type=Path)
    p.add_argument("--stop-after", type=int, default=None)
    p.add_argument("--checkpoint-every", type=int, default=None)
    p.add_argument("--result", required=True, type=Path)
    a = p.parse_args(argv)
    spec = parse_spec(json.loads(a.spec.read_text(encoding="utf-8")), source=str(a.spec))
    assert spec.corpus is not None
    try:
        corpus = open_corpus(a.corpus, spec=spec, base_dir=None, run_id=spec.run_id(a.run))
        res = train_run(
            spec,
            run=a.run,
            corpus=corpus,
            store=LocalStore(a.store),
            out_dir=a.out,
            stop_after_steps=a.stop_after,
            checkpoint_every=a.checkpoint_every,
        )
    except StopRule as exc:
        a.result.write_text(json.dumps({"stop": exc.to_record()}), encoding="utf-8")
        return 3
    a.result.write_text(json.dumps({"result": res.to_dict()}), encoding="utf-8")
    return 0


def _spawn(args: list[str], *, threads: int, workdir: Path, name: str) -> subprocess.Popen:
    env = dict(os.environ)
    env.update(
        {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "PYTHONHASHSEED": "0"}
    )
    # The spec's recipe folders, so a child imports the same recipe file.
    env["PYTHONPATH"] = os.pathsep.join([*RECIPE_DIRS, *filter(None, [env.get("PYTHONPATH")])])
    log = open(workdir / f"{name}.log", "wb")  # noqa: SIM115 - closed in _wait
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpucampaign.restart", "child", *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    proc.log_file = log  # type: ignore[attr-defined]
    proc.log_path = workdir / f"{name}.log"  # type: ignore[attr-defined]
    proc.result_path = Path(args[args.index("--result") + 1])  # type: ignore[attr-defined]
    return proc


def _wait(proc: subprocess.Popen, *, run_id: str, what: str) -> dict[str, Any]:
    rc = proc.wait()
    proc.log_file.close()  # type: ignore[attr-defined]
    path: Path = proc.result_path  # type: ignore[attr-defined]
    out = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    if rc != 0 or "result" not in out:
        log_path: Path = proc.log_path  # type: ignore[attr-defined]
        tail = log_path.read_text(encoding="utf-8", errors="replace")[-1500:]
        why = (
            f"stop {out['stop']['rule']}: {out['stop']['reason']}"
            if "stop" in out
            else f"exit {rc}: {tail}"
        )
        raise NoUsableRestart(run_id, f"the {what} process failed ({why})")
    return out["result"]


def _write_child_spec(spec: CampaignSpec, workdir: Path) -> Path:
    """The spec the children read. The quality floor is off there: a check that reaches the
    last step must not fail on the run's quality, which is not what it verifies (the run ID
    does not depend on stop rules, so the children resume the same run)."""
    rules = spec.stop_rules.model_copy(update={"below_threshold": False})
    child = spec.model_copy(update={"stop_rules": rules})
    path = workdir / "spec.json"
    path.write_text(json.dumps(child.model_dump(mode="json")), encoding="utf-8")
    return path


def _child_args(
    *,
    spec_json: Path,
    run: str,
    corpus: Path,
    out: Path,
    store: Path,
    result: Path,
    stop_after: int,
    checkpoint_every: int,
) -> list[str]:
    return [
        "--spec",
        str(spec_json),
        "--run",
        run,
        "--corpus",
        str(corpus),
        "--out",
        str(out),
        "--store",
        str(store),
        "--stop-after",
        str(stop_after),
        "--checkpoint-every",
        str(checkpoint_every),
        "--result",
        str(result),
    ]


# --- comparison ----------------------------------------------------------------------------
def _leaves(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k in sorted(obj, key=str):
            out.update(_leaves(obj[k], f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(obj, list | tuple):
        out = {}
        for i, v in enumerate(obj):
            out.update(_leaves(v, f"{prefix}[{i}]"))
        return out
    return {prefix: obj}


class _Comparer:
    def __init__(self, atol: float) -> None:
        self.atol = atol
        self.max_abs_diff = 0.0
        self.mismatches: list[str] = []
        self.compared: list[str] = []

    def value(self, name: str, a: Any, b: Any) -> None:
        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            both = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
            if not both or a.shape != b.shape or a.dtype != b.dtype:
                self.mismatches.append(f"{name}: different shape/dtype")
                return
            if a.dtype.is_floating_point or a.dtype.is_complex:
                diff = (a.double() - b.double()).abs()
                d = float(diff.max()) if diff.numel() else 0.0
                if math.isnan(d) or not torch.equal(a.isnan(), b.isnan()):
                    same_nans = torch.equal(a.isnan(), b.isnan())
                    d = float(diff.nan_to_num(0).max()) if same_nans else math.inf
            else:
                d = 0.0 if torch.equal(a, b) else math.inf
            self._record(name, d)
            return
        if isinstance(a, float) and isinstance(b, float):
            d = 0.0 if a == b or (math.isnan(a) and math.isnan(b)) else abs(a - b)
            self._record(name, d)
            return
        if a != b:
            self.mismatches.append(f"{name}: {a!r} != {b!r}")

    def _record(self, name: str, d: float) -> None:
        self.max_abs_diff = max(self.max_abs_diff, d)
        if d > self.atol:
            self.mismatches.append(f"{name}: max abs diff {d:.3g} > atol {self.atol:g}")

    def tree(self, name: str, a: Any, b: Any) -> None:
        la, lb = _leaves(a), _leaves(b)
        if set(la) != set(lb):
            self.mismatches.append(f"{name}: different entries {sorted(set(la) ^ set(lb))[:5]}")
        for key in sorted(set(la) & set(lb)):
            self.value(f"{name}.{key}", la[key], lb[key])
        self.compared.append(name)

    def losses(self, a: dict[int, float], b: dict[int, float], steps: list[int]) -> None:
        for s in steps:
            if s not in a or s not in b:
                self.mismatches.append(f"loss of step {s}: missing")
                continue
            self.value(f"loss[{s}]", float(a[s]), float(b[s]))
        self.compared.append(f"losses[{steps[0]}..{steps[-1]}]" if steps else "losses[]")


def _train_losses(path: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(path) if r.get("kind") == "train"}


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


def _planned(spec: CampaignSpec, run: str, n_train: int) -> tuple[int, int]:
    config = spec.run_config(run)
    return config.planned_steps(n_train), config.steps_per_epoch(n_train)


# --- verification of a fresh run -------------------------------------------------------------
def verify_restart(
    spec: CampaignSpec,
    *,
    run: str = "control",
    workdir: Path,
    corpus_path: Path | None = None,
    base_dir: str | Path | None = None,
    n_steps: int | None = None,
    k_steps: int | None = None,
    check: bool = True,
) -> RestartReport:
    """Train n steps uninterrupted vs k steps + exit + resume to n, in fresh processes.

    The reference and the first half run side by side (one thread each by default), then the
    resume. The compared state is each side's checkpoint at step n.

    Args:
        spec: The campaign spec.
        run: The run whose config is checked (``control`` by default).
        workdir: An empty scratch folder.
        corpus_path: The corpus file (checked against its pinned sha256 by every process).
        base_dir: Or: the spec's folder, where the spec's corpus path is resolved.
        n_steps: Steps to compare; default: past the end of the second epoch.
        k_steps: Where the interruption happens; default: the middle of the second epoch.
        check: Raise ``NoUsableRestart`` on any difference (default); False returns the report.

    Raises:
        NoUsableRestart: A process failed or the comparison found a difference (``check``).
        SpecError: Invalid n/k.
    """
    t0 = time.perf_counter()
    corpus_path = _restart_corpus(spec, corpus_path=corpus_path, base_dir=base_dir)
    run_id = spec.run_id(run)
    config = spec.run_config(run)
    n, k, spe = _fresh_steps(
        spec, run=run, corpus_path=corpus_path, n_steps=n_steps, k_steps=k_steps
    )
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    ref, rst = workdir / "reference", workdir / "restarted"
    first, resumed = _run_three_processes(
        spec, run=run, workdir=workdir, corpus_path=corpus_path, ref=ref, rst=rst, n=n, k=k
    )
    device = resumed.get("device", "cpu")
    cmp = _Comparer(0.0 if device == "cpu" else GPU_ATOL)
    cmp.losses(
        _train_losses(ref / "run" / METRICS_FILE),
        _train_losses(rst / "run" / METRICS_FILE),
        list(range(1, n + 1)),
    )
    _compare_checkpoints(cmp, spec, run=run, ref=ref / "checkpoints", rst=rst / "checkpoints", n=n)
    report = RestartReport(
        identical=not cmp.mismatches,
        compared_steps=n,
        max_abs_diff=cmp.max_abs_diff,
        save_s=(first["timings"]["save_s"] or [None])[-1],
        restore_s=resumed["timings"]["restore_s"],
        total_s=time.perf_counter() - t0,
        k=k,
        n=n,
        threads=config.threads,
        run_id=run_id,
        mode="fresh",
        resume=config.resume,
        device=device,
        atol=cmp.atol,
        tolerance_reason=GPU_TOLERANCE_REASON if cmp.atol else "",
        k_mid_epoch=k % spe != 0,
        compared=cmp.compared,
        mismatches=cmp.mismatches[:20],
    )
    if check and not report.identical:
        raise NoUsableRestart(
            run_id,
            f"restart from step {k} is not identical to the uninterrupted run: "
            + "; ".join(report.mismatches[:3]),
            step=k,
        )
    return report


def _restart_corpus(
    spec: CampaignSpec, *, corpus_path: Path | None, base_dir: str | Path | None
) -> Path:
    """The corpus file a restart check trains on: given, or resolved from the spec's folder."""
    from gpucampaign.corpus import corpus_path as spec_corpus_path

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
    spec: CampaignSpec, *, run: str, corpus_path: Path, n_steps: int | None, k_steps: int | None
) -> tuple[int, int, int]:
    """``(n, k, steps_per_epoch)``: the given steps, or the defaults for this run's size."""
    from gpucampaign.corpus import open_corpus
    from gpucampaign.recipe_runtime import train_rows

    assert spec.corpus is not None
    corpus = open_corpus(corpus_path, spec=spec, base_dir=None, run_id=spec.run_id(run))
    planned, spe = _planned(spec, run, train_rows(spec, run=run, corpus=corpus))
    dn, dk = default_steps(planned_steps=planned, steps_per_epoch=spe)
    n = n_steps or (dn if k_steps is None or k_steps < dn else min(planned, k_steps + spe))
    k = k_steps or (dk if dk < n else max(1, n // 2))
    if not 0 < k < n <= planned:
        raise SpecError(
            f"a restart check needs 0 < k < n <= {planned} planned steps (got k={k}, n={n}).",
            field="k_steps",
        )
    return n, k, spe


def _run_three_processes(
    spec: CampaignSpec,
    *,
    run: str,
    workdir: Path,
    corpus_path: Path,
    ref: Path,
    rst: Path,
    n: int,
    k: int,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Reference to n beside first half to k, then the resume to n; the first and resumed
    processes' results."""
    run_id = spec.run_id(run)
    threads = spec.run_config(run).threads
    spec_json = _write_child_spec(spec, workdir)

    def args(side: Path, stop: int, tag: str) -> list[str]:
        return _child_args(
            spec_json=spec_json,
            run=run,
            corpus=corpus_path,
            out=side / "run",
            store=side / "checkpoints",
            result=workdir / f"{tag}.json",
            stop_after=stop,
            checkpoint_every=n,
        )

    p_ref = _spawn(args(ref, n, "reference"), threads=threads, workdir=workdir, name="reference")
    p_k = _spawn(args(rst, k, "first"), threads=threads, workdir=workdir, name="first")
    first = _wait(p_k, run_id=run_id, what=f"first (train {k} steps, save, exit)")
    p_resume = _spawn(args(rst, n, "resumed"), threads=threads, workdir=workdir, name="resumed")
    _wait(p_ref, run_id=run_id, what=f"reference ({n} steps uninterrupted)")
    resumed = _wait(p_resume, run_id=run_id, what=f"resumed (load step {k}, continue to {n})")
    if resumed.get("resumed_from_step") != k:
        raise NoUsableRestart(
            run_id,
            f"the resumed process started from step {resumed.get('resumed_from_step')}, "
            f"not from the checkpoint of step {k}",
            step=k,
        )
    return first, resumed


def _compare_checkpoints(
    cmp: _Comparer, spec: CampaignSpec, *, run: str, ref: Path, rst: Path, n: int
) -> None:
    """Compare the two sides' checkpoints of step n: parameters and every train state part."""
    run_id = spec.run_id(run)
    cfg_sha = run_config_sha256(spec, run)
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


def compare_states(
    cmp: _Comparer, a: LoadedCheckpoint, b: LoadedCheckpoint, *, skip_rng: tuple[str, ...] = ()
) -> None:
    """Compare two checkpoints' parameters and every train state part (wall-clock sums aside).

    ``skip_rng`` names global generators left out, for a side that trained in a process whose
    other threads may draw from them.
    """
    cmp.tree("params", a.model_state, b.model_state)
    for comp in ("optimizer", "scheduler", "scaler", "rng", "cursor"):
        sides = [ck.train_state[comp] for ck in (a, b)]
        if comp == "rng" and skip_rng:
            sides = [{k: v for k, v in s.items() if k not in skip_rng} for s in sides]
        cmp.tree(comp, sides[0], sides[1])
    counters = [
        {c: v for c, v in ck.train_state["counters"].items() if c not in _IGNORED_COUNTERS}
        for ck in (a, b)
    ]
    cmp.tree("counters", counters[0], counters[1])


# --- verification of an existing campaign output -------------------------------------------
def verify_checkpoint_resume(
    spec: CampaignSpec,
    *,
    run: str,
    corpus_path: Path,
    store: Store,
    run_dir: Path,
    workdir: Path,
    m_steps: int = 20,
    check: bool = True,
) -> RestartReport:
    """Resume a finished or running campaign's latest good checkpoint in a fresh process.

    Args:
        spec: The campaign's spec.
        run: Run name (``control`` or a variant).
        corpus_path: The pinned corpus file.
        store: The campaign's checkpoint store.
        run_dir: The original run folder ``OUT/runs/<run_id>/`` (its ``metrics.jsonl``).
        workdir: An empty scratch folder.
        m_steps: Steps to resume and compare.
        check: Raise ``NoUsableRestart`` on a difference (default).

    Raises:
        NoUsableRestart: No usable checkpoint, nothing recorded to compare with, a failed
            process, or a difference (``check``).
    """
    t0 = time.perf_counter()
    assert spec.corpus is not None, "a restart check needs the spec's corpus"
    run_id = spec.run_id(run)
    config = spec.run_config(run)
    ck = _resume_point(spec, run=run, store=store)
    start, planned = ck.step, int(ck.meta["planned_steps"])
    original = _train_losses(Path(run_dir) / METRICS_FILE)
    steps = [s for s in range(start + 1, min(planned, start + m_steps) + 1) if s in original]
    if not steps:
        raise NoUsableRestart(
            run_id,
            f"the original run recorded no loss after step {start} to compare with",
            step=start,
        )
    n = steps[-1]
    local, resumed, cmp = replay(
        spec,
        run=run,
        run_id=run_id,
        corpus_path=corpus_path,
        store=store,
        workdir=workdir,
        start=start,
        n=n,
        original=original,
        steps=steps,
    )
    device = resumed.get("device", "cpu")
    if n == planned:
        _compare_final_models(cmp, Path(run_dir) / MODEL_DIR, workdir / "run" / MODEL_DIR)
    report = RestartReport(
        identical=not cmp.mismatches,
        compared_steps=len(steps),
        max_abs_diff=cmp.max_abs_diff,
        save_s=float(ck.meta.get("write_s", 0.0)) + float(ck.meta.get("upload_s", 0.0)),
        restore_s=resumed["timings"]["restore_s"],
        total_s=time.perf_counter() - t0,
        k=start,
        n=n,
        threads=config.threads,
        run_id=run_id,
        mode="checkpoint",
        resume=config.resume,
        device=device,
        atol=cmp.atol,
        k_mid_epoch=start % int(ck.meta.get("steps_per_epoch") or 1) != 0,
        tolerance_reason=GPU_TOLERANCE_REASON if cmp.atol else "",
        compared=cmp.compared,
        mismatches=cmp.mismatches[:20],
    )
    return require_identical(
        report,
        check=check,
        start=start,
        what=f"resuming the checkpoint of step {start} does not reproduce the recorded run",
    )


def replay(
    spec: CampaignSpec,
    *,
    run: str,
    run_id: str,
    corpus_path: str | Path,
    store: Store,
    workdir: str | Path,
    start: int,
    n: int,
    original: dict[int, float],
    steps: list[int],
) -> tuple[LocalStore, dict[str, Any], _Comparer]:
    """Copy the checkpoint of ``start`` out of the store, resume it in a fresh process up to
    step ``n``, and compare its losses at ``steps`` with the ``original`` run's: exactly on
    CPU, within ``GPU_ATOL`` on a GPU.

    Returns:
        The local copy of the checkpoints, the child's result and the comparer (for more).
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    local = _copy_checkpoint(store, run_id=run_id, step=start, dst=workdir / "checkpoints")
    resumed = _resume_in_child(
        spec, run=run, corpus_path=Path(corpus_path), store=local, workdir=workdir, start=start, n=n
    )
    cmp = _Comparer(0.0 if resumed.get("device", "cpu") == "cpu" else GPU_ATOL)
    cmp.losses(original, _train_losses(workdir / "run" / METRICS_FILE), steps)
    return local, resumed, cmp


def require_identical(
    report: RestartReport, *, check: bool, start: int, what: str
) -> RestartReport:
    """The report, or with ``check`` a ``NoUsableRestart`` naming ``what`` and the first
    mismatches when the resumed run differs."""
    if check and not report.identical:
        reason = f"{what}: " + "; ".join(report.mismatches[:3])
        raise NoUsableRestart(report.run_id, reason, step=start)
    return report


def _resume_point(spec: CampaignSpec, *, run: str, store: Store) -> LoadedCheckpoint:
    """The latest good checkpoint, or the previous kept one when the latest is the final step
    (resuming the final step would train nothing)."""
    run_id = spec.run_id(run)
    manager = CheckpointManager(
        store, run_id=run_id, config_sha256=run_config_sha256(spec, run), keep=10**6
    )
    ck, refused = manager.load_latest()
    if ck is None:
        raise NoUsableRestart(
            run_id,
            "no usable checkpoint in the store" + (": " + "; ".join(refused) if refused else ""),
        )
    if ck.step >= int(ck.meta["planned_steps"]):
        ck, _ = manager.load_latest(max_step=ck.step - 1)
        if ck is None:
            raise NoUsableRestart(
                run_id,
                "only the final checkpoint is kept: there is no "
                "earlier one to resume (keep >= 2 checkpoints)",
            )
    return ck


def _copy_checkpoint(store: Store, *, run_id: str, step: int, dst: Path) -> LocalStore:
    """A local store holding only the checkpoint of ``step``, with ``LATEST`` pointing at it."""
    local = LocalStore(dst)
    src = f"{run_id}/{step_dirname(step)}"
    for name in (*PAYLOAD_FILES, META_FILE):
        store.get_file(f"{src}/{name}", dst=local.root / src / name)
    meta_sha = hashlib.sha256(local.read_bytes(f"{src}/{META_FILE}")).hexdigest()
    pointer = {"step": step, "dir": step_dirname(step), "meta_sha256": meta_sha}
    local.write_bytes(f"{run_id}/{LATEST_FILE}", data=json.dumps(pointer).encode())
    return local


def _resume_in_child(
    spec: CampaignSpec,
    *,
    run: str,
    corpus_path: Path,
    store: LocalStore,
    workdir: Path,
    start: int,
    n: int,
) -> dict[str, Any]:
    """Resume the checkpoint of ``start`` to ``n`` in a fresh process; its result."""
    run_id = spec.run_id(run)
    proc = _spawn(
        _child_args(
            spec_json=_write_child_spec(spec, workdir),
            run=run,
            corpus=corpus_path.resolve(),
            out=workdir / "run",
            store=store.root,
            result=workdir / "resumed.json",
            stop_after=n,
            checkpoint_every=n,
        ),
        threads=spec.run_config(run).threads,
        workdir=workdir,
        name="resumed",
    )
    resumed = _wait(proc, run_id=run_id, what=f"resumed (load step {start}, continue to {n})")
    if resumed.get("resumed_from_step") != start:
        raise NoUsableRestart(
            run_id, f"the fresh process did not resume from step {start}", step=start
        )
    return resumed


def _compare_final_models(cmp: _Comparer, original: Path, resumed: Path) -> None:
    """Compare the final model weights, when the original run kept its model folder."""
    from safetensors.torch import load_file

    if (original / "model.safetensors").is_file():
        cmp.tree(
            "params",
            load_file(str(original / "model.safetensors")),
            load_file(str(resumed / "model.safetensors")),
        )


@dataclass(frozen=True)
class OutputCheckTarget:
    """What the scheduled check of an output folder needs: the spec, the pinned corpus, the runs."""

    spec: CampaignSpec
    corpus_path: Path
    store: Store
    runs: dict[str, str]  # run name -> run ID, for runs with checkpoints in the store


def output_check_target(
    out_dir: str | Path, *, spec_path: str | Path | None = None
) -> OutputCheckTarget:
    """Find the spec, corpus and checkpointed runs of a campaign output folder.

    The spec is ``OUT/spec.yaml`` (the copy kept at the start) unless ``spec_path`` is given.
    The corpus is the first file holding the pinned sha256 among: the copy the manifest (or
    ``inputs.json``, written at the start) names, the spec's path relative to the spec file's
    folder, and the same path inside ``OUT``.
    The store is the one the spec's ``storage.url`` names (``OUT/checkpoints`` for 'local').

    Raises:
        SpecError: No spec, or no file with the pinned corpus hash.
        NoUsableRestart: No run of the spec has a checkpoint in the store.
    """
    from gpucampaign.manifest import INPUTS, corpus_file
    from gpucampaign.pins import input_sha256
    from gpucampaign.spec import load_spec, resolve_inside
    from gpucampaign.storage import open_store

    out = Path(out_dir)
    src = Path(spec_path) if spec_path is not None else out / "spec.yaml"
    spec = load_spec(src)
    if spec.corpus is None:
        raise SpecError(
            "the spec has no 'corpus' section: a restart check resumes training on it.",
            field="corpus",
        )
    candidates: list[Path] = []
    for record, key in (("manifest.json", "corpus"), (INPUTS, "corpus")):
        if (out / record).is_file():
            ref = json.loads((out / record).read_text(encoding="utf-8")).get(key) or {}
            if ref.get("kind") == "copied" and ref.get("path"):
                candidates.append(corpus_file(out, ref))
    candidates += [
        resolve_inside(src.resolve().parent, spec.corpus.path, field="corpus.path"),
        resolve_inside(out, spec.corpus.path, field="corpus.path"),
    ]
    pinned = spec.corpus.sha256
    corpus = next((c for c in candidates if c.exists() and input_sha256(c) == pinned), None)
    if corpus is None:
        raise SpecError(
            f"field 'corpus.sha256': no file with the pinned hash {pinned[:12]}... was found at "
            + ", ".join(str(c) for c in dict.fromkeys(candidates))
            + "; give --spec the campaign's own spec file so its corpus path resolves.",
            field="corpus.sha256",
        )
    store = open_store(spec.storage.url, out_dir=out)
    runs = {r: spec.run_id(r) for r in spec.run_names() if store.list(spec.run_id(r))}
    if not runs:
        raise NoUsableRestart(
            spec.name,
            f"no run of campaign '{spec.name}' has a checkpoint "
            f"in {store.url}: "
            "nothing can be restarted before the rental ends",
        )
    return OutputCheckTarget(spec=spec, corpus_path=corpus, store=store, runs=runs)


def main(argv: list[str] | None = None) -> int:
    """``python -m gpucampaign.restart child ...`` (used by the verifications above)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "child":
        sys.stderr.write("usage: python -m gpucampaign.restart child --spec ... (internal)\n")
        return 2
    return _child_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
