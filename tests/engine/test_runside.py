"""A training call's side of the output folder (``engine/runside.py``): one value built once,
the folder's files resolved once, the train task thin (issue 42: the walk of the folder)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

import gpucampaign.engine.runside as runside
from gpucampaign.core.files import read_jsonl
from gpucampaign.core.stoprules import NonFiniteLoss
from gpucampaign.engine.runside import RunSide
from gpucampaign.folder.layout import OutputFolder
from gpucampaign.folder.records import StopRecord, append_stop
from tests.helpers import corpus_of, digits_file, make_spec  # noqa: F401

TASK = Path(__file__).resolve().parents[2] / "src/gpucampaign_prefect/tasks/train.py"


def test_a_training_call_resolves_its_folder_once(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    digits_file: Any,  # noqa: F811
) -> None:
    """Opened, a segment with two heartbeats, the notes: the output folder is built once and
    each of its files is resolved once, at ``open`` (never again per write)."""
    spec = make_spec(tmp_path, digits_file)
    resolved: list[str] = []
    built: list[Path] = []
    path, init = OutputFolder.path, OutputFolder.__init__

    def counted_path(self: OutputFolder, relative: str) -> Path:
        resolved.append(relative)
        return path(self, relative)

    def counted_init(self: OutputFolder, root: Any) -> None:
        built.append(Path(root))
        init(self, root)

    monkeypatch.setattr(OutputFolder, "path", counted_path)
    monkeypatch.setattr(OutputFolder, "__init__", counted_init)
    run = spec.resolve_run("control")
    side = RunSide.open(spec, base_dir=tmp_path, out=tmp_path / "out", run=run, phase="train")
    with side.segment(phase="train", step=None) as seg:
        seg.saved({"step": 4})
        seg.saved({"step": 8})
        seg.row.steps = 8
    notes = side.notes()
    assert built == [tmp_path / "out"]
    assert sorted(resolved) == sorted(["stops.jsonl", "timeline.jsonl", f"runs/{run.run_id}"])
    lines = read_jsonl(tmp_path / "out" / "timeline.jsonl")
    assert [x["event"] for x in lines] == ["start", "heartbeat", "heartbeat", "end"]
    assert (lines[-1]["checkpoint_step"], lines[-1]["steps"]) == (8, 8)
    assert notes.n_train > 0 and notes.unsent is None and notes.spooled == []


def test_a_stopped_run_is_refused_before_its_inputs_are_read(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    digits_file: Any,  # noqa: F811
) -> None:
    """A run with a stop recorded is finished: ``open`` raises the stop, nothing loaded."""
    spec = make_spec(tmp_path, digits_file)
    run = spec.resolve_run("control")
    out = tmp_path / "out"
    out.mkdir()
    record = {"stop_id": "s1", "rule": NonFiniteLoss.rule, "run_id": run.run_id, "step": 3}
    append_stop(out, StopRecord.from_dict({**record, "reason": "loss is nan"}))

    def no_load(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the corpus of a stopped run was loaded")

    monkeypatch.setattr(runside, "load_spec_corpus", no_load)
    with pytest.raises(NonFiniteLoss, match="loss is nan") as stop:
        RunSide.open(spec, base_dir=tmp_path, out=out, run=run, phase="train")
    assert (stop.value.step, stop.value.stop_id) == (3, "s1")


def test_a_remote_store_gets_the_timeline_at_the_start_and_each_heartbeat(
    tmp_path: Path,
    digits_file: Any,  # noqa: F811
) -> None:
    """With a store that is not the folder's own (S3), the segment's start and each heartbeat
    copy the timeline to it, and the notes list the checkpoint files waiting in the folder's
    spool."""
    from gpucampaign.folder.segments import Timeline
    from gpucampaign.storage import LocalStore

    class Remote:
        url = "s3://bucket/c"
        written: list[tuple[str, bytes]] = []

        def local_path(self, key: str) -> None:
            return None

        def write_bytes(self, key: str, *, data: bytes) -> None:
            self.written.append((key, data))

    spec = make_spec(tmp_path, digits_file)
    run = spec.resolve_run("control")
    out = OutputFolder(tmp_path / "out")
    out.root.mkdir()
    store = Remote()
    side = RunSide(
        spec=spec,
        run=run,
        out=out,
        run_folder=out.run(run.run_id),
        timeline=Timeline.of(out),
        corpus=corpus_of(tmp_path, spec),
        store=store,  # type: ignore[arg-type]
        remote=True,
    )
    with side.segment(phase="train", step=None) as seg:
        # The open segment is in the store before the first save: a machine lost before its
        # first heartbeat leaves it where the campaign finds it and charges the loss.
        assert [(key, data.count(b"\n")) for key, data in store.written] == [("timeline.jsonl", 1)]
        seg.saved({"step": 4})
        seg.saved({"step": 8})
    timeline = (out.root / "timeline.jsonl").read_bytes()
    assert [key for key, _ in store.written] == ["timeline.jsonl"] * 3
    assert timeline.startswith(store.written[-1][1]) and store.written[-1][1].count(b"\n") == 3
    LocalStore(out.root / "spool").write_bytes(f"{run.run_id}/LATEST", data=b"{}")
    assert side.notes().spooled == [f"{run.run_id}/LATEST"]


def test_the_train_task_reaches_the_folder_through_one_value() -> None:
    """``tasks/train.py`` names no file of the folder, builds no folder value and imports none
    of the modules that write it: the ``RunSide`` does (the task stays thin)."""
    tree = ast.parse(TASK.read_text(encoding="utf-8"))
    imported = {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module is not None
    }
    writers = {m for m in imported if m.startswith(("gpucampaign.storage", "gpucampaign.tracking"))}
    writers |= imported & {
        "gpucampaign.folder.layout",
        "gpucampaign.folder.records",
        "gpucampaign.folder.segments",
        "gpucampaign.engine.parts",
        "gpucampaign_prefect.orchestration.phases.busy",
    }
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert writers == set()
    assert names.isdisjoint({"OutputFolder", "RunFolder", "out_folder", "Path", "busy"})
    assert "gpucampaign.engine.runside" in imported
