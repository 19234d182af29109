"""GPU bench: a recipe of about 1 GB of fp32 parameters, campaign vs bare loop in bf16, and
the checkpoint of a 1-2 GB training state held in GPU memory.

On a CUDA device, measured in one run meant to take well under ten minutes (its elapsed time
is printed with each part; the machine's load average goes into the file):

- throughput: ``train_run`` (metrics, evaluation, checkpoints, the data path) vs a bare
  PyTorch loop of the same model, data, steps and seed with the data already on the device,
  both with bf16 autocast (``--precision``);
- the checkpoint stall share of that run (its saves hold the model and Adam's moments);
- save and restore from GPU memory as the training loop does them: the stall (snapshot to
  pinned host memory), then the background save (``BackgroundSaves`` + ``CheckpointManager``)
  until durable, against a raw fsync write of the same bytes; the restore (read, CRC32C,
  ``load_state_dict`` back onto the GPU) against a raw read of the same bytes.

Without a GPU it prints why and exits 0. Writes ``bench/results/gpu-<device>.md``.

Usage: python bench/gpu.py [--out FILE] [--hidden 4096] [--layers 16] [--batch 1024]
       [--epochs 1500] [--mb 1536] [--precision bf16] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))


def bare_loop_cuda(spec, corpus, steps: int) -> float:  # noqa: ANN001
    """Seconds of a plain loop on the device: same model, optimizer, batch, steps and seed."""
    from overhead import plain_step

    from gpucampaign.builtin import build_model, fit_input_stats
    from gpucampaign.engine.devices import (
        AMP_DTYPES,
        build_optimizer,
        build_scheduler,
        seed_everything,
    )

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
    # Every step's indices drawn up front and moved to the device in one transfer: a copy of
    # each step's indices from pageable memory would make the host wait for the GPU at every
    # step, and the baseline must be the fastest plain loop, not a slower one.
    gen = torch.Generator().manual_seed(cfg.seed)
    per_epoch = -(-len(X) // cfg.batch_size)
    epochs = -(-steps // per_epoch)
    order = torch.stack([torch.randperm(len(X), generator=gen) for _ in range(epochs)]).cuda()
    batches = [b for row in order for b in row.split(cfg.batch_size)][:steps]
    dtype = AMP_DTYPES[cfg.precision]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for idx in batches:
        plain_step(model, opt, sched, X, y, idx, dtype=dtype)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def bench_training(
    tmp: Path,
    *,
    hidden: int,
    layers: int,
    batch: int,
    epochs: int,
    repeats: int,
    precision: str,
    save_every: int | None = None,
) -> list[str]:
    import yaml

    from gpucampaign.cli.scaffold import init_campaign, write_spec_copy
    from gpucampaign.data.corpus import load_spec_corpus
    from gpucampaign.engine.loop import train_run
    from gpucampaign.spec import load_spec
    from gpucampaign.storage import LocalStore

    src = init_campaign(tmp / "init")
    data = yaml.safe_load(src.read_text())
    data["control"].update(
        {
            "hidden": [hidden] * layers,
            "batch_size": batch,
            "epochs": epochs,
            "eval_every": 10**6,
            "precision": precision,
        }
    )
    # A throughput bench, not a question: the deep MLP on digits need not reach the floor.
    data.setdefault("stop_rules", {})["below_threshold"] = False
    if save_every:
        data["checkpoint"]["every_steps"] = save_every
    path = write_spec_copy(data, source_dir=src.parent, dest=tmp / "gpu")
    spec = load_spec(path)
    corpus = load_spec_corpus(spec, base_dir=path.parent)
    params = sum(p.numel() for p in torch.nn.Linear(hidden, hidden).parameters()) * layers
    ratios, stalls, saves, stall_each = [], [], [], []
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
        stalls.append(sum(res.timings["stall_s"]) / res.timings["train_s"])
        saves += res.timings["save_s"]
        stall_each += res.timings["stall_s"]
    med = statistics.median
    return [
        f"- recipe: MLP {layers} x {hidden} (~{params * 4 / 2**20:.0f} MB of fp32 parameters), "
        f"{res.planned_steps} steps, batch {batch}, {precision} autocast, step "
        f"{1000 * res.timings['step_s']:.1f} ms",
        f"- throughput campaign / bare loop: min {min(ratios):.2f}x, median {med(ratios):.2f}x, "
        f"max {max(ratios):.2f}x (goal >= 0.97x: {'met' if med(ratios) >= 0.97 else 'MISSED'})",
        f"- checkpoint stall / training time: median {100 * med(stalls):.2f}% "
        f"({len(saves)} saves: the loop waited a median {med(stall_each):.2f} s at each, "
        f"the save itself took {med(saves):.2f} s in the background)",
    ]


def bench_gpu_checkpoint(tmp: Path, *, mb: int, repeats: int) -> list[str]:
    """Save and restore a model + Adam state living in GPU memory, as the training loop does."""
    import checkpoint as ckbench

    from gpucampaign.checkpoint.layout import step_dirname
    from gpucampaign.checkpoint.manager import CheckpointManager
    from gpucampaign.checkpoint.state import BackgroundSaves, snapshot
    from gpucampaign.storage import LocalStore

    model, opt = ckbench.make_state(mb)
    model.cuda()
    for st in opt.state.values():
        for k, v in st.items():
            if isinstance(v, torch.Tensor) and k != "step":
                st[k] = v.cuda()
    nbytes = ckbench.state_bytes(model, opt)
    payload = memoryview(torch.randint(0, 256, (nbytes,), dtype=torch.uint8).numpy())
    store = LocalStore(tmp / "store")
    mgr = CheckpointManager(store, run_id="gpubench-000000000", config_sha256="0" * 64, keep=1)
    background = BackgroundSaves()
    stall, durable, raw_w, restore, raw_r = [], [], [], [], []
    try:
        for i in range(repeats + 1):  # round 0 warms up (pinned allocations, first touch)
            ckbench.settle(1.0)
            t0 = time.perf_counter()
            model_state = snapshot(model.state_dict())
            state = snapshot(ckbench.train_state(opt, i + 1))
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            background.submit(
                lambda s=i + 1, m=model_state, t=state: mgr.save(s, model_state=m, train_state=t)
            )
            saved = background.wait()
            t2 = time.perf_counter()
            ckbench.settle(1.0)
            raw = tmp / "raw.bin"
            t_raw_w = ckbench.raw_write(raw, payload)
            t_raw_r = ckbench.raw_read(raw)
            raw.unlink()
            for p in (store.root / mgr.run_id / step_dirname(i + 1)).iterdir():
                ckbench.evict(p)
            t3 = time.perf_counter()
            ck = mgr.load(i + 1)
            model.load_state_dict(ck.model_state)
            opt.load_state_dict(ck.train_state["optimizer"])
            torch.cuda.synchronize()
            t4 = time.perf_counter()
            del ck
            if i == 0:
                continue
            stall.append(t1 - t0)
            durable.append(t2 - t1)
            raw_w.append(t_raw_w * saved.bytes / nbytes)
            restore.append(t4 - t3)
            raw_r.append(t_raw_r * saved.bytes / nbytes)
    finally:
        background.close()
    med = statistics.median
    save_ratio = [w / d for w, d in zip(raw_w, durable, strict=True)]
    restore_ratio = [r / x for r, x in zip(raw_r, restore, strict=True)]
    return [
        f"- {nbytes / 2**20:.0f} MB state in GPU memory (model + Adam), median of {repeats}:",
        f"  - stall (snapshot to pinned host memory): {med(stall):.2f} s",
        f"  - background save until durable {med(durable):.2f} s vs raw write + fsync "
        f"{med(raw_w):.2f} s: {med(save_ratio):.2f}x (min {min(save_ratio):.2f}, max "
        f"{max(save_ratio):.2f}; goal >= 0.8x)",
        f"  - restore onto the GPU (read, CRC32C, load_state_dict, synchronize) "
        f"{med(restore):.2f} s vs raw read {med(raw_r):.2f} s: {med(restore_ratio):.2f}x "
        f"(min {min(restore_ratio):.2f}, max {max(restore_ratio):.2f}; goal >= 0.8x)",
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--batch", type=int, default=1024, help="At most the 1437 training rows.")
    ap.add_argument("--epochs", type=int, default=1500, help="Two steps each at batch 1024.")
    ap.add_argument("--mb", type=int, default=1536, help="State size of the I/O bench, MB.")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--precision", default="bf16", choices=("fp32", "bf16", "fp16"))
    ap.add_argument("--no-io", action="store_true", help="Only the training part.")
    ap.add_argument("--save-every", type=int, default=None, help="Steps (default: measured).")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench/gpu.py: skipped, no CUDA device on this machine")
        return 0
    start = time.perf_counter()
    name = torch.cuda.get_device_name(0)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    lines = [
        f"# GPU bench on {name}",
        "",
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, torch {torch.__version__}, "
        f"{os.cpu_count()} CPUs, load average at start {load}",
        "",
    ]

    def part(title: str, measure: Callable[[], list[str]]) -> None:
        try:
            got = measure()
        except Exception:  # one part failing still leaves the other's figures
            got = ["```", traceback.format_exc().rstrip(), "```"]
        lines.extend([f"## {title} ({time.perf_counter() - start:.0f} s into the run)", ""])
        lines.extend([*got, ""])
        print("\n".join(lines[-len(got) - 3 :]), flush=True)

    with tempfile.TemporaryDirectory(prefix="gpucampaign-gpubench-") as tmp:
        part(
            "Training in a campaign vs a bare loop",
            lambda: bench_training(
                Path(tmp),
                hidden=a.hidden,
                layers=a.layers,
                batch=a.batch,
                epochs=a.epochs,
                repeats=a.repeats,
                precision=a.precision,
                save_every=a.save_every,
            ),
        )
        (Path(tmp) / "ck").mkdir()
        if not a.no_io:
            part(
                "Checkpoint save and restore from GPU memory",
                lambda: bench_gpu_checkpoint(Path(tmp) / "ck", mb=a.mb, repeats=a.repeats),
            )
    lines.append(f"Whole run: {time.perf_counter() - start:.0f} s.")
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    out = a.out or ROOT / "bench" / "results" / f"gpu-{slug}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
