"""The loop's own cost per step, as exact counts (a shared machine's timings are not): the
Python calls the library makes at a step, and the rows it writes unchanged by how they are
batched (issue 47; ``bench/loop_cost.py`` measures the microseconds)."""

from __future__ import annotations

import cProfile
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gpucampaign.core.files import jsonl_line, jsonl_lines
from gpucampaign.core.stoprules import NonFiniteLoss
from gpucampaign.engine import loop
from gpucampaign.engine.checkpointer import Checkpointer
from gpucampaign.engine.hooks import Ending, Hooks
from gpucampaign.engine.live import ProgressHook
from gpucampaign.engine.parts import PermutedBatches
from gpucampaign.engine.rules import NonFiniteLossRule
from gpucampaign.folder.metrics import metrics_lines, read_metrics
from gpucampaign.folder.progress import ProgressFile
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


def _no_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """The live view due at its steps only, never by the clock (about twice a second): what
    a step does is then the same however fast the machine is."""
    monkeypatch.setattr(ProgressFile, "due", lambda self: False)
    monkeypatch.setattr(ProgressHook, "next_time", lambda self: math.inf)


def test_a_step_makes_at_most_7_library_calls(tmp_path, digits_file, monkeypatch):  # noqa: F811
    # 100 steps, no evaluation during training; the tracker off (a test), the live view's clock
    _no_clock(monkeypatch)
    spec = make_spec(tmp_path, digits_file, control={"epochs": 10, "eval_every": 10**6})
    per_step = _library_calls_per_step(spec, tmp_path)
    # 32.1 on main before the second round of issue 47, 18.1 before the third, 11.7 before the
    # fourth (10.7 after: the RNG slot's lock entered as a built-in), 6.7 after the fifth (the
    # stop flag read, the loss's check and the batch's size inline, the batches cut by
    # built-ins): each call costs time. What is left: the step itself (the recipe's loss and
    # model, the row) and the steps where something may be due (each epoch's first: one in
    # ten here).
    assert per_step <= 7, per_step


def test_between_events_the_loop_asks_neither_the_saver_nor_the_hooks(
    tmp_path,
    digits_file,  # noqa: F811
    monkeypatch,
):
    """100 steps, an evaluation every 25, no save before the last step: the saver and the
    hooks are asked at the evaluations' steps, the last step and an epoch's first step, not
    at the other steps (nothing can be due there); what they decide is the same."""
    asked: dict[str, list[int]] = {"saver": [], "hooks": []}
    due, hooks_due = Checkpointer.due, Hooks.due

    def saver_due(self: Checkpointer, step: int, *, last_step: bool = False) -> bool:
        asked["saver"].append(step)
        return due(self, step, last_step=last_step)

    def hook_due(self: Hooks, step: int) -> bool:
        asked["hooks"].append(step)
        return hooks_due(self, step)

    monkeypatch.setattr(Checkpointer, "due", saver_due)
    monkeypatch.setattr(Hooks, "due", hook_due)
    _no_clock(monkeypatch)
    spec = make_spec(tmp_path, digits_file, control={"epochs": 10, "eval_every": 25})
    result = run(spec, tmp_path, checkpoint_every=10**6)
    assert result.steps_done == 100 and result.n_checkpoints == 1
    for steps in asked.values():
        assert {25, 50, 75, 100} <= set(steps), steps
        assert len(steps) <= 10 + 4, steps  # each epoch's first step, the four events
    rows = read_metrics(run_dir(spec, tmp_path) / "metrics.jsonl")
    evals = [r["step"] for r in rows if r["kind"] == "eval" and not r.get("final")]
    assert evals == [25, 50, 75, 100]
    assert [r["step"] for r in rows if r["kind"] == "checkpoint"] == [100]
    assert [r["step"] for r in rows if r["kind"] == "train"] == list(range(1, 101))


def test_a_flushs_lines_are_the_same_bytes_without_an_encoder_per_row(monkeypatch):
    """``jsonl_lines`` (the metrics' rows, a batch at a time) writes what ``jsonl_line`` writes
    for each row, NaN, infinities, None, text and nesting included, without building a JSON
    encoder per row (``JSONEncoder.iterencode`` builds one at every call)."""
    rows = [
        {"kind": "train", "step": 1, "loss": math.nan, "lr": math.inf, "x": -math.inf},
        {"kind": "eval", "s": 'é"\n', "n": None, "l": [1, 2.5], "d": {"b": 1, "a": 2}},
        {"p": Path("/a/b"), "t": True, "z": 1e-320, "a": 0.1 + 0.2, "big": 10**30},
    ]
    expected = "".join(jsonl_line(r) for r in rows)
    built = []
    iterencode = json.JSONEncoder.iterencode

    def counted(self: json.JSONEncoder, o: Any, _one_shot: bool = False) -> Any:
        built.append(o)
        return iterencode(self, o, _one_shot)

    monkeypatch.setattr(json.JSONEncoder, "iterencode", counted)
    assert jsonl_lines(rows) == expected
    assert jsonl_lines([]) == ""
    assert built == [], "an encoder was built per row"


