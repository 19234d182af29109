"""Data-parallel scaling on CPU: samples/s of one run at ``gpus: 2`` over ``gpus: 1``, the
same global batch (``batch_size`` is split over the ranks), ``gloo``, one thread per rank.

The run is the digits corpus with a wider MLP (so a step is compute, not overhead), trained
for ``--steps`` steps through ``train_run`` (the launcher, the ranks, the per-step all-reduce
of the loss and stop flag, the save-decision broadcast and DDP's gradient all-reduce all
included). The rate is the global batch over rank 0's median step time, without the first
``--warmup`` steps; process start-up and the rendezvous are reported apart. Medians of
``--repeats``. On a shared machine with fewer free cores than ranks the ratio says little:
the table records the cores seen.

A GPU figure needs a machine with two GPUs: the same script with ``--device cuda``.

Usage: python bench/ddp_scaling.py [--steps 60] [--repeats 3] [--out bench/results/ddp_scaling.md]
       [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from gpucampaign.config import parse_spec  # noqa: E402
from gpucampaign.data.corpus import load_corpus  # noqa: E402
from gpucampaign.data.tables import write_digits_corpus  # noqa: E402
from gpucampaign.engine.loop import train_run  # noqa: E402
from gpucampaign.folder.layout import RunFolder  # noqa: E402
from gpucampaign.storage import LocalStore  # noqa: E402


def one_run(base: Path, *, gpus: int, steps: int, device: str, batch: int) -> dict[str, Any]:
    """Train the wide MLP for ``steps`` steps on ``gpus`` processes; its measured rates."""
    corpus_file = base / "digits.csv"
    sha = write_digits_corpus(corpus_file)
    spec = parse_spec(
        {
            "name": "ddp-bench",
            "packages": [{"gpu": "b200", "days": 3, "price_usd": 1}],
            "calendar": [{"name": "prep", "kind": "human", "hours": 1}],
            "corpus": {"path": "digits.csv", "sha256": sha},
            "control": {
                "recipe": "mlp",
                "hidden": [1024, 1024],
                "batch_size": batch,
                "epochs": 1000,
                "max_steps": steps,
                "threads": 1,
                "gpus": gpus,
                "device": device,
                "eval_every": steps,
            },
            "checkpoint": {"every_steps": steps},
        }
    )
    run = spec.resolve_run("control")
    out = base / "out" / run.run_id
    t0 = time.perf_counter()
    res = train_run(
        spec,
        run=run,
        corpus=load_corpus(corpus_file, corpus_spec=spec.corpus),
        store=LocalStore(base / "ck"),
        run_folder=RunFolder.scratch(out, run.run_id),
    )
    wall_s = time.perf_counter() - t0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {
        "step_s": [r["step_s"] for r in rows if r["kind"] == "train"],
        "wall_s": wall_s,
        "completed": res.completed,
    }


def measure(*, gpus: int, steps: int, warmup: int, device: str, batch: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="ddp-bench-") as tmp:
        got = one_run(Path(tmp), gpus=gpus, steps=steps, device=device, batch=batch)
    step_s = statistics.median(got["step_s"][warmup:])
    train_s = sum(got["step_s"])
    return {
        "samples_per_s": batch / step_s,
        "step_s": step_s,
        "overhead_s": got["wall_s"] - train_s,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "ddp_scaling.md")
    a = p.parse_args(argv)
    results: dict[int, list[dict[str, float]]] = {1: [], 2: []}
    for _ in range(a.repeats):
        for gpus in (1, 2):  # interleaved: a load change on the machine hits both
            results[gpus].append(
                measure(gpus=gpus, steps=a.steps, warmup=a.warmup, device=a.device, batch=a.batch)
            )

    def med(gpus: int, key: str) -> float:
        return statistics.median(r[key] for r in results[gpus])

    ratios = [
        r2["samples_per_s"] / r1["samples_per_s"]
        for r1, r2 in zip(results[1], results[2], strict=True)
    ]
    lines = [
        "# Data-parallel scaling (`gpus: 2` over `gpus: 1`, same global batch)",
        "",
        f"Device {a.device}, {os.cpu_count()} cores seen (load average "
        f"{os.getloadavg()[0]:.1f} at the end), "
        f"global batch {a.batch}, MLP 64-1024-1024-10 on digits, {a.steps} steps, "
        f"first {a.warmup} left out, {a.repeats} repeats (median; min-max of the ratio).",
        "",
        "| gpus | samples/s | step (ms) | start-up and rest (s) |",
        "|---:|---:|---:|---:|",
        *(
            f"| {g} | {med(g, 'samples_per_s'):.0f} | {1000 * med(g, 'step_s'):.2f} | "
            f"{med(g, 'overhead_s'):.1f} |"
            for g in (1, 2)
        ),
        "",
        f"**Scaling N=2 / N=1: {statistics.median(ratios):.2f}x** "
        f"(min {min(ratios):.2f}, max {max(ratios):.2f}). Ideal 2x; on CPU the two ranks share "
        "the machine's memory bandwidth and pay a gloo all-reduce of the gradients per step.",
        "",
    ]
    text = "\n".join(lines)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
