"""The checkpointer decides when a run saves: the loop asks it after every step where it may
save (the policy's next save, the call's last step, each step while a save is in flight:
``Checkpointer.quiet_until``; the others cost the loop one compare, issue 47)."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest

from gpucampaign.checkpoint.manager import CheckpointManager
from gpucampaign.engine.checkpointer import Checkpointer
from gpucampaign.folder.layout import METRICS_FILE
from gpucampaign.folder.metrics import read_metrics
from tests.helpers import digits_file, make_spec, run, run_dir  # noqa: F401


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Record each ``Checkpointer.due`` call (the loop saves when it says so): its step,
    ``last_step``, the policy's next save before it, and whether it saved."""
    calls: list[dict[str, Any]] = []
    due_now = Checkpointer.due

    def spy(self: Checkpointer, step: int, *, last_step: bool = False) -> bool:
        due = self.policy.next_save
        saved = due_now(self, step, last_step=last_step)
        calls.append({"step": step, "last": last_step, "due": due, "saved": saved})
        return saved

    monkeypatch.setattr(Checkpointer, "due", spy)
    return calls


def _checkpoint_rows(spec, base) -> list[int]:
    rows = read_metrics(run_dir(spec, base) / METRICS_FILE)
    return [r["step"] for r in rows if r["kind"] == "checkpoint"]


def test_the_saver_is_asked_at_the_policys_steps_and_saves_there(
    tmp_path,
    digits_file,  # noqa: F811
    monkeypatch,
):
    """Daly's policy (the early save at the pilot's step count, then measured intervals):
    whatever the policy says, the saver saves exactly at its next save and at the last step."""
    calls = _spy(monkeypatch)
    spec = make_spec(tmp_path, digits_file)
    res = run(spec, tmp_path)
    assert res.completed and res.steps_done == 20
    steps = [c["step"] for c in calls]
    assert steps == sorted(set(steps)) and steps[0] == 1  # in order, at most once a step
    assert [c["step"] for c in calls if c["last"]] == [20]
    for c in calls:
        assert c["saved"] == (c["step"] == c["due"] or c["last"]), c
    saved = [c["step"] for c in calls if c["saved"]]
    # Asked at every step the policy named: none of its saves was passed over.
    assert {c["due"] for c in calls if c["due"] <= 20} <= set(saved)
    assert saved[0] == spec.pilot.steps and saved[-1] == 20
    assert _checkpoint_rows(spec, tmp_path) == saved
    assert res.n_checkpoints == len(saved)


def test_a_fixed_interval_saves_at_its_multiples_and_at_each_calls_last_step(
    tmp_path,
    digits_file,  # noqa: F811
    monkeypatch,
):
    """Every 3 steps, a pilot call up to step 7 and a resumed one to the end: the last step of
    each call saves too."""
    calls = _spy(monkeypatch)
    spec = make_spec(tmp_path, digits_file)
    run(spec, tmp_path, checkpoint_every=3, stop_after_steps=7)
    assert [c["step"] for c in calls if c["last"]] == [7]
    assert [c["step"] for c in calls if c["saved"]] == [3, 6, 7]
    calls.clear()
    run(spec, tmp_path, checkpoint_every=3)
    assert [c["step"] for c in calls][0] == 8 and [c["step"] for c in calls if c["last"]] == [20]
    assert [c["step"] for c in calls if c["saved"]] == [9, 12, 15, 18, 20]
    assert _checkpoint_rows(spec, tmp_path) == [3, 6, 7, 9, 12, 15, 18, 20]


