"""The loop's hooks: the events of a real tiny run in their order, and a new stop rule added
as one hook class and one registry line, with the loop unchanged."""

from __future__ import annotations

import inspect
import json
from typing import Any

import pytest
import torch

from gpucampaign.core.stoprules import STOP_RULES, StopRule
from gpucampaign.engine import loop, registry
from gpucampaign.engine.hooks import Hook, HookArgs, RunView, StopRequest
from gpucampaign.engine.registry import register
from gpucampaign.folder.metrics import MetricsLog, read_metrics
from tests.helpers import digits_file, make_spec, run, run_dir  # noqa: F401 - a fixture


@pytest.fixture(autouse=True)
def _registry(monkeypatch):
    """Each test registers into its own copy of the registry."""
    monkeypatch.setattr(registry, "HOOKS", list(registry.HOOKS))


class Recorder(Hook):
    """Writes down every event it hears."""

    def __init__(self, r: RunView, args: HookArgs) -> None:
        self.r = r
        self.args = args
        self.events: list[str] = []
        self.rows: list[dict[str, Any]] = []

    def on_start(self) -> None:
        self.events.append(f"on_start {self.r.step}")

    def on_train_row(self, row: dict[str, Any]) -> None:
        self.events.append(f"on_train_row {row['step']}")

    def on_rows(self, rows: list[dict[str, Any]]) -> None:
        self.rows.extend(rows)

    def after_eval(self, metrics: dict[str, float]) -> None:
        assert "accuracy" in metrics
        self.events.append(f"after_eval {self.r.step}")

    def after_step(self) -> None:
        self.events.append(f"after_step {self.r.step}")

    def after_train(self) -> None:
        self.events.append("after_train")

    def at_end(self, metrics: dict[str, float]) -> StopRule | None:
        self.events.append("at_end")
        return None

    def on_close(self) -> None:
        self.events.append("on_close")


def _record() -> list[Recorder]:
    built: list[Recorder] = []

    def factory(r: RunView, args: HookArgs) -> Recorder:
        built.append(Recorder(r, args))
        return built[-1]

    register(factory)
    return built


def test_the_events_of_a_run_come_in_the_loops_order(tmp_path, digits_file):  # noqa: F811
    built = _record()
    spec = make_spec(tmp_path, digits_file)  # 2 epochs of 10 steps, an evaluation per epoch
    res = run(spec, tmp_path, log_every_steps=3)
    (hook,) = built
    assert res.completed and hook.args.restored_meta is None
    ev = hook.events
    assert ev[0] == "on_start 0" and ev[-3:] == ["after_train", "at_end", "on_close"]
    steps = [e for e in ev if e.startswith("after_step")]
    assert steps == [f"after_step {s}" for s in range(1, 21)]
    # Each train row is checked once, in step order, before the step's later events end.
    assert [e for e in ev if e.startswith("on_train_row")] == [
        f"on_train_row {s}" for s in range(1, 21)
    ]
    # The evaluation of an epoch's last step comes after its rows are checked, before its
    # after_step.
    for step in (10, 20):
        i = ev.index(f"after_eval {step}")
        assert ev.index(f"on_train_row {step}") < i < ev.index(f"after_step {step}")
    # The hooks saw every row metrics.jsonl holds, in order.
    assert hook.rows == read_metrics(run_dir(spec, tmp_path) / "metrics.jsonl")


