"""The training loop's own cost per step, on the CPU where nothing hides it (issue 47).

The campaign's loop (``train_run``: metrics rows, hooks, the RNG slot, the live view, the
saver's checks, the loader) against a plain torch loop over the same tensors (``randperm`` and
indexing, the same model, optimizer and schedule, ``bench/overhead.py``), on the demo's MLP
(hidden 128, batch 64, one thread: about 1 ms a step). Per step::

    overhead = (train_s - sum(eval_s) - sum(stall_s) - bare_s) / steps

``train_s`` is the loop's time (the wait for the last save is apart), less its evaluations and
what it waited for at its saves; ``bare_s`` the plain loop's. The two are run alternately,
``--repeats`` pairs (a shared machine's drift hits both alike); the figure is the fastest
campaign loop less the fastest plain one (noise only ever adds time), with each pair's own
difference beside it (``make bench`` reports their median, recorded idle).

``--profile``: where the microseconds go. The campaign loop and the bare loop run under
cProfile; each function's own time (a built-in's, by the caller that called it) goes to a
category by the module it is in (hooks, metrics rows, the RNG slot, the live view, the loader,
the saver, checks, the step's torch calls); the per-step table is the campaign's less the
bare loop's, per category, in microseconds and in Python calls (exact, where a shared machine
makes the times noisy). cProfile inflates Python calls: read its times as shares, not as the
figure.

Usage: python bench/loop_cost.py [--quick] [--repeats 5] [--epochs 100] [--tiny] [--profile]
[--json]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import overhead  # noqa: E402  (bench/overhead.py)

from gpucampaign.cli.scaffold import init_campaign, write_spec_copy  # noqa: E402
from gpucampaign.config import CampaignSpec, load_spec  # noqa: E402
from gpucampaign.data.corpus import load_spec_corpus  # noqa: E402
from gpucampaign.engine import loop  # noqa: E402
from gpucampaign.engine.checkpointer import Checkpointer  # noqa: E402
from gpucampaign.engine.loop import train_run  # noqa: E402
from gpucampaign.folder.layout import RunFolder  # noqa: E402
from gpucampaign.folder.runresult import RunResult  # noqa: E402
from gpucampaign.storage import LocalStore  # noqa: E402

GOAL_US = 50.0  # at most this many microseconds a step (2.5% of a 2 ms GPU step)
# eval_every past the run's steps: no evaluation during training, so the figure is the steps'
# (the final evaluations come after the loop's time); --eval-every 0 is the demo's cadence.
NO_EVAL = 10**6


def loop_spec(tmp: Path, *, epochs: int, eval_every: int = NO_EVAL, tiny: bool = False) -> Path:
    """The demo campaign (``campaign init``) with its control trained ``epochs`` epochs,
    evaluated every ``eval_every`` steps (0: at each epoch's end, the demo's). ``tiny``: hidden
    width 4 and batches of 8 (about 0.3 ms of CPU a step, 158 steps an epoch), where the loop's
    own work is a larger share of a step: a steadier comparison on a shared machine."""
    src = init_campaign(tmp / f"init-loop-{epochs}-{eval_every}")
    data = yaml.safe_load(src.read_text())
    data["control"].update({"epochs": epochs, "threads": 1, "eval_every": eval_every})
    if tiny:
        data["control"].update({"hidden": [4], "batch_size": 8})
    # A short (--quick) run may end below the quality floor: not this bench's concern.
    data["stop_rules"]["below_threshold"] = False
    return write_spec_copy(data, source_dir=src.parent, dest=tmp / f"loop-{epochs}-{eval_every}")


class Pair:
    """The spec's control, loaded once, trained by the campaign's loop and by a plain one."""

    def __init__(self, spec_path: Path, tmp: Path) -> None:
        self.spec: CampaignSpec = load_spec(spec_path)
        self.corpus = load_spec_corpus(self.spec, base_dir=spec_path.parent)
        train = self.corpus.split("train")
        self.X = torch.as_tensor(train.X, dtype=torch.float32)
        self.y = torch.as_tensor(train.y, dtype=torch.long)
        self.tmp = tmp
        self.k = 0

    def bare(self) -> float:
        """Seconds of the plain loop."""
        return overhead.bare_loop(
            self.spec, "control", X=self.X, y=self.y, n_classes=len(self.corpus.classes)
        )

    def campaign(self) -> RunResult:
        """One fresh ``train_run`` of the control (its own folder and store)."""
        self.k += 1
        out = self.tmp / f"campaign-{self.k}"
        run = self.spec.resolve_run("control")
        return train_run(
            self.spec,
            run=run,
            corpus=self.corpus,
            store=LocalStore(out / "ck"),
            run_folder=RunFolder.scratch(out / "run", run.run_id),
        )


class ThreadClock:
    """The loop thread's CPU seconds in the campaign's epochs, less those in its evaluations
    and its saves' snapshots; and in the bare loop's steps. CPU time, not wall: other
    processes on a shared machine take turns on the cores, they do not add to it."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def _counted(self, fn: Callable[..., Any], sign: float) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += sign * (time.thread_time() - t0)

        return wrapper

    def campaign(self, pair: Pair) -> tuple[float, RunResult]:
        self.seconds = 0.0
        saved = loop._run_epoch, loop.evaluate, Checkpointer.submit
        loop._run_epoch = self._counted(saved[0], 1.0)  # type: ignore[assignment]
        loop.evaluate = self._counted(saved[1], -1.0)  # type: ignore[assignment]
        Checkpointer.submit = self._counted(saved[2], -1.0)  # type: ignore[method-assign]
        try:
            result = pair.campaign()
        finally:
            loop._run_epoch, loop.evaluate, Checkpointer.submit = saved  # type: ignore[method-assign]
        return self.seconds, result

    def bare(self, pair: Pair) -> tuple[float, float]:
        """The plain loop's CPU seconds and its wall seconds (its steps only)."""
        self.seconds = 0.0
        plain = overhead.plain_steps
        overhead.plain_steps = self._counted(plain, 1.0)  # type: ignore[assignment]
        try:
            wall = pair.bare()
        finally:
            overhead.plain_steps = plain  # type: ignore[assignment]
        return self.seconds, wall


