"""GPU bench: a recipe of a few hundred MB of parameters, campaign vs bare loop, and the
checkpoint of its 1-2 GB training state.

On a CUDA device, measured in one run:

- throughput: ``train_run`` (metrics, evaluation, checkpoints, the data path) vs a bare
  PyTorch loop of the same model, data, steps and seed with the data already on the device;
- the checkpoint stall of that run (its saves hold the model and Adam's moments);
- save vs a raw fsync write and restore vs a raw read of a 1.5 GB state (``bench/checkpoint.py``).

Without a GPU it prints why and exits 0. Writes ``bench/results/gpu-<device>.md``.

Usage: python bench/gpu.py [--out FILE] [--hidden 4096] [--layers 8]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))


def bare_loop_cuda(spec, corpus, steps: int) -> float:  # noqa: ANN001
    """Seconds of a plain loop on the device: same model, optimizer, batch, steps and seed."""
    from overhead import plain_steps

    from gpucampaign.engine.devices import build_optimizer, build_scheduler, seed_everything
    from gpucampaign.recipes import build_model, fit_input_stats

    cfg = spec.run_config("control")
    train = corpus.split("train")
    X = torch.as_tensor(train.X, dtype=torch.float32)
    y = torch.as_tensor(train.y, dtype=torch.long)
    seed_everything(cfg.seed)
    model = build_model(cfg, n_features=X.shape[1], n_classes=len(corpus.classes))
    fit_input_stats(model, X)
    model.cuda()
    X, y = X.cuda(), y.cuda()
    opt = build_optimizer(cfg, model.parameters())
    sched = build_scheduler(cfg, opt, planned_steps=steps)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    plain_steps(model, opt, sched, X, y, steps=steps, batch_size=cfg.batch_size, seed=cfg.seed)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def bench_training(tmp: Path, *, hidden: int, layers: int, repeats: int) -> list[str]:
    import yaml

    from gpucampaign.cli.scaffold import init_campaign, write_spec_copy
    from gpucampaign.data.corpus import load_spec_corpus
    from gpucampaign.engine.loop import train_run
    from gpucampaign.spec import load_spec
    from gpucampaign.storage import LocalStore

    src = init_campaign(tmp / "init")
    data = yaml.safe_load(src.read_text())
    data["control"].update(
        {"hidden": [hidden] * layers, "batch_size": 256, "epochs": 20, "eval_every": 10**6}
    )
    path = write_spec_copy(data, source_dir=src.parent, dest=tmp / "gpu")
    spec = load_spec(path)
    corpus = load_spec_corpus(spec, base_dir=path.parent)
    params = sum(p.numel() for p in torch.nn.Linear(hidden, hidden).parameters()) * layers
    ratios, stalls, saves = [], [], []
    for i in range(repeats):
        res = train_run(
            spec,
            run=spec.resolve_run("control"),
            corpus=corpus,
            store=LocalStore(tmp / f"ck-{i}"),
            out_dir=tmp / f"run-{i}",
        )
        bare = bare_loop_cuda(spec, corpus, res.planned_steps)
        ratios.append(bare / res.timings["train_s"])
        stalls.append(sum(res.timings["save_s"]) / res.timings["train_s"])
        saves += res.timings["save_s"]
    med = statistics.median
    return [
        f"- recipe: MLP {layers} x {hidden} (~{params * 4 / 2**20:.0f} MB of fp32 parameters), "
        f"{res.planned_steps} steps, batch 256, step {1000 * res.timings['step_s']:.1f} ms",
        f"- throughput campaign / bare loop: min {min(ratios):.2f}x, median {med(ratios):.2f}x, "
        f"max {max(ratios):.2f}x (goal >= 0.97x: {'met' if med(ratios) >= 0.97 else 'MISSED'})",
        f"- checkpoint stall / training time: median {100 * med(stalls):.2f}% "
        f"({len(saves)} saves, median {med(saves):.2f} s each)",
    ]


def bench_io(tmp: Path, *, mb: int, repeats: int) -> list[str]:
    import checkpoint as ckbench

    (tmp / "io").mkdir()
    r = ckbench.bench_io(mb, repeats, tmp / "io", settle_s=1.0)
    s, ld = r["save_ratios"], r["restore_ratios"]
    return [
        f"- {r['state_mb']:.0f} MB state: save {r['save_s']:.2f} s vs raw write "
        f"{r['raw_write_s']:.2f} s: {statistics.median(s):.2f}x (min {min(s):.2f}, max "
        f"{max(s):.2f}; goal >= 0.8x)",
        f"- restore {r['restore_s']:.2f} s vs raw read {r['raw_read_s']:.2f} s: "
        f"{statistics.median(ld):.2f}x (min {min(ld):.2f}, max {max(ld):.2f}; goal >= 0.8x)",
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--mb", type=int, default=1536, help="State size of the I/O bench, MB.")
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench/gpu.py: skipped, no CUDA device on this machine")
        return 0
    name = torch.cuda.get_device_name(0)
    lines = [
        f"# GPU bench on {name}",
        "",
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, torch {torch.__version__}",
        "",
    ]
    with tempfile.TemporaryDirectory(prefix="gpucampaign-gpubench-") as tmp:
        lines += bench_training(Path(tmp), hidden=a.hidden, layers=a.layers, repeats=a.repeats)
        lines += bench_io(Path(tmp), mb=a.mb, repeats=a.repeats)
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    out = a.out or ROOT / "bench" / "results" / f"gpu-{slug}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print(out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
