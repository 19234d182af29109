"""What a restart check compares, and the report it gives.

Per-step losses, parameters and every train state part (optimizer, scheduler, scaler, RNG,
data cursor, counters) are compared exactly on CPU (atol=0); on a GPU a small tolerance is
allowed and recorded with its reason.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from gpucampaign.checkpoint.manager import LoadedCheckpoint
from gpucampaign.checkpoint.trainstate import REQUIRED_STATE
from gpucampaign.config import ResolvedRun
from gpucampaign.core.stoprules import NoUsableRestart
from gpucampaign.folder.layout import WEIGHTS_FILE
from gpucampaign.folder.metrics import read_metrics

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
    checked: str = ""  # which checkpoint was checked, why that one, and how

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)

    @property
    def applies(self) -> str:
        """Which restart applies to this run after an interruption, in one sentence."""
        return resume_text(self.resume)

    @classmethod
    def from_check(
        cls,
        cmp: Comparer,
        resumed: dict[str, Any],
        *,
        run: ResolvedRun,
        mode: str,
        k: int,
        n: int,
        steps_per_epoch: int,
        save_s: float | None,
        t0: float,
    ) -> RestartReport:
        """The report of a check that resumed step ``k`` of ``run`` up to ``n`` in a fresh
        process (``resumed``: that process's result) and compared it with ``cmp``."""
        config = run.config
        return cls(
            identical=not cmp.mismatches,
            compared_steps=cmp.loss_steps,
            max_abs_diff=cmp.max_abs_diff,
            save_s=save_s,
            restore_s=resumed["timings"]["restore_s"],
            total_s=time.perf_counter() - t0,
            k=k,
            n=n,
            threads=config.threads,
            run_id=run.run_id,
            mode=mode,
            resume=config.resume,
            device=resumed.get("device", "cpu"),
            atol=cmp.atol,
            k_mid_epoch=k % max(1, steps_per_epoch) != 0,
            tolerance_reason=GPU_TOLERANCE_REASON if cmp.atol else "",
            compared=cmp.compared,
            mismatches=cmp.mismatches[:20],
        )


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


def require_identical(
    report: RestartReport, *, check: bool, start: int, what: str
) -> RestartReport:
    """The report, or with ``check`` a ``NoUsableRestart`` naming ``what`` and the first
    mismatches when the resumed run differs."""
    if check and not report.identical:
        reason = f"{what}: " + "; ".join(report.mismatches[:3])
        raise NoUsableRestart(report.run_id, reason, step=start)
    return report


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


class Comparer:
    """Collects the differences of one check: what was compared, the largest difference and
    every mismatch beyond ``atol``."""

    def __init__(self, atol: float) -> None:
        self.atol = atol
        self.max_abs_diff = 0.0
        self.mismatches: list[str] = []
        self.compared: list[str] = []
        self.loss_steps = 0

    @classmethod
    def for_device(cls, device: str) -> Comparer:
        """Exact on CPU, ``GPU_ATOL`` on a GPU."""
        return cls(0.0 if device == "cpu" else GPU_ATOL)

    def value(self, name: str, a: Any, b: Any) -> None:
        """Compare two leaves: tensors, floats (NaN equal to NaN) or plain values."""
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
        """Compare two nested dicts/lists leaf by leaf."""
        la, lb = _leaves(a), _leaves(b)
        if set(la) != set(lb):
            self.mismatches.append(f"{name}: different entries {sorted(set(la) ^ set(lb))[:5]}")
        for key in sorted(set(la) & set(lb)):
            self.value(f"{name}.{key}", la[key], lb[key])
        self.compared.append(name)

    def losses(self, a: dict[int, float], b: dict[int, float], steps: list[int]) -> None:
        """Compare the two sides' training losses at ``steps``."""
        for s in steps:
            if s not in a or s not in b:
                self.mismatches.append(f"loss of step {s}: missing")
                continue
            self.value(f"loss[{s}]", float(a[s]), float(b[s]))
        self.loss_steps += len(steps)
        self.compared.append(f"losses[{steps[0]}..{steps[-1]}]" if steps else "losses[]")


def train_losses(path: Path) -> dict[int, float]:
    """Step -> training loss, from a run's ``metrics.jsonl``."""
    return {r["step"]: r["loss"] for r in read_metrics(path) if r.get("kind") == "train"}


def compare_states(
    cmp: Comparer, a: LoadedCheckpoint, b: LoadedCheckpoint, *, skip_rng: tuple[str, ...] = ()
) -> None:
    """Compare two checkpoints' parameters and every train state part (wall-clock sums aside).

    ``skip_rng`` names global generators left out, for a side that trained in a process whose
    other threads may draw from them.
    """
    cmp.tree("params", a.model_state, b.model_state)
    for comp in (c for c in REQUIRED_STATE if c != "counters"):
        sides = [ck.train_state[comp] for ck in (a, b)]
        if comp == "rng" and skip_rng:
            sides = [{k: v for k, v in s.items() if k not in skip_rng} for s in sides]
        cmp.tree(comp, sides[0], sides[1])
    counters = [
        {c: v for c, v in ck.train_state["counters"].items() if c not in _IGNORED_COUNTERS}
        for ck in (a, b)
    ]
    cmp.tree("counters", counters[0], counters[1])


def compare_final_models(cmp: Comparer, original: Path, resumed: Path) -> None:
    """Compare the final model weights, when the original run kept its model folder."""
    # safetensors only when a final model is compared
    from safetensors.torch import load_file

    if (original / WEIGHTS_FILE).is_file():
        cmp.tree(
            "params",
            load_file(str(original / WEIGHTS_FILE)),
            load_file(str(resumed / WEIGHTS_FILE)),
        )