def loop_seconds(result: RunResult) -> float:
    """The loop's time less its evaluations and its saves' stalls."""
    t = result.timings
    return float(t["train_s"]) - sum(t["eval_s"]) - sum(t["stall_s"])


def measure(pair: Pair, *, repeats: int) -> dict[str, Any]:
    """``repeats`` alternated pairs. The figure: the fastest campaign loop less the fastest
    bare loop, per step (noise on a shared machine only ever adds time); the pairs' own
    differences are kept for their spread, and the same in the loop thread's CPU time."""
    pair.campaign()  # warm-up: first-call imports and allocations, in neither figure
    pair.bare()
    clock = ThreadClock()
    loops, bares, per_pair, cpu_loops, cpu_bares = [], [], [], [], []
    result = None
    for i in range(repeats):
        # Which loop runs first alternates: the first of a pair was measured slower at times
        # (loop-profile.md, fifth round), and a fixed order would charge that to one side.
        for side in ("bare", "campaign") if i % 2 == 0 else ("campaign", "bare"):
            if side == "bare":
                cpu, wall = clock.bare(pair)
                cpu_bares.append(cpu)
                bares.append(wall)
            else:
                cpu, result = clock.campaign(pair)
                cpu_loops.append(cpu)
                loops.append(loop_seconds(result))
        per_pair.append(1e6 * (loops[-1] - bares[-1]) / result.steps_done)
    assert result is not None
    steps = result.steps_done
    figure = 1e6 * (min(loops) - min(bares)) / steps
    cpu_figure = 1e6 * (min(cpu_loops) - min(cpu_bares)) / steps
    return {
        "steps": steps,
        "bare_step_ms": round(1e3 * min(bares) / steps, 3),
        "overhead_us": round(figure, 1),
        "overhead_us_pairs": [round(v, 1) for v in per_pair],
        "overhead_cpu_us": round(cpu_figure, 1),
        "throughput_x": round(min(bares) / min(loops), 3),
        "evaluations": len(result.timings["eval_s"]),
        "saves": result.n_checkpoints,
        "goal_us": GOAL_US,
        "met": figure <= GOAL_US,
    }


