"""The campaign's fixed costs, each next to its floor measured in the same run.

The floor of anything that starts a fresh process and resumes a run is a fresh import of torch
and the library (``FLOOR_IMPORT``) plus one checkpoint load. Measured here, as ratios:

- the restart check (``verify_early_save``): its total time less the training its fresh process
  replays, against the floor (goal: <= 2x);
- the embedded Prefect server: the import of its module and its start, in a new process;
- ``campaign run`` on the demo spec, in a new process: the time before its first training step
  (the first run folder's ``progress.json``, written just before the first step; goal: <= 3x
  the floor), and its first line,
  and the timeline's fixed phases (restart check, close, verify) against the floor.

Where the time goes (profiled 2026-12-04 on the 2-core machine, load ~4; cProfile of the
restart check's fresh process, 6.2 s profiled): the imports of torch and gpucampaign (the
floor, ~3.1 s), then ``torch.optim.Adam.__init__``: torch wraps it in ``_disable_dynamo``, which
imports ``torch._dynamo`` at its first call (~2.3 s, in every fresh process that builds an
optimizer; torch offers no switch), then imports beyond the floor (``plan.*`` through
``folder.records``, ``storage.s3*``, ``restartcheck.*``: ~0.3-0.5 s), and the replay itself
(0.1-0.3 s for 200 steps). ``campaign run`` before its first step, sampled on 2026-12-05
(idle, 2 cores): until 2026-12-05 the CLI's imports, the spec's checks (with matplotlib and
scipy.stats, ~1 s), then the server's process spawned and, in series in ``campaign run``'s own
process, ``prefect.server.api.server``'s import (~1.7 s) to adopt it, then ``torch._dynamo``
at the first optimizer (~1.1 s): 7.2 s. Now the server's process starts with the first line,
held (it imports, serves nothing) until the checks pass; it is adopted by its URL, so its
modules never load in ``campaign run``; ``torch._dynamo`` loads while it boots: 4.3 s, where
``campaign run``'s own imports (torch, Prefect's client, ``torch._dynamo``) and the flow's
first API calls are what is left in series. Sampled again later that day (idle): the
``torch._dynamo`` thread had started with the server's go and ran beside Prefect's import (both
CPU, one interpreter lock), so that import took 1.5 s instead of 0.6 s; it now starts when the
run begins waiting for its server, and the flow's own first imports (fastapi's encoder, Prefect's
engines, 0.2 s) load in that wait; scipy.special (0.08 s, for the plan's t quantile) is gone and
the temporary server starts no automation services (0.14 s of its start): 3.5-3.6 s. What is
left: ``campaign run``'s CPU (torch, Prefect's client, ``torch._dynamo``: ~3.4 s of CPU by the
first step) and the server's own import (~2 s on the other core).

Usage: python bench/fixed.py [--repeats 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import overhead  # noqa: E402  (bench/overhead.py)

from gpucampaign.checkpoint.manager import CheckpointManager  # noqa: E402
from gpucampaign.cli.scaffold import init_campaign  # noqa: E402
from gpucampaign.config import load_spec  # noqa: E402
from gpucampaign.data.corpus import load_spec_corpus  # noqa: E402
from gpucampaign.engine.loop import train_run  # noqa: E402
from gpucampaign.folder.layout import RunFolder  # noqa: E402
from gpucampaign.folder.metrics import read_metrics  # noqa: E402
from gpucampaign.restartcheck.earlysave import verify_early_save  # noqa: E402
from gpucampaign.restartcheck.target import RestartTarget  # noqa: E402
from gpucampaign.storage import LocalStore  # noqa: E402

FIRST_STEP_GOAL_X = 3.0
RESTART_GOAL_X = 2.0

SERVER_START = """\
import json, time
from gpucampaign_prefect.orchestration import embedded
t0 = time.perf_counter()
import prefect.server.api.server  # the module; campaign run's own process never imports it
t1 = time.perf_counter()
server = embedded.start_detached()
t2 = time.perf_counter()
embedded.stop(server)
print(json.dumps({"import_s": t1 - t0, "start_s": t2 - t1, "started": server is not None}))
"""


def _env() -> dict[str, str]:
    path = os.pathsep.join(
        filter(None, [str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH")])
    )
    return {**os.environ, **overhead.QUIET, "PYTHONPATH": path}


#: The floor's import: torch and the library, as ``import torch, gpucampaign`` loaded it until
#: 2026-12-05 (the recipe contract, with the spec's models and pydantic). ``import gpucampaign``
#: itself loads them lazily since then, so that ``campaign``'s first line and its server's
#: process come 0.13 s sooner; the floor keeps its content (and its seconds) all the same.
FLOOR_IMPORT = "import torch, gpucampaign, gpucampaign.recipe.contract"


def import_floor(repeats: int) -> list[float]:
    """Seconds of a fresh ``python -c FLOOR_IMPORT``, ``repeats`` times."""
    return [overhead.timed([sys.executable, "-c", FLOOR_IMPORT], cwd=ROOT) for _ in range(repeats)]


OPTIMIZER_FLOOR = f"{FLOOR_IMPORT}; torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))])"


def optimizer_floor(repeats: int) -> list[float]:
    """Seconds of the floor's fresh import plus building one torch optimizer: torch imports
    ``torch._dynamo`` at the first optimizer any process builds (a resume cannot avoid it).
    Reported beside the floor, not instead of it."""
    return [
        overhead.timed([sys.executable, "-c", OPTIMIZER_FLOOR], cwd=ROOT) for _ in range(repeats)
    ]


def server_start() -> dict[str, Any]:
    """The embedded server in a new process: the import of its module, then its start."""
    proc = subprocess.run(
        [sys.executable, "-c", SERVER_START],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def restart_check(tmp: Path, repeats: int) -> dict[str, Any]:
    """The demo control trained, then its restart check ``repeats`` times, each beside one
    checkpoint load in this process (the floor's second part)."""
    spec_path = init_campaign(tmp / "restart-demo")
    spec = load_spec(spec_path)
    corpus = load_spec_corpus(spec, base_dir=spec_path.parent)
    run = spec.resolve_run("control")
    out = tmp / "restart-out"
    train_run(
        spec,
        run=run,
        corpus=corpus,
        store=LocalStore(out / "ck"),
        run_folder=RunFolder.scratch(out / "run", run.run_id),
    )
    manager = CheckpointManager(
        LocalStore(out / "ck"), run_id=run.run_id, config_sha256=run.config_sha256
    )
    totals, replays, loads = [], [], []
    for i in range(repeats):
        t0 = time.perf_counter()
        ck, _ = manager.load_latest()
        loads.append(time.perf_counter() - t0)
        assert ck is not None
        work = out / f"check-{i}"
        rep = verify_early_save(
            RestartTarget(
                spec=spec,
                run=run,
                corpus_path=corpus.path,
                store=LocalStore(out / "ck"),
                run_dir=out / "run",
                workdir=work,
            )
        )
        totals.append(rep.total_s)
        replays.append(
            sum(
                float(r.get("step_s") or 0.0)
                for p in work.rglob("metrics.jsonl")
                for r in read_metrics(p)
                if r.get("kind") == "train"
            )
        )
    return {
        "total_s": totals,
        "replay_train_s": replays,
        "load_s": loads,
        "steps": rep.compared_steps,
    }


def first_step(tmp: Path, name: str) -> dict[str, Any]:
    """``campaign run`` of the demo spec in a new process: seconds to its first training step
    (the first ``progress.json``), its wall time and its timeline's phases."""
    spec_path = init_campaign(tmp / f"init-{name}")
    out = tmp / f"{name}-out"
    cmd = [sys.executable, "-m", "gpucampaign.cli", "run", str(spec_path), "--out", str(out)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    said: list[tuple[float, str]] = []  # (seconds, line): when each line came

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            said.append((time.perf_counter() - t0, line))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    first = None
    while proc.poll() is None:
        if first is None and any(out.glob("runs/*/progress.json")):
            first = time.perf_counter() - t0
        time.sleep(0.02)
    wall = time.perf_counter() - t0
    reader.join(timeout=30)
    output = "".join(line for _, line in said)
    if proc.returncode not in (0, 3):
        raise SystemExit(f"campaign run failed ({proc.returncode}):\n{output[-3000:]}")
    return {
        "first_step_s": first,
        "first_line_s": said[0][0] if said else None,
        "wall_s": wall,
        "phases": overhead.phases_of(out),
        "reused_server": "reusing" in output,
    }


def measure(tmp: Path, repeats: int) -> dict[str, Any]:
    """Every fixed cost and its floor, alternated so drift on a shared machine hits both."""
    imports = import_floor(repeats)
    restart = restart_check(tmp, repeats)
    server = [server_start() for _ in range(max(1, repeats - 1))]
    campaigns = [first_step(tmp, f"demo-{i}") for i in range(repeats)]
    imports += import_floor(repeats)
    with_optimizer = optimizer_floor(repeats)
    floor = statistics.median(imports) + statistics.median(restart["load_s"])
    fixed = [t - r for t, r in zip(restart["total_s"], restart["replay_train_s"], strict=True)]
    phases: dict[str, list[float]] = {}
    for c in campaigns:
        for k, v in c["phases"].items():
            phases.setdefault(k, []).append(v)
    firsts = [c["first_step_s"] for c in campaigns if c["first_step_s"] is not None]
    lines = [c["first_line_s"] for c in campaigns if c["first_line_s"] is not None]
    return {
        "floor_s": floor,
        "import_s": imports,
        "load_s": restart["load_s"],
        "optimizer_floor_s": with_optimizer,
        "restart_fixed_s": fixed,
        "restart_fixed_over_floor": [f / floor for f in fixed],
        "restart_total_s": restart["total_s"],
        "restart_replay_train_s": restart["replay_train_s"],
        "restart_steps": restart["steps"],
        "server_import_s": [s["import_s"] for s in server],
        "server_start_s": [s["start_s"] for s in server],
        "first_step_s": firsts,
        "first_line_s": lines,
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "campaign_wall_s": [c["wall_s"] for c in campaigns],
        "phases_s": {k: statistics.median(v) for k, v in phases.items()},
        "reused_server": any(c["reused_server"] for c in campaigns),
    }


def report_lines(m: dict[str, Any]) -> list[str]:
    """The fixed costs as text, each with its ratio to the floor."""
    floor = m["floor_s"]
    med = statistics.median
    lines = [
        f"floor: fresh `{FLOOR_IMPORT}` {med(m['import_s']):.2f} s + one checkpoint "
        f"load {med(m['load_s']):.3f} s = {floor:.2f} s",
        f"restart check: {med(m['restart_total_s']):.2f} s, of which its replay's training "
        f"{med(m['restart_replay_train_s']):.2f} s ({m['restart_steps']} steps); fixed "
        f"{med(m['restart_fixed_s']):.2f} s = {med(m['restart_fixed_over_floor']):.2f}x the floor "
        f"(goal <= {RESTART_GOAL_X:g}x)",
        f"fresh import + building one optimizer (torch imports torch._dynamo then): "
        f"{med(m['optimizer_floor_s']):.2f} s; the restart check's fixed cost is "
        f"{med(m['restart_fixed_s']) / med(m['optimizer_floor_s']):.2f}x that",
        f"embedded Prefect server: import {med(m['server_import_s']):.2f} s "
        f"({med(m['server_import_s']) / floor:.2f}x the floor) + start "
        f"{med(m['server_start_s']):.2f} s ({med(m['server_start_s']) / floor:.2f}x)",
    ]
    if m["first_step_s"]:
        lines.append(
            f"campaign run (demo): first training step after {med(m['first_step_s']):.2f} s "
            f"({med(m['first_step_s']) / floor:.2f}x the floor; goal <= {FIRST_STEP_GOAL_X:g}x), "
            f"wall {med(m['campaign_wall_s']):.1f} s; its first line after "
            f"{med(m['first_line_s']) if m['first_line_s'] else float('nan'):.2f} s "
            f"(load average {' '.join(map(str, m['load_avg']))})"
            + ("; it reused a running server" if m["reused_server"] else "")
        )
    lines.append(
        "campaign phases (timeline, s, and x the floor): "
        + ", ".join(f"{k} {v:.2f} ({v / floor:.1f}x)" for k, v in m["phases_s"].items())
    )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-fixed-") as tmp:
        m = measure(Path(tmp), a.repeats)
    print(json.dumps(m, indent=2) if a.json else "\n".join(report_lines(m)))


if __name__ == "__main__":
    main()
