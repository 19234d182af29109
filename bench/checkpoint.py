"""Checkpoint I/O bench: save and restore of a ~256 MB training state against the raw disk.

Measured in the same run, medians of --repeats:

- raw write: the same number of bytes written with Python and fsynced;
- raw read: the raw file read back into memory, cold (its pages evicted with
  posix_fadvise(DONTNEED) first; the VM host may still cache);
- save: ``CheckpointManager.save`` (the weights written from the tensors' memory, the state
  streamed by ``torch.save``, CRC32C of every byte taken while writing, fsync, rename,
  verify, move LATEST) of a real model + Adam state, until it is durable; deleting the
  checkpoint beyond ``keep`` is reported apart (it is part of the stall, not of making the
  save safe);
- restore: ``CheckpointManager.load`` (each file mapped and read by its CRC32C pass, the
  weights as views of the mapping, ``torch.load(weights_only=True, mmap=True)`` of the
  state), cold like the raw read, then ``load_state_dict`` into the model and optimizer
  (reported apart: that is where the bytes are copied into the model);
- the integrity check alone, both ways: every byte of the files read and checksummed with
  CRC32C (what checkpoints use) and with sha256 (what pins and seals use).

Goals (reported, not asserted): save >= 0.8x raw write, restore >= 0.8x raw read.
It also reports the training stall the checkpoints cause at the chosen save interval: for
the digits control run (measured end to end) and for the 256 MB state (Daly from its
measured save cost, with the spec's default M = 24 h and 30 min tolerable loss).

Usage: python bench/checkpoint.py [--mb 256 [1024 ...]] [--repeats 3] [--dir DIR] [--json]
       [--out bench/results/checkpoint.md] [--no-digits]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from gpucampaign.checkpoint.manager import CheckpointManager
from gpucampaign.checkpoint.savepolicy import choose_save_interval
from gpucampaign.checkpoint.state import capture_rng
from gpucampaign.core.files import new_checksum
from gpucampaign.folder.layout import RunFolder, checkpoint_step_dir
from gpucampaign.storage import LocalStore

MB = 1024 * 1024


def make_state(total_mb: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A model whose weights + Adam's two moments add up to ~total_mb."""
    n_params = total_mb * MB // 4 // 3
    width = 2048
    torch.manual_seed(0)
    layers = [torch.nn.Linear(width, width, bias=False) for _ in range(n_params // (width * width))]
    if n_params % (width * width) >= width:
        layers.append(torch.nn.Linear(width, n_params % (width * width) // width, bias=False))
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    return model, opt


def state_bytes(model: torch.nn.Module, opt: torch.optim.Optimizer) -> int:
    n = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    for s in opt.state.values():
        n += sum(t.numel() * t.element_size() for t in s.values() if isinstance(t, torch.Tensor))
    return n


def raw_write(path: Path, data: memoryview) -> float:
    t0 = time.perf_counter()
    with open(path, "wb", buffering=0) as f:
        for off in range(0, len(data), 16 * MB):
            f.write(data[off : off + 16 * MB])
        os.fsync(f.fileno())
    return time.perf_counter() - t0


def evict(path: Path) -> None:
    """Drop this file's pages from the page cache (this file only), so the next read is cold."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def raw_read(path: Path) -> float:
    evict(path)
    t0 = time.perf_counter()
    with open(path, "rb") as f:
        f.read()
    return time.perf_counter() - t0


def train_state(opt: torch.optim.Optimizer, step: int) -> dict:
    return {
        "optimizer": opt.state_dict(),
        "scheduler": None,
        "scaler": {},
        "rng": capture_rng(),
        "cursor": {
            "epoch": 0,
            "batch_in_epoch": step,
            "epoch_generator_state": torch.Generator().get_state(),
        },
        "counters": {"global_step": step},
    }


def checksum_file(path: Path, kind: str) -> str:
    """Read ``path`` in 16 MB chunks and checksum it (``crc32c`` or ``sha256``)."""
    h = new_checksum(kind)
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(16 * MB):
            h.update(chunk)
    return str(h.hexdigest())


def settle(seconds: float) -> None:
    """Flush everything and let the disk rest before a timed write."""
    os.sync()
    time.sleep(seconds)


def bench_io(total_mb: int, repeats: int, workdir: Path, *, settle_s: float) -> dict:
    model, opt = make_state(total_mb)
    nbytes = state_bytes(model, opt)
    payload = memoryview(torch.randint(0, 256, (nbytes,), dtype=torch.uint8).numpy())
    store = LocalStore(workdir / "store")
    mgr = CheckpointManager(store, run_id="bench-0000000000", config_sha256="0" * 64, keep=1)
    w, r, s, stall, ld, ld_apply, file_bytes = [], [], [], [], [], [], 0
    verify: dict[str, list[float]] = {"crc32c": [], "sha256": []}
    # Round 0 warms up (first-touch allocations) and is not counted; the order of raw write
    # and save alternates so neither always runs on a disk the other just filled.
    for i in range(repeats + 1):
        raw = workdir / f"raw-{i}.bin"

        # Each timed write starts on a settled disk: this VM's disk takes a burst of a few
        # hundred MB fast, then slows down until it has rested, so a write that follows
        # another one is measured 2-4x slower whatever it is.
        if i % 2:
            settle(settle_s)
            saved = mgr.save(
                i + 1, model_state=model.state_dict(), train_state=train_state(opt, i + 1)
            )
            settle(settle_s)
            t_raw = raw_write(raw, payload)
        else:
            settle(settle_s)
            t_raw = raw_write(raw, payload)
            settle(settle_s)
            saved = mgr.save(
                i + 1, model_state=model.state_dict(), train_state=train_state(opt, i + 1)
            )
        t_read = raw_read(raw)
        raw.unlink()
        settle(settle_s)
        for p in (store.root / mgr.run_id / checkpoint_step_dir(i + 1)).iterdir():
            evict(p)
        t0 = time.perf_counter()
        ck = mgr.load(i + 1)
        t_load = time.perf_counter() - t0
        model.load_state_dict(ck.model_state)
        opt.load_state_dict(ck.train_state["optimizer"])
        t_apply = time.perf_counter() - t0
        del ck
        # The integrity check alone, cold: read + checksum of the files, two threads like the
        # restore, with each of the two checksums.
        files = sorted((store.root / mgr.run_id / checkpoint_step_dir(i + 1)).iterdir())
        for kind in verify:
            for p in files:
                evict(p)
            t0 = time.perf_counter()
            with ThreadPoolExecutor(2) as pool:
                list(pool.map(lambda p, k=kind: checksum_file(p, k), files))
            verify[kind].append(time.perf_counter() - t0)
        if os.environ.get("BENCH_TRACE"):
            print(
                f"  round {i}: raw write {t_raw:.3f} s, save "
                f"{saved.write_s:.3f}+{saved.commit_s:.3f}"
                f"+{saved.prune_s:.3f} s, raw read {t_read:.3f} s, restore {t_load:.3f} s",
                file=sys.stderr,
            )
        if i == 0:
            continue
        w.append(t_raw)
        r.append(t_read)
        s.append(saved.durable_s)
        stall.append(saved.save_s)
        file_bytes = saved.bytes
        ld.append(t_load)
        ld_apply.append(t_apply)
    med = statistics.median
    out = {
        "state_mb": nbytes / MB,
        "checkpoint_file_mb": file_bytes / MB,
        "repeats": repeats,
        "raw_write_mb_s": nbytes / MB / med(w),
        "raw_read_mb_s": nbytes / MB / med(r),
        "save_mb_s": file_bytes / MB / med(s),
        "restore_mb_s": file_bytes / MB / med(ld),
        "restore_into_model_mb_s": file_bytes / MB / med(ld_apply),
        "save_durable_s": med(s),
        "save_s": med(stall),
        "restore_s": med(ld),
        "raw_write_s": med(w),
        "raw_read_s": med(r),
        "verify_read_crc32c_s": med(verify["crc32c"][1:]),
        "verify_read_sha256_s": med(verify["sha256"][1:]),
        "settle_s": settle_s,
        # Per repeat, for min/median/max: the same bytes' raw time over the library's time.
        "save_ratios": [file_bytes / nbytes * wi / si for wi, si in zip(w, s, strict=True)],
        "restore_ratios": [file_bytes / nbytes * ri / li for ri, li in zip(r, ld, strict=True)],
        "save_s_all": s,
        "restore_s_all": ld,
    }
    out["save_vs_raw_write"] = out["save_mb_s"] / out["raw_write_mb_s"]
    out["restore_vs_raw_read"] = out["restore_mb_s"] / out["raw_read_mb_s"]
    out["restore_into_model_vs_raw_read"] = out["restore_into_model_mb_s"] / out["raw_read_mb_s"]
    mtbi, tolerable = 24 * 3600.0, 30 * 60.0
    for step_s in (0.1, 1.0):
        si = choose_save_interval(
            delta_s=out["save_s"],
            step_s=step_s,
            mtbi_s=mtbi,
            tolerable_s=tolerable,
            planned_steps=10**9,
        )
        out[f"stall_at_step_{step_s:g}s"] = {
            "every_steps": si.every_steps,
            "tau_s": si.tau_s,
            "daly_s": si.daly_s,
            "stall_fraction": out["save_s"] / (si.every_steps * step_s + out["save_s"]),
        }
    return out


def bench_digits(workdir: Path) -> dict:
    """The example campaign's control run: the stall its checkpoints actually caused."""
    from gpucampaign.cli.scaffold import init_campaign
    from gpucampaign.config import load_spec
    from gpucampaign.data.corpus import load_spec_corpus
    from gpucampaign.engine.loop import train_run

    spec_path = init_campaign(workdir / "digits")
    spec = load_spec(spec_path)
    corpus = load_spec_corpus(spec, base_dir=spec_path.parent)
    res = train_run(
        spec,
        run=spec.resolve_run("control"),
        corpus=corpus,
        store=LocalStore(workdir / "digits-out" / "checkpoints"),
        run_folder=RunFolder.scratch(
            workdir / "digits-out" / "run", spec.resolve_run("control").run_id
        ),
    )
    t = res.timings
    return {
        "planned_steps": res.planned_steps,
        "step_s": t["step_s"],
        "save_s": t["save_s"],
        "n_checkpoints": res.n_checkpoints,
        "save_interval": res.save_interval,
        "stall_fraction_of_train_s": sum(t["save_s"]) / t["train_s"],
        "stall_at_interval": (
            statistics.median(t["save_s"])
            / (res.save_interval["every_steps"] * t["step_s"] + statistics.median(t["save_s"]))
        ),
    }


def load_average() -> str:
    """The ``uptime`` line: how loaded the machine was."""
    try:
        import subprocess

        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def io_lines(r: dict) -> list[str]:
    lines = [
        f"state {r['state_mb']:.0f} MB (checkpoint files {r['checkpoint_file_mb']:.0f} MB), "
        f"median of {r['repeats']}",
        f"  raw write+fsync  {r['raw_write_mb_s']:7.0f} MB/s   save     {r['save_mb_s']:7.0f} MB/s"
        f"   ratio {r['save_vs_raw_write']:.2f}x (per repeat "
        f"{', '.join(f'{x:.2f}' for x in r['save_ratios'])}; goal >= 0.8x; durable in "
        f"{r['save_durable_s']:.2f} s, stall incl. deleting the old one {r['save_s']:.2f} s)",
        f"  raw read         {r['raw_read_mb_s']:7.0f} MB/s   restore  {r['restore_mb_s']:7.0f} "
        f"MB/s   ratio {r['restore_vs_raw_read']:.2f}x (per repeat "
        f"{', '.join(f'{x:.2f}' for x in r['restore_ratios'])}; goal >= 0.8x; with "
        f"load_state_dict {r['restore_into_model_vs_raw_read']:.2f}x)",
        "  the integrity check alone (cold read of the files + checksum): CRC32C "
        f"{r['verify_read_crc32c_s']:.2f} s, sha256 {r['verify_read_sha256_s']:.2f} s; "
        f"raw read {r['raw_read_s']:.2f} s, restore {r['restore_s']:.2f} s",
    ]
    for key in ("stall_at_step_0.1s", "stall_at_step_1s"):
        s = r[key]
        lines.append(
            f"  {key}: save {r['save_s']:.2f} s every {s['every_steps']} steps (tau "
            f"{s['tau_s']:.0f} s, Daly {s['daly_s']:.0f} s): stall "
            f"{100 * s['stall_fraction']:.2f}%"
        )
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--mb", type=int, nargs="+", default=[256], help="Sizes of model + Adam state in MB."
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--dir", type=Path, default=None, help="Scratch folder (default: a temp folder)."
    )
    ap.add_argument("--json", action="store_true", help="Print one JSON object only.")
    ap.add_argument(
        "--settle", type=float, default=3.0, help="Seconds of rest before each timed write."
    )
    ap.add_argument(
        "--out", type=Path, default=None, help="Also write the report here (with its JSON)."
    )
    ap.add_argument("--no-digits", action="store_true", help="Skip the digits control run.")
    a = ap.parse_args()
    torch.set_num_threads(1)
    load_before = load_average()
    workdir = Path(tempfile.mkdtemp(prefix="bench-ckpt-", dir=a.dir))
    try:
        io_res = {}
        for mb in a.mb:
            (workdir / f"io-{mb}").mkdir()
            io_res[mb] = bench_io(mb, a.repeats, workdir / f"io-{mb}", settle_s=a.settle)
            shutil.rmtree(workdir / f"io-{mb}", ignore_errors=True)
        digits = None if a.no_digits else bench_digits(workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    result = {
        "io": io_res[a.mb[0]] if len(a.mb) == 1 else io_res,
        "digits_control": digits,
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "uptime_before": load_before,
        "uptime_after": load_average(),
    }
    if a.json:
        print(json.dumps(result, indent=2))
        return 0
    lines = [f"before: {result['uptime_before']}", f"after:  {result['uptime_after']}"]
    for r in io_res.values():
        lines += io_lines(r)
    d = digits
    if d is not None:
        lines.append(
            f"digits control: {d['planned_steps']} steps at {1000 * d['step_s']:.2f} ms, "
            f"{d['n_checkpoints']} saves "
            f"({', '.join(f'{1000 * x:.1f}' for x in d['save_s'])} ms), interval "
            f"{d['save_interval']['every_steps']} "
            f"steps ({d['save_interval']['source']}): stall "
            f"{100 * d['stall_fraction_of_train_s']:.1f}% of train time, "
            f"{100 * d['stall_at_interval']:.2f}% at the chosen interval"
        )
    print("\n".join(lines))
    print(json.dumps(result), file=sys.stderr)
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(
            "# Checkpoint I/O (`python bench/checkpoint.py "
            + " ".join(sys.argv[1:])
            + "`)\n\n```\n"
            + "\n".join(lines)
            + "\n```\n\n```json\n"
            + json.dumps(result, indent=2)
            + "\n```\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
