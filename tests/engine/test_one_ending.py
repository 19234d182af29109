"""One ending, in the loop: a hook asks for a stop, only ``engine/loop.py`` ends a run (its
save at the end, ``model/``, ``result.json``); a hook's state travels in the checkpoint, so a
resumed run decides as the uninterrupted one would."""

from __future__ import annotations

import ast
import inspect
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

import gpucampaign
from gpucampaign.core.stoprules import NotLearning
from gpucampaign.engine import loop
from gpucampaign.engine.checkpointer import Checkpointer
from gpucampaign.folder.metrics import read_metrics
from gpucampaign.storage import LocalStore
from tests.engine.test_not_learning import hopeless_campaign
from tests.recipe.test_recipe import train

SRC = Path(gpucampaign.__file__).parent
LOOP = SRC / "engine" / "loop.py"

#: What ends a run: the model folder, the result file, the saver's calls at a run's end.
ENDING_CALLS = {"save_model", "save_model_dir", "_write_result"}
SAVER_CALLS = {"due", "submit", "wait"}


def _ending_calls(path: Path, *, root: Path = SRC) -> list[str]:
    """The calls in ``path`` that end a run: ``save_model``/``save_model_dir``, a write whose
    arguments name ``RESULT_FILE``, and the saver's ``due``/``submit``/``wait``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        owner = f.value if isinstance(f, ast.Attribute) else None
        on_saver = isinstance(owner, ast.Attribute) and owner.attr == "saver"
        names_result = any(
            isinstance(n, ast.Name) and n.id == "RESULT_FILE"
            for arg in node.args
            for n in ast.walk(arg)
        )
        if (
            name in ENDING_CALLS
            or (on_saver and name in SAVER_CALLS)
            or (names_result and "write" in name)
        ):
            found.append(f"{path.relative_to(root)}:{node.lineno} {name}")
    return found


def test_only_the_loop_ends_a_run() -> None:
    """Nothing but ``engine/loop.py`` writes a run's ``model/`` or ``result.json``, or drives
    its saver (the saves at a run's end among them); ``engine/save.py`` is the model folder's
    writer, called by the loop alone."""
    outside = [
        call
        for path in sorted(SRC.rglob("*.py"))
        if path != LOOP
        for call in _ending_calls(path)
        if not call.startswith("engine/save.py") and not call.startswith("modelfolder/")
    ]
    assert outside == []
    inside = _ending_calls(LOOP)
    for name in ("save_model", "_write_result", "due", "submit", "wait"):
        assert any(c.endswith(f" {name}") for c in inside), name  # the scan sees the loop's


def test_the_scan_catches_a_hook_that_ends_a_run_itself(tmp_path: Path) -> None:
    """The mutation the first test guards against: a hook that saves, writes ``model/`` and
    ``result.json`` itself (as the futility stop used to)."""
    hook = tmp_path / "rogue.py"
    hook.write_text(
        "def stop_early(r):\n"
        "    r.saver.submit(r.state.global_step)\n"
        "    r.saver.wait()\n"
        "    save_model(r, {})\n"
        "    atomic_write_bytes(r.run_folder_path / RESULT_FILE, b'{}')\n",
        encoding="utf-8",
    )
    calls = [c.split(" ")[1] for c in _ending_calls(hook, root=tmp_path)]
    assert calls == ["submit", "wait", "save_model", "atomic_write_bytes"]


def _where_written(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Spy on the writes that end a run: (what, the loop function it came from)."""
    seen: list[tuple[str, str]] = []

    def caller() -> str:
        frames = [f.function for f in inspect.stack() if f.filename == str(LOOP)]
        ends = [f for f in frames if f in ("_end", "_reach_target")]
        return ends[0] if ends else frames[0] if frames else "outside the loop"

    write_result, save_model, submit = loop._write_result, loop.save_model, Checkpointer.submit

    def spy_result(r: Any, result: Any) -> None:
        seen.append(("result.json", caller()))
        write_result(r, result)

    def spy_model(r: Any, metrics: Any) -> None:
        seen.append(("model/", caller()))
        save_model(r, metrics)

    def spy_submit(self: Checkpointer, step: int) -> None:
        seen.append((f"save {step}", caller()))
        submit(self, step)

    monkeypatch.setattr(loop, "_write_result", spy_result)
    monkeypatch.setattr(loop, "save_model", spy_model)
    monkeypatch.setattr(Checkpointer, "submit", spy_submit)
    return seen


@pytest.mark.slow  # seconds of training
def test_a_not_learning_stop_is_ended_by_the_loop(tmp_path: Path, monkeypatch) -> None:
    """The hook asks; the loop's ``_end`` saves the step, writes ``model/`` and
    ``result.json``, and raises the stop the hook worded."""
    spec = hopeless_campaign(tmp_path)
    seen = _where_written(monkeypatch)
    with pytest.raises(NotLearning) as info:
        train(spec, tmp_path, "frozen")
    assert info.value.step == 12
    end = [s for s in seen if s[1] == "_end"]
    assert end == [("save 12", "_end"), ("model/", "_end"), ("result.json", "_end")]
    # Before the stop, only the saver's policy saved, from the loop's steps.
    assert {where for what, where in seen if (what, where) not in end} == {"_save"}, seen


# --- a hook's state across a kill ---------------------------------------------------------------
class Killed(Exception):
    """The process dies here (nothing after it runs: no save, no record)."""


def _kill_after(monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    """Die right after ``step`` is applied, before anything else of the step happens."""
    train_step = loop._train_step

    def dying(r: Any, batches: Any) -> Any:
        asked = train_step(r, batches)
        if r.state.global_step == step:
            raise Killed(step)
        return asked

    monkeypatch.setattr(loop, "_train_step", dying)


def _numbers(info: pytest.ExceptionInfo[NotLearning]) -> dict[str, Any]:
    n = dict(info.value.numbers)
    n.pop("step_s")  # a measured time
    return n


@pytest.mark.slow  # seconds of training
@pytest.mark.parametrize("elsewhere", [False, True], ids=["same folder", "another machine"])
def test_not_learning_decides_the_same_after_a_kill_between_two_evaluations(
    tmp_path: Path, monkeypatch, elsewhere: bool
) -> None:
    """Evaluations at steps 6, 12, 18 (one an epoch); a kill at step 9, checkpoints every 4
    steps: the resumed run restarts at step 8 and stops at step 12 with the same numbers as the
    run that was never killed. Resumed on another machine (the checkpoint store only, the run's
    folder new: no records to rebuild from), the rule's state comes from the checkpoint."""
    base = tmp_path
    spec = hopeless_campaign(base)
    with pytest.raises(NotLearning) as straight:
        train(spec, base, "frozen", checkpoint_every=4)
    shutil.rmtree(base / "out")  # the same run again, killed this time

    _kill_after(monkeypatch, 9)
    with pytest.raises(Killed):
        train(spec, base, "frozen", checkpoint_every=4)
    monkeypatch.undo()
    run_id = spec.resolve_run("frozen").run_id
    if elsewhere:
        shutil.rmtree(base / "out" / "runs" / run_id)  # a new machine: the store only
    with pytest.raises(NotLearning) as resumed:
        train(spec, base, "frozen", checkpoint_every=4)

    folder = base / "out" / "runs" / run_id
    restore = [r for r in read_metrics(folder / "metrics.jsonl") if r["kind"] == "restore"]
    assert [r["step"] for r in restore] == [8]
    assert resumed.value.step == straight.value.step == 12
    assert _numbers(resumed) == _numbers(straight)
    result = json.loads((folder / "result.json").read_text())
    assert result["stop"]["rule"] == "not_learning" and result["steps_done"] == 12


def test_the_hooks_state_is_in_every_checkpoint(tmp_path: Path) -> None:
    """The not-learning rule's losses are in the checkpoint's ``state.pt``, under ``hooks``."""
    spec = hopeless_campaign(tmp_path)
    res = train(spec, tmp_path, "frozen", stop_after_steps=3)  # the pilot keeps them too
    assert not res.completed
    store = LocalStore(tmp_path / "out" / "ck")
    from gpucampaign.checkpoint.manager import CheckpointManager

    resolved = spec.resolve_run("frozen")
    ck, _ = CheckpointManager(
        store, run_id=resolved.run_id, config_sha256=resolved.config_sha256
    ).load_latest()
    assert ck is not None and ck.step == 3
    state = ck.train_state["hooks"]["not_learning"]
    assert [s for s, _, _ in state["first"]] == [1, 2, 3]
    assert [s for s, _, _ in state["recent"]] == [1, 2, 3]
