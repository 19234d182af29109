"""GPU bench: a campaign's training against bare loops, with a profile of where each
millisecond of the difference goes, and the checkpoint of a 1-2 GB state in GPU memory.

On a CUDA device (``--smoke``: on any device, a tiny model, seconds; the tests run it):

- throughput, each over at least ``--min-train-s`` (180) seconds of training, ``--repeats``
  times: ``train_run`` of an MLP of about 1 GB of fp32 parameters in bf16 (``place_data``:
  ``device``, its tensor corpus batched on the GPU) against two bare loops of the same model,
  data, steps and seed: ``same-loader`` (the campaign's own loader and batch copy:
  ``engine.parts.make_loader``, ``place_train_split``, ``BatchCopy``) and ``fastest`` (data
  and every step's indices on the device before it starts). The campaign's training time is
  its steps (``timings.train_s``); the wait for its last save is measured apart
  (``timings.final_save_s``) and reported beside it;
- a ``torch.profiler`` trace of ``--profile-steps`` steps of each (the campaign's through a
  hook of its loop): per step, each op's device time (CPU time on the CPU), the device's
  idle time, and the difference campaign - bare, op by op, which sums to the difference of
  their step times;
- ``--io``: save and restore from GPU memory as the loop does them, against raw I/O;
- ``loop`` (``bench/gpu_loop.py``): the loop's cost per step on 2 and 8 ms steps, the stall of
  each save, a resume's restore and its time to the first step.

Each part can run alone (``--parts``) and adds its figures to the results of the same device
(``bench/results/gpu-<device>.json``, rendered to ``.md``), so a device session of ten-minute
calls runs them in turn. The machine's load average and the device are named with every
figure. Without a GPU (and without ``--smoke``) it says so and exits 0.

Usage: python bench/gpu.py [--parts throughput,profile,io,loop] [--min-train-s 180] [--repeats 2]
       [--loop-ms 2,8] [--loop-s 20]
       [--profile-steps 300] [--hidden 4096] [--layers 16] [--batch 1024] [--precision bf16]
       [--out-dir bench/results] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import gpu_loop  # noqa: E402  (bench/gpu_loop.py)

PARTS = ("throughput", "profile", "io", "loop")
#: Rows of the profile's difference table (the rest is summed as one).
TOP_OPS = 15


def now_context(device: torch.device) -> dict[str, Any]:
    """What every figure is recorded with: when, the device, the load."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {
        "at": f"{datetime.now(UTC):%Y-%m-%d %H:%M:%S} UTC",
        "device": name,
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
    }


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --- the workload: the demo's digits, a deep MLP ---------------------------------------------
class Workload:
    """The spec, corpus and sizes every part trains (one temporary folder)."""

    def __init__(self, tmp: Path, a: argparse.Namespace, device: torch.device) -> None:
        import yaml

        from gpucampaign.cli.scaffold import init_campaign, write_spec_copy
        from gpucampaign.config import load_spec
        from gpucampaign.data.corpus import load_spec_corpus

        self.tmp, self.device, self.args = tmp, device, a
        src = init_campaign(tmp / "init")
        data = yaml.safe_load(src.read_text())
        data["control"].update(
            {
                "hidden": [a.hidden] * a.layers,
                "batch_size": a.batch,
                "epochs": 10**6,
                "max_steps": 10,
                "eval_every": 10**8,
                "precision": a.precision,
                "device": "cuda" if device.type == "cuda" else "cpu",
                "place_data": "device",
            }
        )
        # A throughput bench, not a question: the deep MLP on digits need not reach the floor.
        data.setdefault("stop_rules", {})["below_threshold"] = False
        self.data, self.src = data, src
        self.write_spec_copy, self.load_spec = write_spec_copy, load_spec
        path = write_spec_copy(data, source_dir=src.parent, dest=tmp / "spec")
        self.corpus = load_spec_corpus(load_spec(path), base_dir=path.parent)
        self._n = 0

    def spec(self, *, steps: int, place_data: str = "device") -> Any:
        """The spec of a run of ``steps`` steps (a new folder for each)."""
        self._n += 1
        data = json.loads(json.dumps(self.data))
        data["control"].update({"max_steps": steps, "place_data": place_data})
        path = self.write_spec_copy(data, source_dir=self.src.parent, dest=self.tmp / f"s{self._n}")
        return self.load_spec(path)

    def campaign_resumed(self, steps: int) -> Any:
        """A run stopped at half its steps (its checkpoint saved), then resumed by a second
        ``train_run`` in the same folder: the second call's result (restore, first step)."""
        from gpucampaign.engine.loop import train_run
        from gpucampaign.folder.layout import RunFolder
        from gpucampaign.storage import LocalStore

        spec = self.spec(steps=steps)
        run = spec.resolve_run("control")
        kw = {
            "run": run,
            "corpus": self.corpus,
            "store": LocalStore(self.tmp / f"ck{self._n}"),
            "run_folder": RunFolder.scratch(self.tmp / f"run{self._n}", run.run_id),
        }
        train_run(spec, stop_after_steps=steps // 2, **kw)
        return train_run(spec, **kw)

    def campaign(self, steps: int, *, hook: Any = None, place_data: str = "device") -> Any:
        """``train_run`` of the control for ``steps`` steps; ``hook``: a loop hook factory."""
        from gpucampaign.engine import registry
        from gpucampaign.engine.loop import train_run
        from gpucampaign.folder.layout import RunFolder
        from gpucampaign.storage import LocalStore

        spec = self.spec(steps=steps, place_data=place_data)
        if hook is not None:
            registry.register(hook)
        try:
            return train_run(
                spec,
                run=spec.resolve_run("control"),
                corpus=self.corpus,
                store=LocalStore(self.tmp / f"ck{self._n}"),
                run_folder=RunFolder.scratch(
                    self.tmp / f"run{self._n}", spec.resolve_run("control").run_id
                ),
            )
        finally:
            if hook is not None:
                registry.HOOKS.remove(hook)


def bare_setup(w: Workload, steps: int) -> tuple[Any, Any, Any, Any, Any]:
    """The plain loop's model, optimizer, scheduler, config and autocast dtype."""
    from gpucampaign.builtin import build_model, fit_input_stats
    from gpucampaign.engine.devices import (
        AMP_DTYPES,
        build_optimizer,
        build_scheduler,
        seed_everything,
    )

    cfg = w.spec(steps=steps).run_config("control")
    X, _ = w.corpus.split("train").tensors()
    seed_everything(cfg.seed)
    model = build_model(cfg, n_features=X.shape[1], n_classes=len(w.corpus.classes))
    fit_input_stats(model, X)
    model.to(w.device).train()
    opt = build_optimizer(cfg, model.parameters())
    return (
        model,
        opt,
        build_scheduler(cfg, opt, planned_steps=steps),
        cfg,
        AMP_DTYPES[cfg.precision],
    )


def fastest_batches(w: Workload, cfg: Any, steps: int) -> Iterator[tuple[Any, Any]]:
    """Every step's rows, the data and the indices on the device before the first step."""
    X, y = (t.to(w.device) for t in w.corpus.split("train").tensors())
    gen = torch.Generator().manual_seed(cfg.seed)
    epochs = -(-steps // -(-len(X) // cfg.batch_size))
    order = torch.stack([torch.randperm(len(X), generator=gen) for _ in range(epochs)])
    idx = [b for row in order.to(w.device) for b in row.split(cfg.batch_size)][:steps]
    sync(w.device)
    return ((X[i], y[i]) for i in idx)


def same_loader_batches(w: Workload, cfg: Any, steps: int) -> Iterator[tuple[Any, Any]]:
    """The campaign's own loader (placed as it places it) and its batch copy."""
    from torch.utils.data import TensorDataset

    from gpucampaign.engine.parts import BatchCopy, make_loader, place_train_split

    train = TensorDataset(*w.corpus.split("train").tensors())
    gen = torch.Generator().manual_seed(cfg.seed)
    placed = place_train_split(train, config=cfg, device=w.device)
    loader = make_loader(train, config=cfg, generator=gen, device=w.device, placed=placed)
    copy = BatchCopy(w.device) if placed is None else (lambda b: b)
    done = 0
    while True:
        for batch in loader:
            yield copy(batch)
            done += 1
            if done == steps:
                return


BARE = {"fastest": fastest_batches, "same-loader": same_loader_batches}


def bare_loop(
    w: Workload, kind: str, steps: int, *, each: Callable[[], None] | None = None
) -> float:
    """Seconds of ``steps`` plain steps (``kind``: ``BARE``'s batches); ``each`` after a step."""
    model, opt, sched, cfg, dtype = bare_setup(w, steps)
    batches = BARE[kind](w, cfg, steps)
    sync(w.device)
    t0 = time.perf_counter()
    for xb, yb in batches:
        with torch.autocast(w.device.type, dtype=dtype, enabled=dtype is not None):
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if sched is not None:
            sched.step()
        if each is not None:
            each()
    sync(w.device)
    return time.perf_counter() - t0


# --- throughput ---------------------------------------------------------------------------------
def steps_for(w: Workload, seconds: float) -> tuple[int, float]:
    """Steps that take at least ``seconds`` in the fastest loop (measured on 40 steps after
    10 of warm-up), and that step time."""
    bare_loop(w, "fastest", 10)
    step_s = bare_loop(w, "fastest", 40) / 40
    return max(20, math.ceil(seconds / step_s)), step_s


def throughput(w: Workload) -> dict[str, Any]:
    a = w.args
    steps, step_s = steps_for(w, a.min_train_s)
    rounds = []
    for _ in range(a.repeats):
        ctx = now_context(w.device)
        res = w.campaign(steps)
        t = res.timings
        fastest = bare_loop(w, "fastest", steps) if "fastest" in a.bare else math.nan
        same = bare_loop(w, "same-loader", steps) if "same-loader" in a.bare else math.nan
        rounds.append(
            {
                **ctx,
                "steps": steps,
                "campaign_train_s": t["train_s"],
                "campaign_final_save_s": t.get("final_save_s"),
                "campaign_stall_s": sum(t["stall_s"]),
                "campaign_saves": len(t["save_s"]),
                "bare_fastest_s": fastest,
                "bare_same_loader_s": same,
                "vs_fastest": fastest / t["train_s"],
                "vs_same_loader": same / t["train_s"],
            }
        )
        print(json.dumps(rounds[-1]), flush=True)
    return {"calibrated_step_s": step_s, "rounds": rounds}


# --- profile ------------------------------------------------------------------------------------
class StepClock:
    """Steps the profiler; the wall time of its active window (synchronized at both ends)."""

    def __init__(self, prof: Any, *, device: torch.device, skip: int, active: int) -> None:
        self.prof, self.device, self.skip, self.active = prof, device, skip, active
        self.n, self.t0, self.wall = 0, 0.0, 0.0

    def __call__(self) -> None:
        self.n += 1
        if self.n == self.skip:
            sync(self.device)
            self.t0 = time.perf_counter()
        elif self.n == self.skip + self.active:
            sync(self.device)
            self.wall = time.perf_counter() - self.t0
        self.prof.step()


def profiled(w: Workload, run: Callable[[StepClock], None], *, steps: int, trace: Path) -> dict:
    """Per-step milliseconds of ``run``'s ops over ``steps`` active steps, its wall time per
    step, the ops' total (device time on CUDA, CPU time elsewhere) and the idle rest."""
    from torch.profiler import ProfilerActivity, profile, schedule

    cuda = w.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    skip = 20
    with profile(
        activities=activities, schedule=schedule(wait=skip - 5, warmup=5, active=steps)
    ) as prof:
        clock = StepClock(prof, device=w.device, skip=skip, active=steps)
        run(clock)
    prof.export_chrome_trace(str(trace))
    ops: dict[str, float] = {}
    for e in prof.key_averages():
        us = e.self_device_time_total if cuda else e.self_cpu_time_total
        if us > 0 and not e.key.startswith("ProfilerStep"):
            ops[e.key] = ops.get(e.key, 0.0) + us / 1000 / steps
    wall = 1000 * clock.wall / steps
    busy = sum(ops.values())
    return {"wall_ms": wall, "busy_ms": busy, "idle_ms": wall - busy, "ops_ms": ops}


def difference(campaign: dict, bare: dict) -> list[dict[str, Any]]:
    """Campaign - bare, per step: the ops that differ most, the rest summed, and the idle
    time; the rows sum to the difference of the wall times."""
    keys = set(campaign["ops_ms"]) | set(bare["ops_ms"])
    diffs = {k: campaign["ops_ms"].get(k, 0.0) - bare["ops_ms"].get(k, 0.0) for k in keys}
    top = sorted(diffs, key=lambda k: -abs(diffs[k]))[:TOP_OPS]
    rows = [{"where": k, "ms": diffs[k]} for k in top]
    rows.append({"where": "other ops", "ms": sum(v for k, v in diffs.items() if k not in top)})
    rows.append({"where": "idle (no op running)", "ms": campaign["idle_ms"] - bare["idle_ms"]})
    return rows


def profile_part(w: Workload) -> dict[str, Any]:
    a = w.args
    n = a.profile_steps
    total = n + 30
    traces = Path(a.trace_dir or w.tmp)
    traces.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"steps": n, **now_context(w.device)}
    from gpucampaign.engine.hooks import Hook

    def campaign(clock: StepClock) -> None:
        class Clocked(Hook):
            def after_step(self) -> None:
                clock()

        w.campaign(total, hook=lambda r, args: Clocked())

    out["campaign"] = profiled(w, campaign, steps=n, trace=traces / "campaign.json")
    for kind in BARE:
        out[kind] = profiled(
            w,
            lambda c, k=kind: bare_loop(w, k, total, each=c),
            steps=n,
            trace=traces / f"{kind}.json",
        )
        out[f"difference_vs_{kind}"] = difference(out["campaign"], out[kind])
    out["traces"] = str(traces)
    return out


def bench_gpu_checkpoint(tmp: Path, *, mb: int, repeats: int) -> list[str]:
    """Save and restore a model + Adam state living in GPU memory, as the training loop does."""
    import checkpoint as ckbench

    from gpucampaign.checkpoint.manager import CheckpointManager
    from gpucampaign.checkpoint.state import BackgroundSaves, snapshot
    from gpucampaign.folder.layout import checkpoint_step_dir
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
            for p in (store.root / mgr.run_id / checkpoint_step_dir(i + 1)).iterdir():
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


def io_part(w: Workload) -> dict[str, Any]:
    lines = bench_gpu_checkpoint(w.tmp / "io", mb=w.args.mb, repeats=w.args.repeats)
    return {**now_context(w.device), "lines": lines}


# --- the results file -------------------------------------------------------------------------
def render(results: dict[str, Any]) -> str:
    """The results as markdown: every figure with its device, load and date."""
    lines = [f"# GPU bench: {results.get('device', '?')}", ""]
    lines += [f"Recorded by `bench/gpu.py` ({results.get('smoke') and 'smoke run' or 'full'}).", ""]
    tp = results.get("throughput")
    if tp:
        lines += ["## Training: campaign vs bare loops", ""]
        lines += [
            "| at (load avg) | steps | campaign train s | final save s (apart) | "
            "vs same-loader | vs fastest |",
            "|---|---|---|---|---|---|",
        ]
        for r in tp["rounds"]:
            lines.append(
                f"| {r['at']} ({' '.join(map(str, r['load_avg']))}) | {r['steps']} | "
                f"{r['campaign_train_s']:.1f} | {r['campaign_final_save_s'] or 0:.2f} | "
                f"{r['vs_same_loader']:.3f}x | {r['vs_fastest']:.3f}x |"
            )
        med = statistics.median
        same = med(r["vs_same_loader"] for r in tp["rounds"])  # NaN when not timed
        fast = med(r["vs_fastest"] for r in tp["rounds"])
        lines += [
            "",
            f"Median: {same:.3f}x of the same-loader loop (goal >= 0.97: "
            f"{'met' if same >= 0.97 else 'MISSED'}), {fast:.3f}x of the fastest (goal >= 0.95: "
            f"{'met' if fast >= 0.95 else 'MISSED'}).",
            "",
        ]
    prof = results.get("profile")
    if prof:
        lines += [
            f"## Profile: {prof['steps']} steps each ({prof['at']}, load {prof['load_avg']})",
            "",
        ]
        lines += ["| loop | step ms | ops ms | idle ms |", "|---|---|---|---|"]
        for kind in ("campaign", *BARE):
            p = prof[kind]
            lines.append(
                f"| {kind} | {p['wall_ms']:.3f} | {p['busy_ms']:.3f} | {p['idle_ms']:.3f} |"
            )
        for kind in BARE:
            gap = prof["campaign"]["wall_ms"] - prof[kind]["wall_ms"]
            lines += ["", f"Where the campaign's {gap:+.3f} ms a step against `{kind}` go:", ""]
            lines += ["| where | ms per step |", "|---|---|"]
            lines += [f"| `{r['where']}` | {r['ms']:+.3f} |" for r in prof[f"difference_vs_{kind}"]]
        lines.append("")
    if results.get("loop"):
        lines += gpu_loop.render(results["loop"])
    io = results.get("io")
    if io:
        lines += [f"## Checkpoint save and restore ({io['at']}, load {io['load_avg']})", ""]
        lines += [*io["lines"], ""]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default=",".join(PARTS[:2]), help=f"Of {', '.join(PARTS)}.")
    ap.add_argument("--min-train-s", type=float, default=180.0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--profile-steps", type=int, default=300)
    ap.add_argument(
        "--bare", default="fastest,same-loader", help="The bare loops the throughput part times."
    )
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--batch", type=int, default=1024, help="At most the 1437 training rows.")
    ap.add_argument("--mb", type=int, default=1536, help="State size of the I/O part, MB.")
    ap.add_argument("--precision", default="bf16", choices=("fp32", "bf16", "fp16"))
    ap.add_argument(
        "--loop-ms", default="2,8", help="The loop part's bare step times, ms (comma-separated)."
    )
    ap.add_argument("--loop-s", type=float, default=20.0, help="The loop part's seconds a run.")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--trace-dir", type=Path, default=None, help="Keep the chrome traces here.")
    ap.add_argument("--smoke", action="store_true", help="Any device, a tiny model, seconds.")
    a = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not a.smoke:
        print("bench/gpu.py: skipped, no CUDA device on this machine")
        return 0
    if a.smoke:
        a.hidden, a.layers, a.batch, a.mb = 32, 2, 128, 8
        a.min_train_s, a.repeats, a.profile_steps = min(a.min_train_s, 1.0), 1, 10
        a.loop_s = min(a.loop_s, 0.3)
        if not cuda:
            a.precision = "fp32"
    parts = [p for p in a.parts.split(",") if p]
    a.loop_ms = [float(x) for x in a.loop_ms.split(",") if x]
    a.bare = [b for b in a.bare.split(",") if b]
    if set(a.bare) - set(BARE):
        ap.error(f"--bare: among {', '.join(BARE)}")
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        ap.error(f"--parts: {', '.join(unknown)} not among {', '.join(PARTS)}")
    device = torch.device("cuda" if cuda else "cpu")
    ctx = now_context(device)
    slug = re.sub(r"[^a-z0-9]+", "-", ctx["device"].lower()).strip("-")
    stem = a.out_dir / (f"gpu-{slug}" + ("-smoke" if a.smoke else ""))
    path = stem.with_suffix(".json")
    results = json.loads(path.read_text()) if path.is_file() else {}
    results.update(device=ctx["device"], smoke=a.smoke)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpucampaign-gpubench-") as tmp:
        w = Workload(Path(tmp), a, device)
        for part in parts:
            measure = {
                "throughput": throughput,
                "profile": profile_part,
                "io": io_part,
                "loop": lambda w: gpu_loop.loop_part(w, sys.modules[__name__]),
            }[part]
            try:
                results[part] = measure(w)
                results.pop(f"{part}_error", None)
            except Exception:  # one part failing still leaves the others' figures
                results[f"{part}_error"] = traceback.format_exc()
                print(results[f"{part}_error"], file=sys.stderr)
            print(f"{part}: done {time.perf_counter() - start:.0f} s into the run", flush=True)
    a.out_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    stem.with_suffix(".md").write_text(render(results))
    print(f"written: {path} and {stem.with_suffix('.md')}")
    return 1 if any(k.endswith("_error") for k in results) else 0


if __name__ == "__main__":
    sys.exit(main())