def test_the_final_evaluation_runs_while_the_last_save_is_written(
    tmp_path,
    digits_file,  # noqa: F811
    monkeypatch,
):
    """The last save's write overlaps the final evaluation and the model folder's write
    (issue 35: the end of a run does not stall on it), and ``result.json``, which says the run
    completed, is written only once that checkpoint is durable."""
    import threading

    from gpucampaign.checkpoint.state import BackgroundSaves
    from gpucampaign.engine import loop
    from gpucampaign.folder.layout import RESULT_FILE

    spec = make_spec(tmp_path, digits_file)
    final_eval, model_written = threading.Event(), threading.Event()
    seen: list[dict[str, Any]] = []
    last_call = {"last": False}
    due, submit, evaluate = Checkpointer.due, BackgroundSaves.submit, loop.evaluate
    save_model = loop.save_model

    def spy_due(self: Checkpointer, step: int, *, last_step: bool = False) -> bool:
        last_call["last"] = last_step
        return due(self, step, last_step=last_step)

    def held_submit(self: BackgroundSaves, job: Any) -> None:
        if not last_call["last"]:
            return submit(self, job)

        def held() -> Any:
            overlapped = final_eval.wait(timeout=5)  # the old order never sets it: 5 s lost
            model = model_written.wait(timeout=5)
            saved = job()
            done = (run_dir(spec, tmp_path) / RESULT_FILE).exists()
            seen.append(
                {
                    "step": saved.step,
                    "overlapped": overlapped,
                    "model": model,
                    "result_before": done,
                }
            )
            return saved

        return submit(self, held)

    def spy_evaluate(r: Any, split: str, *, final: bool) -> Any:
        if final:
            final_eval.set()
        return evaluate(r, split, final=final)

    monkeypatch.setattr(Checkpointer, "due", spy_due)
    monkeypatch.setattr(BackgroundSaves, "submit", held_submit)

    def spy_save_model(r: Any, metrics: Any) -> None:
        save_model(r, metrics)
        model_written.set()

    monkeypatch.setattr(loop, "evaluate", spy_evaluate)
    monkeypatch.setattr(loop, "save_model", spy_save_model)
    res = run(spec, tmp_path)
    assert res.completed and res.steps_done == 20
    assert seen == [{"step": 20, "overlapped": True, "model": True, "result_before": False}]
    assert (run_dir(spec, tmp_path) / RESULT_FILE).exists()


def test_the_loop_does_not_wait_for_the_rows_fsync_the_saves_thread_does_it_first(
    tmp_path,
    digits_file,  # noqa: F811
    monkeypatch,
):
    """At a save the loop snapshots the state and goes on: the fsync of ``metrics.jsonl`` (the
    rows the checkpoint follows) is the background save's, before it writes the checkpoint,
    so no checkpoint is ever durable before the rows of its steps are."""
    events: list[tuple[str, int, bool]] = []  # (what, the file's inode, in the loop's thread)
    fsync, save, submit = os.fsync, CheckpointManager.save, Checkpointer.submit
    loop_thread = threading.current_thread()

    def fsync_spy(fd: int) -> None:
        events.append(("fsync", os.fstat(fd).st_ino, threading.current_thread() is loop_thread))
        fsync(fd)

    def save_spy(self: CheckpointManager, step: int, **kwargs: Any) -> Any:
        events.append(("checkpoint", 0, threading.current_thread() is loop_thread))
        return save(self, step, **kwargs)

    def submit_spy(self: Checkpointer, step: int) -> None:
        events.append(("submit", 0, True))
        submit(self, step)
        events.append(("submitted", 0, True))

    monkeypatch.setattr(os, "fsync", fsync_spy)
    monkeypatch.setattr(CheckpointManager, "save", save_spy)
    monkeypatch.setattr(Checkpointer, "submit", submit_spy)
    spec = make_spec(tmp_path, digits_file, control={"epochs": 2})
    result = run(spec, tmp_path, checkpoint_every=5)
    assert result.n_checkpoints == 4
    rows = (run_dir(spec, tmp_path) / METRICS_FILE).stat().st_ino
    background = [(what, ino) for what, ino, in_loop in events if not in_loop]
    saves = [i for i, (what, _) in enumerate(background) if what == "checkpoint"]
    assert len(saves) == 4
    for i in saves:  # the rows made durable first, in the save's thread
        assert ("fsync", rows) in background[:i], background
        last = max(k for k in range(i) if background[k] == ("fsync", rows))
        assert all(what != "checkpoint" for what, _ in background[last + 1 : i])
    submitting = False
    for what, ino, in_loop in events:  # no fsync of the rows while the loop submits a save
        submitting = {"submit": True, "submitted": False}.get(what, submitting)
        assert not (submitting and in_loop and what == "fsync" and ino == rows), events
