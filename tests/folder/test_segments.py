"""Machine segments as they happen: start, heartbeats, end; a cut segment is closed on the
next start with the work it lost; interruptions and resumes are counted."""

from __future__ import annotations

import json

import pytest

from gpucampaign.core.files import read_jsonl
from gpucampaign.core.interrupt import Interrupted
from gpucampaign.folder.records import read_timeline
from gpucampaign.folder.segments import heartbeat, interruptions
from gpucampaign_prefect.orchestration.phases import busy, out_folder
from tests.helpers import TRAIN_CONTROL, one_lot_spec

SPEC = one_lot_spec(TRAIN_CONTROL)


def _metrics(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_a_segment_writes_start_heartbeats_and_end_lines_and_reads_back_as_one(tmp_path):
    folder = out_folder(tmp_path)
    with busy(folder, SPEC, phase="train", run="control") as row:
        heartbeat(tmp_path, row, checkpoint_step=10)
        heartbeat(tmp_path, row, checkpoint_step=20)
        row.steps = 20
    lines = read_jsonl(tmp_path / "timeline.jsonl")
    assert [x["event"] for x in lines] == ["start", "heartbeat", "heartbeat", "end"]
    assert len({x["segment"] for x in lines}) == 1
    (one,) = read_timeline(tmp_path)
    assert (one.outcome, one.steps, one.checkpoint_step) == ("ok", 20, 20)
    assert one.interval is not None and not one.interrupted


def test_a_cut_segment_is_closed_on_the_next_start_with_the_steps_it_lost(tmp_path):
    folder = out_folder(tmp_path)
    rid = SPEC.resolve_run("control").run_id
    # A process killed after its checkpoint of step 4: the start and a heartbeat, no end line.
    gen = busy(folder, SPEC, phase="train", run="control")
    row = gen.__enter__()
    heartbeat(tmp_path, row, checkpoint_step=4)
    _metrics(
        tmp_path / "runs" / rid / "metrics.jsonl",
        [
            *({"kind": "train", "step": s, "step_s": 0.5} for s in range(1, 5)),
            {"kind": "checkpoint", "step": 4},
            *({"kind": "train", "step": s, "step_s": 0.25} for s in range(5, 8)),
        ],
    )
    (open_row,) = read_timeline(tmp_path)
    assert open_row.end is None and open_row.checkpoint_step == 4

    with busy(folder, SPEC, phase="train", run="control") as again:
        again.steps = 16
    cut, resumed = read_timeline(tmp_path)
    assert cut.interrupted and "killed" in cut.outcome and "3 step(s)" in cut.outcome
    assert (cut.lost_steps, cut.lost_seconds, cut.checkpoint_step) == (3, 0.75, 4)
    assert cut.end is not None and cut.seconds >= 0
    assert resumed.outcome == "ok" and not resumed.interrupted
    summary = interruptions(read_timeline(tmp_path))
    assert summary["resumes"] == {"control": 1}
    assert summary["lost_steps"] == 3 and summary["lost_hours"] == pytest.approx(0.75 / 3600)
    assert [s["run"] for s in summary["segments"]] == ["control"]


def test_a_kill_after_latest_moved_counts_the_loss_from_the_checkpoint_a_resume_restores(tmp_path):
    # Killed after the save of step 6 moved LATEST but before its heartbeat and metrics row:
    # the records say step 4, the resume restores step 6; only step 7 is lost.
    folder = out_folder(tmp_path)
    rid = SPEC.resolve_run("control").run_id
    gen = busy(folder, SPEC, phase="train", run="control")  # kept: no end line at collection
    row = gen.__enter__()
    heartbeat(tmp_path, row, checkpoint_step=4)
    _metrics(
        tmp_path / "runs" / rid / "metrics.jsonl",
        [
            *({"kind": "train", "step": s, "step_s": 0.5} for s in range(1, 5)),
            {"kind": "checkpoint", "step": 4},
            *({"kind": "train", "step": s, "step_s": 0.25} for s in range(5, 8)),
        ],
    )
    latest = tmp_path / "checkpoints" / rid / "LATEST"
    latest.parent.mkdir(parents=True)
    latest.write_text(json.dumps({"step": 6, "meta_sha256": "0" * 64}))
    with busy(folder, SPEC, phase="train", run="control"):
        pass
    cut, _ = read_timeline(tmp_path)
    assert (cut.lost_steps, cut.lost_seconds, cut.checkpoint_step) == (1, 0.25, 6)
    assert "1 step(s)" in cut.outcome


def test_an_interrupted_segment_says_so_and_resumes_are_counted(tmp_path):
    folder = out_folder(tmp_path)
    for _ in range(3):
        with pytest.raises(Interrupted), busy(folder, SPEC, phase="train", run="control"):
            raise Interrupted("SIGTERM", step=8)
    with busy(folder, SPEC, phase="train", run="control"):
        pass
    rows = read_timeline(tmp_path)
    assert [r.interrupted for r in rows] == [True, True, True, False]
    assert "SIGTERM" in rows[0].outcome
    assert interruptions(rows)["resumes"] == {"control": 3}


def test_the_library_closes_a_cut_segment_from_the_durable_step_and_says_a_lot_end(tmp_path):
    """``folder.segments.phase_segment`` alone (no Prefect): the durable step it is given
    counts for a cut segment's loss, and the lot's end it is given is said as planned."""
    from gpucampaign.folder.layout import OutputFolder
    from gpucampaign.folder.segments import phase_segment

    class LotEnd(Interrupted):
        def __init__(self) -> None:
            super().__init__("lot_ended", step=6, detail="saved at step 6")
            self.detail = "saved at step 6"

    folder = OutputFolder(tmp_path)
    rid = SPEC.resolve_run("control").run_id
    asked: list[str] = []

    def durable(run_id: str) -> int:
        asked.append(run_id)
        return 6

    def segment():
        return phase_segment(
            folder, SPEC, phase="train", step=None, run="control", durable=durable, lot_end=LotEnd
        )

    killed = segment()  # kept: no end line at collection
    row = killed.__enter__()
    heartbeat(tmp_path, row, checkpoint_step=4)
    _metrics(
        tmp_path / "runs" / rid / "metrics.jsonl",
        [{"kind": "train", "step": s, "step_s": 0.25} for s in range(1, 8)],
    )
    with pytest.raises(LotEnd), segment():
        raise LotEnd()
    cut, ended = read_timeline(tmp_path)
    assert asked == [rid] and (cut.lost_steps, cut.checkpoint_step) == (1, 6)
    assert ended.outcome == "lot ended: saved at step 6" and not ended.interrupted


def test_the_report_shows_interruptions_resumes_and_lost_work(tmp_path):
    from gpucampaign.close.report import _interruptions_md

    folder = out_folder(tmp_path)
    for _ in range(3):
        with pytest.raises(Interrupted), busy(folder, SPEC, phase="train", run="control") as row:
            heartbeat(tmp_path, row, checkpoint_step=40)
            raise Interrupted("SIGINT", step=40)
    with busy(folder, SPEC, phase="train", run="control"):
        pass
    md = "\n".join(_interruptions_md({"interruptions": interruptions(read_timeline(tmp_path))}))
    assert "## Interruptions" in md and "control resumed 3 times" in md
    assert md.count("interrupted by SIGINT") == 3 and "| 40 |" in md
    assert _interruptions_md({"interruptions": interruptions([])}) == []


def test_a_resume_on_another_lot_of_the_same_host_is_a_relaunch() -> None:
    """Each lot is a machine: a run cut on lot 2 and resumed on lot 1 is relaunched on another
    machine even when both lots' workers run on one host (before, only the host was compared);
    a resume on the same lot and host is not."""
    from gpucampaign.folder.records import TimelineRow

    def rows(lot: int) -> list[TimelineRow]:
        return [
            TimelineRow(phase="train", run="a", host="h", lot=2, outcome="interrupted: killed"),
            TimelineRow(phase="train", run="a", host="h", lot=lot, outcome="ok"),
        ]

    moved, stayed = interruptions(rows(1)), interruptions(rows(2))
    assert [(s["lot"], s["resumed_lot"], s["relaunched"]) for s in moved["segments"]] == [
        (2, 1, True)
    ]
    assert moved["relaunches"] == 1
    assert [s["relaunched"] for s in stayed["segments"]] == [False] and stayed["relaunches"] == 0
