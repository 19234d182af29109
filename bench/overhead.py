"""Orchestration overhead: the whole campaign flow against the bare training loops it runs.

Measured in one run, on the example spec (or --spec), as ratios (the machine is shared):

- bare loop: for every run of the spec, a plain torch loop (same model, optimizer, scheduler,
  batch size, precision and number of steps) with no metrics, checkpoints or evaluation;
- library: ``train_run`` for every run, without Prefect (metrics, evaluation, checkpoints);
- embedded start: a trivial flow in a new process: Prefect's temporary server start-up, paid
  once per `campaign run`;
- campaign: ``campaign run`` in a new process, the whole flow (audit, pilots, decision, runs
  under the GPU lock, restart verification in new processes, predictions, close, manifest
  and the fresh-process verification of the output folder).

Reported: campaign / bare, (campaign - embedded start) / bare, library / bare, the per-run
orchestration cost (campaign - embedded start - library) / number of runs, in seconds, and
where the campaign's time went per phase (from its timeline.jsonl).
Goals (reported, not asserted): per-run orchestration under 5% of the run's training time, and
the demo campaign under 3 minutes. On the demo's second-long runs the per-run share is large by
construction: the fixed cost per phase (new processes for the restart check and the reload
check, hashing, Prefect task runs) does not grow with the training, so it matters for short
runs only; on a run of an hour, 4 s is 0.1%.

Usage: python bench/overhead.py [--spec examples/digits/campaign.yaml] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from gpucampaign.corpus import load_spec_corpus
from gpucampaign.recipes import build_model, fit_input_stats
from gpucampaign.spec import CampaignSpec, load_spec
from gpucampaign.storage import LocalStore
from gpucampaign.training import build_optimizer, build_scheduler, seed_everything, train_run

ROOT = Path(__file__).resolve().parents[1]
QUIET = {"PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
         "DO_NOT_TRACK": "1", "PREFECT_LOGGING_LEVEL": "WARNING"}


def planned_steps(spec: CampaignSpec, run: str, n_train: int) -> int:
    cfg = spec.run_config(run)
    steps = cfg.epochs * -(-n_train // cfg.batch_size)
    return min(steps, cfg.max_steps) if cfg.max_steps else steps


def bare_loop(spec: CampaignSpec, run: str, *, X: torch.Tensor, y: torch.Tensor, n_classes: int) -> float:
    """Seconds of a plain torch training loop of ``run``: no metrics, evaluation or checkpoints."""
    cfg = spec.run_config(run)
    torch.set_num_threads(cfg.threads)
    seed_everything(cfg.seed)
    model = build_model(cfg, n_features=X.shape[1], n_classes=n_classes)
    fit_input_stats(model, X)
    opt = build_optimizer(cfg, model.parameters())
    steps = planned_steps(spec, run, len(X))
    sched = build_scheduler(cfg, opt, planned_steps=steps)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.precision)
    gen = torch.Generator().manual_seed(cfg.seed)
    t0 = time.perf_counter()
    done = 0
    while done < steps:
        for idx in torch.randperm(len(X), generator=gen).split(cfg.batch_size):
            with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
                loss = torch.nn.functional.cross_entropy(model(X[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if sched is not None:
                sched.step()
            done += 1
            if done == steps:
                break
    return time.perf_counter() - t0


def timed(cmd: list[str], *, cwd: Path) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env={**os.environ, **QUIET}, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default=str(ROOT / "examples" / "digits" / "campaign.yaml"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    spec_path = Path(args.spec).resolve()
    spec = load_spec(spec_path)
    corpus = load_spec_corpus(spec, base_dir=spec_path.parent)
    train = corpus.split("train")
    X = torch.as_tensor(train.X, dtype=torch.float32)
    y = torch.as_tensor(train.y, dtype=torch.long)
    runs = spec.run_names()

    bare = sum(bare_loop(spec, r, X=X, y=y, n_classes=len(corpus.classes)) for r in runs)
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
        t0 = time.perf_counter()
        for r in runs:
            rid = spec.run_id(r)
            train_run(spec, run=r, corpus=corpus, store=LocalStore(Path(tmp) / "ck"), out_dir=Path(tmp) / rid)
        library = time.perf_counter() - t0
        trivial = ("from prefect import flow\n"
                   "@flow\ndef noop():\n    return 1\n"
                   "assert noop() == 1\n")
        start = timed([sys.executable, "-c", trivial], cwd=ROOT)
        campaign = timed([str(Path(sys.executable).parent / "campaign"), "run", str(spec_path),
                          "--out", str(Path(tmp) / "out")], cwd=ROOT)
        phases: dict[str, float] = {}
        for line in (Path(tmp) / "out" / "timeline.jsonl").read_text().splitlines():
            row = json.loads(line)
            phases[row["phase"]] = phases.get(row["phase"], 0.0) + float(row["seconds"])

    n = len(runs)
    result = {
        "runs": n,
        "bare_loop_s": round(bare, 3),
        "library_s": round(library, 3),
        "embedded_start_s": round(start, 3),
        "campaign_s": round(campaign, 3),
        "campaign_over_bare": round(campaign / bare, 2),
        "campaign_without_start_over_bare": round((campaign - start) / bare, 2),
        "library_over_bare": round(library / bare, 2),
        "orchestration_per_run_s": round((campaign - start - library) / n, 3),
        "orchestration_per_run_over_training_per_run": round((campaign - start - library) / library, 2),
        "goal_per_run_overhead_under_5pct": (campaign - start - library) / library < 0.05,
        "goal_demo_under_180s": campaign < 180,
        "campaign_phases_s": {k: round(v, 3) for k, v in phases.items()},
        "outside_recorded_phases_s": round(campaign - start - sum(phases.values()), 3),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{n} runs of {spec.name}: bare torch loops {bare:.2f} s, library {library:.2f} s, "
          f"embedded Prefect start {start:.2f} s, whole campaign {campaign:.2f} s")
    print(f"  campaign / bare loop:                 {result['campaign_over_bare']:.2f}x")
    print(f"  (campaign - Prefect start) / bare:    {result['campaign_without_start_over_bare']:.2f}x")
    print(f"  library (metrics, eval, ckpt) / bare: {result['library_over_bare']:.2f}x")
    print(f"  orchestration per run (campaign - start - library) / runs: {result['orchestration_per_run_s']:.2f} s")
    share = result["orchestration_per_run_over_training_per_run"]
    print(f"  goal per-run overhead < 5% of training: {'met' if share < 0.05 else 'MISSED'} ({share:.0%}); "
          f"goal demo < 3 min: {'met' if campaign < 180 else 'MISSED'} ({campaign:.0f} s)")
    print("  where the campaign's time went (timeline.jsonl, seconds): "
          + ", ".join(f"{k} {v:.2f}" for k, v in phases.items())
          + f"; outside recorded phases (Prefect tasks, manifest, fresh-process verification) "
          f"{result['outside_recorded_phases_s']:.2f}")


if __name__ == "__main__":
    main()