class EveryFifth(Recorder):
    """Needs ``after_step`` at every fifth step only (issue 47: the loop asks no hook at a
    step it does not need)."""

    def next_step(self, step: int) -> int:
        return (step // 5 + 1) * 5

    def on_rows(self, rows: list[dict[str, Any]]) -> None:
        self.events.append(f"rows {self.r.step}")  # an event: asked again at the next step


def test_a_hook_is_asked_at_the_steps_it_needs_and_after_any_other_event(
    tmp_path,
    digits_file,  # noqa: F811
):
    built: list[Recorder] = []
    register(lambda r, args: built.append(Recorder(r, args)) or built[-1])
    register(lambda r, args: built.append(EveryFifth(r, args)) or built[-1])
    spec = make_spec(tmp_path, digits_file)  # 2 epochs of 10 steps, an evaluation per epoch
    assert run(spec, tmp_path, log_every_steps=3).completed
    every, fifth = ([int(e.split()[1]) for e in h.events if "after_step" in e] for h in built)
    assert every == list(range(1, 21))  # a hook that says nothing: every step, as before
    # Its own steps, the first one (after on_start), and a step at which rows were handed
    # on (an event makes every hook due at the next step); not the others.
    evented = {int(e.split()[1]) for e in built[1].events if e.startswith("rows")}
    assert {1, 5, 10, 15, 20} <= set(fifth) and len(fifth) < 20
    assert set(fifth) <= {1, 5, 10, 15, 20} | evented


def test_a_pilot_call_has_no_end_and_a_resume_hands_the_restored_meta(tmp_path, digits_file):  # noqa: F811
    built = _record()
    spec = make_spec(tmp_path, digits_file)
    assert not run(spec, tmp_path, stop_after_steps=5).completed
    assert built[0].events[-2:] == ["after_train", "on_close"]
    assert "at_end" not in built[0].events
    assert run(spec, tmp_path).completed  # resumes from the pilot's checkpoint at step 5
    second = built[1]
    assert second.args.restored_meta is not None and second.args.restored_meta["step"] == 5
    assert second.events[0] == "on_start 5" and second.events[-1] == "on_close"


# --- a new stop rule: one StopRule, one hook class, one registry line ------------------------
class LossAbove(StopRule):
    """The training loss went above a ceiling."""

    rule = "loss_above"


class LossCeiling(Hook):
    """Stop at the first step whose training loss is above ``ceiling``."""

    ceiling = 1.0

    def __init__(self, r: RunView, args: HookArgs) -> None:
        self.run_id = r.run_id

    def on_train_row(self, row: dict[str, Any]) -> StopRequest | None:
        if row["loss"] <= self.ceiling:
            return None
        stop = LossAbove(
            self.run_id,
            f"training loss {row['loss']:.4f} above {self.ceiling} at step {row['step']}",
            step=row["step"],
        )
        return StopRequest.of(stop, save=False)  # the loop ends the run, nothing saved


def test_a_new_stop_rule_is_one_hook_class_and_one_registry_line(tmp_path, digits_file):  # noqa: F811
    source = inspect.getsource(loop)
    register(LossCeiling)  # the one line
    spec = make_spec(tmp_path, digits_file)
    with pytest.raises(LossAbove) as exc:
        run(spec, tmp_path)
    e = exc.value
    # A 10-class model starts near ln 10 = 2.3: the first step is above the ceiling.
    assert (e.rule, e.run_id, e.step) == ("loss_above", spec.resolve_run("control").run_id, 1)
    assert e.stop_id.startswith("stop-") and "above 1.0 at step 1" in e.reason
    # Its record reads back as its class, with no list of rules edited.
    assert STOP_RULES[e.to_record()["rule"]] is LossAbove
    folder = run_dir(spec, tmp_path)
    assert not (folder / "result.json").exists()
    # The stopped step's row is not written, and the live view says the call stopped.
    assert [r for r in read_metrics(folder / "metrics.jsonl") if r["kind"] == "train"] == []
    assert json.loads((folder / "progress.json").read_text())["state"] == "stopped"
    # The loop did not change, and names none of its hooks.
    assert inspect.getsource(loop) == source
    for name in ("LossCeiling", "NonFiniteLossRule", "QualityFloor", "Futility", "Tracker"):
        assert name not in source


def test_a_factory_that_returns_none_adds_no_hook(tmp_path, digits_file):  # noqa: F811
    register(lambda r, args: LossCeiling(r, args) if r.config.lr > 1 else None)  # off here
    spec = make_spec(tmp_path, digits_file)
    assert run(spec, tmp_path).completed


def test_the_metrics_log_hands_its_rows_to_the_loop_and_calls_no_one(tmp_path):
    """The loop flushes: ``fetch`` gives the waiting rows with their losses, the loop checks
    them and writes those it keeps; ``take_written`` gives every row written since the last
    call, in order (the loop hands them to the hooks). A row written while others wait waits
    behind them."""
    log = MetricsLog(tmp_path / "metrics.jsonl", every=10, flush_when_full=False)
    for step, loss in enumerate([0.5, 0.4, 2.0, 0.3], start=1):
        log.defer({"kind": "train", "step": step}, loss=torch.tensor(loss))
    log.write({"kind": "eval", "step": 4})  # behind the waiting rows
    assert log.waiting == 5 and not log.full and read_metrics(tmp_path / "metrics.jsonl") == []
    rows = log.fetch()
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 4] and log.waiting == 0
    assert [r.get("loss") for r in rows][:2] == [0.5, pytest.approx(0.4)]
    bad = next(i for i, r in enumerate(rows) if r.get("loss", 0) > 1)
    log.write_rows(rows[:bad])  # the loop's check stopped at the third: it and the rest dropped
    assert [r["step"] for r in log.take_written()] == [1, 2] and log.take_written() == []
    assert log.last_deferred == rows[1]
    log.close()
    log.close()  # a second close does nothing
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2]
