"""Orchestration overhead: the whole campaign flow against the bare training loops it runs.

Measured in one run, on the example spec (or --spec), as ratios (the machine is shared):

- bare loop: for every run of the spec, a plain torch loop (same model, optimizer, scheduler,
  batch size, precision and number of steps) with no metrics, checkpoints or evaluation;
- library: ``train_run`` for every run, without Prefect (metrics, evaluation, checkpoints);
- start-up: a trivial flow in a new process: Prefect's temporary server, paid once per
  `campaign run` (a long-lived server removes most of it);
- campaign: ``campaign run`` in a new process, with the control only and with the control and
  every variant, --repeats times each (alternated; medians, with the spread printed). The
  difference, per added run, is the per-run cost; what the
  control-only campaign spends beyond start-up and its training is the fixed cost of a
  campaign (audit, pilot, restart verification in new processes, close, manifest, and the
  fresh-process verification of the output folder).

Goals (reported, not asserted): per-run orchestration overhead under 5% of the run's training
time, and the demo campaign under 3 minutes. On the demo's sub-second runs the per-run share is
large by construction: the cost of a Prefect task run, the GPU lock and the progress artifact
does not grow with the training, so it matters for short runs only.

Usage: python bench/overhead.py [--spec examples/digits/campaign.yaml] [--repeats 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from gpucampaign.builtin import build_model, fit_input_stats
from gpucampaign.cli.runner import prefect_environment
from gpucampaign.cli.scaffold import write_spec_copy
from gpucampaign.config import CampaignSpec, load_spec
from gpucampaign.data.corpus import load_spec_corpus
from gpucampaign.engine.devices import build_optimizer, build_scheduler, seed_everything
from gpucampaign.engine.loop import train_run
from gpucampaign.folder.layout import RunFolder
from gpucampaign.storage import LocalStore

ROOT = Path(__file__).resolve().parents[1]
QUIET = prefect_environment(logging_level="WARNING")


def bare_loop(
    spec: CampaignSpec, run: str, *, X: torch.Tensor, y: torch.Tensor, n_classes: int
) -> float:
    """Seconds of a plain torch training loop of ``run``: no metrics, evaluation or checkpoints."""
    cfg = spec.run_config(run)
    torch.set_num_threads(cfg.threads)
    seed_everything(cfg.seed)
    model = build_model(cfg, n_features=X.shape[1], n_classes=n_classes)
    fit_input_stats(model, X)
    opt = build_optimizer(cfg, model.parameters())
    steps = cfg.planned_steps(len(X))
    sched = build_scheduler(cfg, opt, planned_steps=steps)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.precision)
    t0 = time.perf_counter()
    plain_steps(
        model, opt, sched, X, y, steps=steps, batch_size=cfg.batch_size, seed=cfg.seed, dtype=dtype
    )
    return time.perf_counter() - t0


def plain_steps(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    sched: Any,
    X: torch.Tensor,
    y: torch.Tensor,
    *,
    steps: int,
    batch_size: int,
    seed: int,
    dtype: torch.dtype | None = None,
) -> None:
    """``steps`` optimizer steps over shuffled batches of ``(X, y)`` on X's device, and nothing
    else (no metrics, evaluation or checkpoints); ``dtype``: autocast to it, if given."""
    gen = torch.Generator().manual_seed(seed)
    done = 0
    while done < steps:
        for idx in torch.randperm(len(X), generator=gen).split(batch_size):
            plain_step(model, opt, sched, X, y, idx.to(X.device), dtype=dtype)
            done += 1
            if done == steps:
                return


def plain_step(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    sched: Any,
    X: torch.Tensor,
    y: torch.Tensor,
    idx: torch.Tensor,
    *,
    dtype: torch.dtype | None = None,
) -> None:
    """One optimizer step on the rows ``idx`` of ``(X, y)``; ``dtype``: autocast to it (none
    entered without it: a plain loop pays for no context at its steps)."""
    if dtype is None:
        loss = torch.nn.functional.cross_entropy(model(X[idx]), y[idx])
    else:
        with torch.autocast(X.device.type, dtype=dtype):
            loss = torch.nn.functional.cross_entropy(model(X[idx]), y[idx])
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if sched is not None:
        sched.step()


def timed(cmd: list[str], *, cwd: Path) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env={**os.environ, **QUIET}, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(
            f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    return wall


def control_only_spec(spec_path: Path, dest: Path) -> Path:
    """The same campaign without its variants, beside a copy of the files it names."""
    data = yaml.safe_load(spec_path.read_text())
    variants = {v["name"] for v in data.get("variants") or []}
    data["variants"] = []
    data["calendar"] = [s for s in data["calendar"] if s.get("run") not in variants]
    return write_spec_copy(data, source_dir=spec_path.parent, dest=dest)


def phases_of(out: Path) -> dict[str, float]:
    phases: dict[str, float] = {}
    for line in (out / "timeline.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get("seconds") is None:  # a segment's start or heartbeat: its end has the time
            continue
        phases[row["phase"]] = phases.get(row["phase"], 0.0) + float(row["seconds"])
    return phases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default=str(ROOT / "examples" / "digits" / "campaign.yaml"))
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--repeats", type=int, default=3, help="campaign runs of each kind (medians)"
    )
    args = parser.parse_args()
    spec_path = Path(args.spec).resolve()
    spec = load_spec(spec_path)
    runs = spec.run_names()
    if len(runs) < 2:
        raise SystemExit(
            "the spec needs at least one variant: the per-run cost is the slope over runs"
        )
    corpus = load_spec_corpus(spec, base_dir=spec_path.parent)
    train = corpus.split("train")
    X = torch.as_tensor(train.X, dtype=torch.float32)
    y = torch.as_tensor(train.y, dtype=torch.long)

    bare = {r: bare_loop(spec, r, X=X, y=y, n_classes=len(corpus.classes)) for r in runs}
    campaign_bin = str(Path(sys.executable).parent / "campaign")
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
        library: dict[str, float] = {}
        for r in runs:
            rid = spec.run_id(r)
            t0 = time.perf_counter()
            train_run(
                spec,
                run=spec.resolve_run(r),
                corpus=corpus,
                store=LocalStore(Path(tmp) / "ck"),
                run_folder=RunFolder.scratch(Path(tmp) / rid, rid),
            )
            library[r] = time.perf_counter() - t0
        start = timed(
            [
                sys.executable,
                "-c",
                "from prefect import flow\n@flow\ndef noop():\n    return 1\nassert noop() == 1\n",
            ],
            cwd=ROOT,
        )
        single = control_only_spec(spec_path, Path(tmp) / "single")
        ones, fulls = [], []
        for k in range(args.repeats):  # alternated, so drift on a shared machine hits both alike
            ones.append(
                timed(
                    [campaign_bin, "run", str(single), "--out", str(Path(tmp) / f"out1-{k}")],
                    cwd=ROOT,
                )
            )
            fulls.append(
                timed(
                    [campaign_bin, "run", str(spec_path), "--out", str(Path(tmp) / f"out-{k}")],
                    cwd=ROOT,
                )
            )
        one, full = statistics.median(ones), statistics.median(fulls)
        phases = phases_of(Path(tmp) / "out-0")

    n = len(runs)
    variants_library = sum(library[r] for r in runs[1:])
    per_run_total = (full - one) / (n - 1)
    per_run_library = variants_library / (n - 1)
    per_run_overhead = per_run_total - per_run_library
    fixed = one - start - library["control"]
    result = {
        "runs": n,
        "bare_loop_s": round(sum(bare.values()), 3),
        "library_s": round(sum(library.values()), 3),
        "startup_s": round(start, 3),
        "campaign_control_only_s": round(one, 3),
        "campaign_s": round(full, 3),
        "campaign_control_only_all_s": [round(x, 3) for x in ones],
        "campaign_all_s": [round(x, 3) for x in fulls],
        "fixed_campaign_cost_s": round(fixed, 3),
        "per_run_cost_s": round(per_run_total, 3),
        "per_run_training_s": round(per_run_library, 3),
        "per_run_overhead_s": round(per_run_overhead, 3),
        "per_run_overhead_over_training": round(per_run_overhead / per_run_library, 2),
        "library_over_bare": round(sum(library.values()) / sum(bare.values()), 2),
        "campaign_over_bare": round(full / sum(bare.values()), 2),
        "campaign_phases_s": {k: round(v, 3) for k, v in phases.items()},
        "goal_per_run_overhead_under_5pct": _goal(per_run_overhead, per_run_library),
        "goal_demo_under_180s": full < 180,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    share = result["per_run_overhead_over_training"]
    print(
        f"{n} runs of {spec.name}: bare torch loops {sum(bare.values()):.2f} s, library "
        f"{sum(library.values()):.2f} s; "
        f"campaign median {full:.2f} s of {_spread(fulls)} (control only {one:.2f} s of "
        f"{_spread(ones)}); "
        f"Prefect start-up {start:.2f} s"
    )
    print(f"  library (metrics, eval, checkpoints) / bare loop: {result['library_over_bare']:.2f}x")
    print(
        f"  whole campaign / bare loops:                      {result['campaign_over_bare']:.2f}x"
    )
    print(f"  fixed cost of a campaign beyond start-up and training: {fixed:.2f} s")
    print(
        f"  per added run: {per_run_total:.2f} s, of which training {per_run_library:.2f} s and "
        "orchestration "
        f"{per_run_overhead:.2f} s ({share:.0%} of its training)"
    )
    print(
        f"  goal per-run overhead < 5% of training: {result['goal_per_run_overhead_under_5pct']}; "
        f"goal demo < 3 min: {'met' if full < 180 else 'MISSED'} ({full:.0f} s)"
    )
    print(
        "  where the full campaign's recorded time went (timeline.jsonl, s): "
        + ", ".join(f"{k} {v:.2f}" for k, v in phases.items())
    )


def _spread(values: list[float]) -> str:
    return f"{min(values):.1f}-{max(values):.1f} s" if len(values) > 1 else "1 run"


def _goal(overhead: float, training: float) -> str:
    """'met', 'MISSED', or 'not measurable' when noise makes the estimate negative."""
    if overhead < 0:
        return "not measurable (negative estimate: noise exceeds the per-run cost; raise --repeats)"
    return "met" if overhead / training < 0.05 else "MISSED"


if __name__ == "__main__":
    main()
