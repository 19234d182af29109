"""The loop's own cost per step, as exact counts (a shared machine's timings are not): the
Python calls the library makes at a step, and the rows it writes unchanged by how they are
batched (issue 47; ``bench/loop_cost.py`` measures the microseconds)."""

from __future__ import annotations

import cProfile
from pathlib import Path

import pytest

from gpucampaign.engine import loop
from gpucampaign.folder.metrics import read_metrics
from tests.helpers import digits_file, make_spec, run, run_dir  # noqa: F401

# Timing fields: the only ones that differ between two runs of the same seeded config.
TIMING = ("step_s", "samples_per_s", "eval_s", "restore_s")
LIB = str(Path(loop.__file__).parents[1])  # src/gpucampaign


def _library_calls_per_step(spec, base: Path) -> float:
    """Python calls into ``src/gpucampaign`` (the checkpoint's snapshot and the evaluations
    aside: a save's and an evaluation's work, not a step's) per step of ``_run_epoch``."""
    prof = cProfile.Profile()
    run_epoch = loop._run_epoch

    def profiled(*args, **kwargs):
        prof.enable()
        try:
            return run_epoch(*args, **kwargs)
        finally:
            prof.disable()

    loop._run_epoch = profiled
    try:
        result = run(spec, base, checkpoint_every=10**6)
    finally:
        loop._run_epoch = run_epoch
    prof.create_stats()
    calls = sum(
        nc
        for (path, _line, _name), (_cc, nc, *_rest) in prof.stats.items()  # type: ignore[attr-defined]
        if path.startswith(LIB) and "/checkpoint/" not in path and "outcome.py" not in path
    )
    return calls / result.steps_done


def test_a_step_makes_at_most_19_library_calls(tmp_path, digits_file):  # noqa: F811
    # 100 steps, no evaluation during training; the live view and the tracker off (a test).
    spec = make_spec(tmp_path, digits_file, control={"epochs": 10, "eval_every": 10**6})
    per_step = _library_calls_per_step(spec, tmp_path)
    # 32.1 on main before the second round of issue 47 (18.1 after): each call costs time.
    assert per_step <= 19, per_step


def _rows(path: Path) -> tuple[list[dict], list[dict]]:
    """The rows less their timing fields: train and eval rows in order; checkpoint rows (written
    when a background save is collected: where depends on the thread) as a sorted list."""
    rows = [{k: v for k, v in r.items() if k not in TIMING} for r in read_metrics(path)]
    ordered = [r for r in rows if r["kind"] != "checkpoint"]
    saves = sorted((r for r in rows if r["kind"] == "checkpoint"), key=lambda r: r["step"])
    keep = ("kind", "step", "key", "bytes")
    return ordered, [{k: r.get(k) for k in keep} for r in saves]


@pytest.mark.parametrize("log_every_steps", [1, 7])
def test_the_rows_do_not_depend_on_how_they_are_batched(tmp_path, digits_file, log_every_steps):  # noqa: F811
    """The same seeded run with its rows flushed at every step and in batches: the same rows,
    the same values (the losses fetched in one transfer are the ones ``.item()`` gives)."""
    spec = make_spec(tmp_path, digits_file, control={"eval_every": 3, "epochs": 2})
    run(spec, tmp_path, out="a")
    run(spec, tmp_path, out="b", log_every_steps=log_every_steps)
    a = _rows(run_dir(spec, tmp_path, out="a") / "metrics.jsonl")
    b = _rows(run_dir(spec, tmp_path, out="b") / "metrics.jsonl")
    assert a == b
    train = [r for r in a[0] if r["kind"] == "train"]
    assert [r["step"] for r in train] == list(range(1, 21))
    assert all(set(r) == {"kind", "step", "epoch", "lr", "loss"} for r in train)
