"""S3 storage bench: a checkpoint's files uploaded and restored through ``S3Store`` against
plain boto3 ``upload_file``/``download_file`` of the same bytes to the same server.

In one run, against a local SeaweedFS started for the bench (or the server of
``AWS_ENDPOINT_URL`` and the AWS keys with ``--env``), alternating the contenders, medians of
``--repeats``, three operations:

- upload: the files one after the other. S3Store: ``put_file`` as the checkpoint code calls
  it, with the sha256 its meta.json recorded (multipart upload with a CRC32C per request that
  the server checks, the file's own CRC32C computed meanwhile from a separate read, then size,
  sha256 metadata and the object's checksum verified);
- restore: how ``CheckpointManager.load`` reads a checkpoint from a remote store, the files at
  once (``fetch_payload``: into memory, size and sha256 checked), against plain boto3
  ``download_file`` of the same files, also at once (the issue's baseline);
- restore_memory: the same S3Store restore against plain boto3 reading the files at once into
  memory too (``download_fileobj`` into ``io.BytesIO``, nothing checked): stricter, reported;
- download: the files one after the other to local files (S3Store ``get_file``, the path of
  ``campaign retrieve``: size and sha256 checked, rename) against ``download_file``.

Contenders: plain boto3 with its default client (which adds a CRC32 to every request); plain
boto3 with the same client and transfer settings as S3Store (no per-request checksum): the
strict baseline; local disk (``LocalStore``, reported only).

Ratios are throughput relative to S3Store (>= 1 means S3Store is at least as fast); the goal
is S3Store >= 0.9x the strict plain-boto3 baseline for the checkpoint's upload and restore.

Usage: python bench/storage.py [--mb 128] [--repeats 9] [--env] [--json] [--out FILE]
(``--out bench/results/storage.md`` is the recorded run.)
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # infra/ is a plain folder of the checkout

from gpucampaign.checkpoint.manager import CheckpointManager  # noqa: E402
from gpucampaign.checkpoint.state import capture_rng  # noqa: E402
from gpucampaign.folder.layout import checkpoint_step_dir  # noqa: E402
from gpucampaign.storage import LocalStore, S3Store  # noqa: E402
from gpucampaign.storage.s3client import s3_client  # noqa: E402

MB = 1024 * 1024


def checkpoint_files(folder: Path, *, total_mb: int) -> list[Path]:
    """A real checkpoint (model + Adam state of ~total_mb) saved to a local folder."""
    torch.manual_seed(0)
    width = 1024
    n = max(1, total_mb * MB // 4 // 3 // (width * width))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(n)])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    state = {
        "optimizer": opt.state_dict(),
        "scheduler": {},
        "scaler": {},
        "rng": capture_rng(),
        "cursor": {
            "epoch": 0,
            "batch_in_epoch": 1,
            "epoch_generator_state": torch.Generator().get_state(),
        },
        "counters": {"global_step": 1},
    }
    mgr = CheckpointManager(LocalStore(folder), run_id="bench-run", config_sha256="0" * 64)
    mgr.save(1, model_state=model.state_dict(), train_state=state)
    step = folder / "bench-run" / checkpoint_step_dir(1)
    return sorted(p for p in step.iterdir() if p.name != "meta.json")


def _timed(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _at_once(jobs: list[Callable[[], object]]) -> None:
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        for job in [pool.submit(j) for j in jobs]:
            job.result()


OPS = ("upload", "restore", "restore_memory", "download")


def contenders(
    env: dict[str, str], *, bucket: str, local: Path, files: list[Path], back: Path
) -> dict[str, dict[str, Callable[[], object]]]:
    """name -> {operation: run it once} over the same files, each under its own prefix."""
    import boto3
    from boto3.s3.transfer import TransferConfig

    store = S3Store(f"s3://{bucket}/bench/s3store", env=env)
    meta = json.loads((files[0].parent / "meta.json").read_text())["files"]
    manager = CheckpointManager(store, run_id="bench-run", config_sha256="0" * 64)
    default = boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name=env.get("AWS_DEFAULT_REGION", "us-east-1"),
    )
    same = s3_client(env)
    # The same part size and parallelism as S3Store, so only the extra work differs.
    cfg = TransferConfig(
        multipart_threshold=64 * MB, multipart_chunksize=16 * MB, max_concurrency=8
    )
    disk = LocalStore(local)

    def plain(client, prefix):
        def to_file(f: Path) -> Callable[[], None]:
            target = back / f"{prefix[6:]}-{f.name}"
            return lambda: client.download_file(
                bucket, f"{prefix}/{f.name}", str(target), Config=cfg
            )

        def into_memory(f: Path) -> Callable[[], bytes]:
            def fetch() -> bytes:
                buf = io.BytesIO()
                client.download_fileobj(bucket, f"{prefix}/{f.name}", buf, Config=cfg)
                return buf.getvalue()

            return fetch

        return {
            "upload": lambda: [
                client.upload_file(str(f), bucket, f"{prefix}/{f.name}", Config=cfg) for f in files
            ],
            "restore": lambda: _at_once([to_file(f) for f in files]),
            "restore_memory": lambda: _at_once([into_memory(f) for f in files]),
            "download": lambda: [to_file(f)() for f in files],
        }

    # Both restore rows of a store time the same call (only plain boto3 differs between them).
    def s3store_restore() -> None:
        manager.fetch_payload("ck", files=meta)

    def disk_restore() -> None:
        _at_once([lambda f=f: disk.read_hashed(f.name) for f in files])

    return {
        "s3store": {
            "upload": lambda: [
                store.put_file(f"ck/{f.name}", src=f, sha256=meta[f.name]["sha256"]) for f in files
            ],
            "restore": s3store_restore,
            "restore_memory": s3store_restore,
            "download": lambda: [
                store.get_file(f"ck/{f.name}", dst=back / f"s3store-{f.name}") for f in files
            ],
        },
        "boto3_default": plain(default, "bench/default"),
        "boto3_same_config": plain(same, "bench/same"),
        "local_disk": {
            "upload": lambda: [disk.put_file(f.name, src=f) for f in files],
            "restore": disk_restore,
            "restore_memory": disk_restore,
            "download": lambda: [disk.get_file(f.name, dst=back / f"disk-{f.name}") for f in files],
        },
    }


def run(env: dict[str, str], *, bucket: str, mb: int, repeats: int, work: Path) -> dict:
    files = checkpoint_files(work / "ckpt", total_mb=mb)
    total = sum(f.stat().st_size for f in files)
    back = work / "back"
    back.mkdir()
    runs = contenders(env, bucket=bucket, local=work / "local", files=files, back=back)
    times: dict[str, dict[str, list[float]]] = {k: {op: [] for op in OPS} for k in runs}
    names = list(runs)
    for i in range(repeats):
        # Alternated, and each repeat starts with another contender: drift, and the disk
        # writeback the previous one left, hit every contender alike.
        for name in names[i % len(names) :] + names[: i % len(names)]:
            ops = runs[name]
            for op in OPS:
                times[name][op].append(_timed(ops[op]))
                for f in back.iterdir():  # every download writes a new file, none replaces one
                    f.unlink()
                os.sync()  # untimed: no op pays for the disk writes of the one before
    med = {k: {op: statistics.median(v) for op, v in ops.items()} for k, ops in times.items()}
    result = {
        "files": [f.name for f in files],
        "bytes": total,
        "repeats": repeats,
        "median_s": med,
        "mb_s": {k: {op: total / MB / s for op, s in ops.items()} for k, ops in med.items()},
    }
    others = ("boto3_default", "boto3_same_config", "local_disk")
    result["s3store_vs"] = {k: {op: med[k][op] / med["s3store"][op] for op in OPS} for k in others}
    # The same ratio repeat by repeat (min, median, max): how far the noise moves it.
    result["per_repeat"] = {
        k: {
            op: _spread([b / a for a, b in zip(times["s3store"][op], times[k][op], strict=True)])
            for op in OPS
        }
        for k in others
    }
    strict = result["s3store_vs"]["boto3_same_config"]
    result["goal_met"] = min(strict["upload"], strict["restore"]) >= 0.9
    return result


def _spread(values: list[float]) -> list[float]:
    return [min(values), statistics.median(values), max(values)]


def markdown(r: dict, *, load: str) -> str:
    """The run as a page for ``bench/results/storage.md``."""
    lines = [
        "# S3Store vs plain boto3 (`python bench/storage.py`)",
        "",
        f"Checkpoint of {r['bytes'] / MB:.0f} MB in {len(r['files'])} files "
        f"({', '.join(r['files'])}), {r['repeats']} alternated repeats, local SeaweedFS; "
        f"load average before the run: {load}. Ratios are S3Store's throughput over the "
        "contender's: the median of each side's times, then (min / median / max) the ratio "
        "repeat by repeat.",
        "",
        "| S3Store vs | " + " | ".join(OPS) + " |",
        "|---" * (len(OPS) + 1) + "|",
    ]
    for name, ops in r["s3store_vs"].items():
        cells = [
            f"{ops[op]:.2f}x ({' / '.join(f'{v:.2f}' for v in r['per_repeat'][name][op])})"
            for op in OPS
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "| MB/s | " + " | ".join(OPS) + " |", "|---" * (len(OPS) + 1) + "|"]
    for name, ops in r["mb_s"].items():
        lines.append(f"| {name} | " + " | ".join(f"{ops[op]:.0f}" for op in OPS) + " |")
    verdict = "met" if r["goal_met"] else "**not met**"
    lines += [
        "",
        "Goal: S3Store >= 0.9x plain boto3 with the same client settings for the checkpoint's "
        f"upload and restore: {verdict}.",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=128, help="checkpoint size in MB")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument(
        "--env",
        action="store_true",
        help="use AWS_ENDPOINT_URL and the AWS keys "
        "of the environment (bucket from GPUCAMPAIGN_BENCH_BUCKET, default "
        "gpucampaign)",
    )
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", type=Path, help="also write the run as markdown here")
    a = ap.parse_args()
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    work = Path(tempfile.mkdtemp(prefix="bench-storage-"))
    server = None
    try:
        if a.env:
            env = dict(os.environ)
            bucket = env.get("GPUCAMPAIGN_BENCH_BUCKET", "gpucampaign")
        else:
            from infra.s3server import start_server

            server = start_server(work / "s3server")
            env, bucket = server.env(), server.bucket
        r = run(env, bucket=bucket, mb=a.mb, repeats=a.repeats, work=work)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(markdown(r, load=load))
    if a.json:
        print(json.dumps(r, indent=2))
        return 0
    print(
        f"checkpoint {r['bytes'] / MB:.0f} MB in {len(r['files'])} files, median of {r['repeats']}"
    )
    for name, ops in r["mb_s"].items():
        print(f"  {name:18s} " + "   ".join(f"{op} {ops[op]:5.0f} MB/s" for op in OPS))
    for name, ops in r["s3store_vs"].items():
        print(f"  S3Store vs {name:18s} " + "   ".join(f"{op} {ops[op]:.2f}x" for op in OPS))
    verdict = "met" if r["goal_met"] else "NOT met"
    print(
        "goal S3Store >= 0.9x plain boto3 with the same client settings "
        f"(checkpoint upload and restore): {verdict}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