# --- the profile ---------------------------------------------------------------------------
# The first pattern a function's file (and name) matches names its category.
CATEGORIES: list[tuple[str, str]] = [
    ("engine/devices.py", "RNG slot"),
    ("contextlib.py", "RNG slot"),  # held() is a contextmanager
    ("engine/live.py", "progress and live view"),
    ("folder/progress.py", "progress and live view"),
    ("engine/hooks.py", "hooks"),
    ("engine/rules.py", "hooks"),
    ("engine/futility.py", "hooks"),
    ("engine/lotend.py", "hooks"),
    ("engine/tracked.py", "hooks"),
    ("folder/metrics.py", "metrics rows"),
    ("core/files.py", "metrics rows"),
    ("json/", "metrics rows"),
    ("engine/checkpointer.py", "saver"),
    ("checkpoint/", "saver"),
    ("process_group.py", "checks"),
    ("recipe/contract.py", "checks"),
    ("recipe/runtime.py", "checks"),
    ("engine/parts.py", "loader"),
    ("torch/utils/data", "loader"),
    ("threading.py", "lock"),
    ("engine/loop.py", "loop"),
    ("builtin/", "the step (model, loss)"),
    ("torch/", "the step (model, loss)"),
    ("bench/overhead.py", "the step (model, loss)"),
]


def _category(func: tuple[str, int, str]) -> str | None:
    filename, _line, name = func
    if filename == "~":  # a built-in: its caller's category
        return None
    for pattern, category in CATEGORIES:
        if pattern in filename:
            return category
    return "other"


def by_category(stats: pstats.Stats) -> tuple[dict[str, float], dict[str, int]]:
    """Own seconds and calls per category; a built-in's go to its callers' categories."""
    secs: dict[str, float] = {}
    calls: dict[str, int] = {}
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    for func, (_cc, nc, tt, _ct, callers) in raw.items():
        cat = _category(func)
        if cat is None and ("lock" in func[2] or "sleep" in func[2]):
            cat = "lock"
        if cat is not None:
            secs[cat] = secs.get(cat, 0.0) + tt
            calls[cat] = calls.get(cat, 0) + nc
            continue
        for caller, edge in callers.items():
            cc = _category(caller) or "other"
            secs[cc] = secs.get(cc, 0.0) + edge[2]
            calls[cc] = calls.get(cc, 0) + edge[1]
    return secs, calls


def profiled_campaign(pair: Pair) -> tuple[pstats.Stats, RunResult]:
    """The campaign's epochs under cProfile, its evaluations not (they are not the loop's)."""
    prof = cProfile.Profile()
    run_epoch, evaluate = loop._run_epoch, loop.evaluate

    def epoch(*args: Any, **kwargs: Any) -> Any:
        prof.enable()
        try:
            return run_epoch(*args, **kwargs)
        finally:
            prof.disable()

    def evaluated(*args: Any, **kwargs: Any) -> Any:
        prof.disable()
        try:
            return evaluate(*args, **kwargs)
        finally:
            prof.enable()

    loop._run_epoch, loop.evaluate = epoch, evaluated  # type: ignore[assignment]
    try:
        result = pair.campaign()
    finally:
        loop._run_epoch, loop.evaluate = run_epoch, evaluate  # type: ignore[assignment]
    return pstats.Stats(prof), result


def profiled_bare(pair: Pair) -> pstats.Stats:
    prof = cProfile.Profile()
    plain = overhead.plain_steps

    def steps(*args: Any, **kwargs: Any) -> None:
        prof.runcall(plain, *args, **kwargs)

    overhead.plain_steps = steps  # type: ignore[assignment]
    try:
        pair.bare()
    finally:
        overhead.plain_steps = plain  # type: ignore[assignment]
    return pstats.Stats(prof)