_NUMBER = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([None, True, 0.1 + 0.2, -0.0, 5e-324, 1e308, 1e16]),
)


@settings(derandomize=True, max_examples=300, deadline=None)
@given(
    values=st.lists(st.tuples(_NUMBER, _NUMBER, _NUMBER, _NUMBER, _NUMBER, _NUMBER), max_size=4),
    extra=st.booleans(),
    kind=st.sampled_from(["train", "eval"]),
)
def test_a_train_rows_line_by_its_template_is_the_encoders_bytes(values, extra, kind):
    """``metrics_lines`` (the train rows' template, the others by the encoder) writes what
    ``jsonl_lines`` writes, whatever the values: NaN, infinities, None, ints and bools where
    floats go, big ints, a sum that overflows, another kind, a field more, another key order."""
    rows: list[dict[str, Any]] = []
    for step, epoch, lr, step_s, rate, loss in values:
        row = {"kind": kind, "step": step, "epoch": epoch, "lr": lr, "step_s": step_s}
        row |= {"samples_per_s": rate, "loss": loss}
        rows += [row, dict(reversed(row.items()))]
        rows.append({**row, "kind": "train", "step": 3, "epoch": 0})
        if extra:
            rows.append({**row, "extra": 1})
    typical = {"kind": "train", "step": 12, "epoch": 1, "lr": 1e-3, "step_s": 4.1e-4}
    rows.append(typical | {"samples_per_s": 64 / 4.1e-4, "loss": 2.302585})
    assert metrics_lines(rows) == jsonl_lines(rows)


def _train(step: int, loss: Any) -> dict[str, Any]:
    return {"kind": "train", "step": step, "epoch": 0, "lr": 0.1, "loss": loss}


def test_the_non_finite_rule_checks_a_flush_at_once_and_names_its_first_bad_row(monkeypatch):
    """One sum when every loss is finite (no row looked at); else the first NaN or infinite
    loss, its index among the flush's rows (other kinds skipped); finite losses whose sum
    overflows stop nothing."""
    rule = NonFiniteLossRule("run-1")
    looked: list[int] = []
    one = NonFiniteLossRule.on_train_row

    def spy(self: NonFiniteLossRule, row: dict[str, Any]) -> Any:
        looked.append(row["step"])
        return one(self, row)

    monkeypatch.setattr(NonFiniteLossRule, "on_train_row", spy)
    fine = [_train(k, 0.5 / k) for k in range(1, 101)]
    assert rule.on_train_rows(fine) is None and looked == []
    assert rule.on_train_rows([_train(1, 1e308), _train(2, 1e308)]) is None  # the sum is inf
    for bad in (math.nan, math.inf, -math.inf):
        rows = [_train(1, 0.5), {"kind": "checkpoint", "step": 1}, _train(2, bad), _train(3, bad)]
        found = rule.on_train_rows(rows)
        assert found is not None and found[0] == 2
        stop = found[1].stop(Ending(step=2, saved=False, read_back=None))
        assert isinstance(stop, NonFiniteLoss) and stop.step == 2


def test_an_epochs_permuted_batches_drawn_at_once_are_the_loaders(tmp_path):
    """``PermutedBatches.batches`` (what ``TensorBatches`` cuts at each step) gives the
    batches its iterator gives, short last batch included, and leaves the generator where the
    iterator leaves it: every later epoch, and a resume, draws the same."""
    for n, size in ((10, 3), (12, 4), (5, 8)):
        a = torch.Generator().manual_seed(7)
        b = torch.Generator().manual_seed(7)
        for _epoch in range(3):
            drawn = PermutedBatches(n, batch_size=size, generator=a).batches()
            walked = list(PermutedBatches(n, batch_size=size, generator=b))
            assert [t.tolist() for t in drawn] == [t.tolist() for t in walked]
            assert torch.equal(a.get_state(), b.get_state())


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