def profile(pair: Pair) -> dict[str, Any]:
    """Microseconds per step by category: the campaign's loop less the bare loop."""
    pair.campaign()
    pair.bare()
    stats, result = profiled_campaign(pair)
    bare_stats = profiled_bare(pair)
    steps = result.steps_done
    (camp, camp_n), (bare, bare_n) = by_category(stats), by_category(bare_stats)
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    calls = sum(nc for (_cc, nc, _tt, _ct, _callers) in raw.values())
    bare_raw: dict[Any, Any] = bare_stats.stats  # type: ignore[attr-defined]
    bare_calls = sum(nc for (_cc, nc, _tt, _ct, _callers) in bare_raw.values())
    rows = {
        cat: (
            round(1e6 * (camp.get(cat, 0.0) - bare.get(cat, 0.0)) / steps, 1),
            round((camp_n.get(cat, 0) - bare_n.get(cat, 0)) / steps, 2),
        )
        for cat in sorted(set(camp) | set(bare))
    }
    top = sorted(((v[1], v[2], k) for k, v in raw.items()), key=lambda x: -x[1])[:30]
    return {
        "steps": steps,
        "us_per_step_by_category": rows,
        "total_us_per_step": round(1e6 * (sum(camp.values()) - sum(bare.values())) / steps, 1),
        "calls_per_step": round(calls / steps, 1),
        "bare_calls_per_step": round(bare_calls / steps, 1),
        "top_own_time": [
            {
                "calls_per_step": round(nc / steps, 2),
                "us_per_step": round(1e6 * tt / steps, 1),
                "function": f"{Path(k[0]).name}:{k[1]}({k[2]})",
            }
            for nc, tt, k in top
        ],
    }


def render_profile(p: dict[str, Any]) -> str:
    lines = [
        f"{p['steps']} steps; Python calls per step: campaign {p['calls_per_step']}, "
        f"bare loop {p['bare_calls_per_step']}; each category: the campaign's less the bare "
        "loop's (cProfile's times are noisy on a shared machine; the calls are exact)",
        "",
        "| category | us per step (under cProfile) | calls per step |",
        "|---|---|---|",
        f"| **all** | **{p['total_us_per_step']}** | "
        f"**{round(p['calls_per_step'] - p['bare_calls_per_step'], 1)}** |",
    ]
    by_cat = p["us_per_step_by_category"].items()
    for cat, (us, n) in sorted(by_cat, key=lambda kv: -kv[1][1]):
        lines.append(f"| {cat} | {us} | {n} |")
    lines += ["", "| function (campaign) | calls per step | own us per step |", "|---|---|---|"]
    for row in p["top_own_time"]:
        lines.append(f"| `{row['function']}` | {row['calls_per_step']} | {row['us_per_step']} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="25 epochs, 3 pairs: a check")
    ap.add_argument("--repeats", type=int, default=None, help="alternated pairs (default 7)")
    ap.add_argument("--epochs", type=int, default=None, help="of the demo's control (100)")
    ap.add_argument(
        "--eval-every",
        type=int,
        default=NO_EVAL,
        help="steps (default: none during training; 0: each epoch's end, the demo's)",
    )
    ap.add_argument("--tiny", action="store_true", help="hidden 4, batch 8: the loop's share up")
    ap.add_argument("--profile", action="store_true", help="where the microseconds go")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)
    epochs = a.epochs or (25 if a.quick else 100)
    repeats = a.repeats or (3 if a.quick else 7)
    with tempfile.TemporaryDirectory(prefix="bench-loop-") as tmp_name:
        tmp = Path(tmp_name)
        pair = Pair(loop_spec(tmp, epochs=epochs, eval_every=a.eval_every, tiny=a.tiny), tmp)
        if a.profile:
            p = profile(pair)
            print(json.dumps(p, indent=2) if a.json else render_profile(p))
            return 0
        t0 = time.perf_counter()
        m = measure(pair, repeats=repeats)
    if a.json:
        print(json.dumps(m, indent=2))
        return 0
    print(
        f"loop overhead per step: {m['overhead_us']} us (fastest campaign loop less fastest "
        f"bare loop; pairs: {', '.join(map(str, m['overhead_us_pairs']))}); "
        f"goal <= {GOAL_US:g} us: {'met' if m['met'] else 'MISSED'}"
    )
    print(
        f"  {m['steps']} steps of {m['bare_step_ms']} ms (bare), {m['evaluations']} evaluations, "
        f"{m['saves']} saves; throughput vs bare {m['throughput_x']}x; in the loop thread's "
        f"CPU time (fastest less fastest): {m['overhead_cpu_us']} us a step; "
        f"{time.perf_counter() - t0:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
