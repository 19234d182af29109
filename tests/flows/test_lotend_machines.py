"""A lot that ends mid-lane hands the rest of its lane to the other machine: the real ``lane``
flow trains each machine's share, in this process, on the session's Prefect test server.

Two dated lots open side by side, lot 2 ending days before lot 1. The clock (a clock file, as a
worker's process would read it) jumps past lot 2's end once lot 2's first run has saved a
checkpoint past its pilot: that run stops at its lot's end with its step saved, the run queued
behind it on lot 2 is not started, and both train on lot 1 after lot 1's own lane, the first
resumed from its checkpoint, to the same parameters as a run never interrupted.

What stands in for the stack: the machines' workers are this process, one lane at a time
(``GPUCAMPAIGN_LOT`` is the process's), dispatched by ``run_on_machines``'s ``dispatch`` seam
instead of ``run_deployment``; the ``s3://`` bucket is one local store that every folder's
``storage.url: local`` opens (the campaign folder's ``checkpoints``). The e2e twin with real
workers and a SIGKILL is tests/e2e/test_lanes_on_machines.py.
"""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from prefect.client.schemas.objects import FlowRun

from gpucampaign.close.report import _interruptions_md
from gpucampaign.config import load_spec
from gpucampaign.core.clock import CLOCK_FILE_ENV, shift_clock
from gpucampaign.engine import lotend
from gpucampaign.folder import segments
from gpucampaign.folder.layout import OutputFolder
from gpucampaign.folder.records import LOT_ENDED_OUTCOME, read_timeline
from gpucampaign.folder.segments import interruptions
from gpucampaign.plan import calendar
from gpucampaign.plan.lanes import machine_chains
from gpucampaign.plan.lots import LOT_ENV
from gpucampaign.storage import LocalStore
from gpucampaign.storage import open as store_open
from gpucampaign_prefect.flows._machines import LanesLeft, run_on_machines
from gpucampaign_prefect.flows.lane import lane
from tests.flows.test_campaign import jsonl, run_flow, tiny_campaign
from tests.helpers.engine import run as train

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

#: Lot 2's first run, whose lot ends under it, and the step past its pilot it saved first.
CUT_RUN, CUT_AFTER = "lr-high", 15


def _spec(tmp_path: Path, *, opened: datetime) -> Path:
    """Four runs of 40 steps (pilot 10, a checkpoint every 5) on two lots opened an hour ago:
    lot 1 for 7 days, lot 2 for 3."""

    def edit(data: dict[str, Any]) -> None:
        data["packages"] = [
            {"gpu": "rtx4090", "days": days, "starts_at": opened.isoformat()} for days in (7, 3)
        ]
        data["control"] = {**data["control"], "max_steps": 40}
        data["pilot"] = {"steps": 10}
        data["checkpoint"] = {**(data.get("checkpoint") or {}), "every_steps": 5}
        data["stop_rules"] = {**(data.get("stop_rules") or {}), "futility": False}

    return tiny_campaign(tmp_path, packages=edit)


class _Workers:
    """Each lot's worker, played in this process: the real ``lane`` flow for the machine that
    is dispatched, with ``GPUCAMPAIGN_LOT`` naming it. One machine at a time (the variable is
    the process's): lot 2's lane first, so that its lot ends before lot 1's lane starts."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch = monkeypatch
        self.calls: list[dict[str, Any]] = []
        self.lot2_done = threading.Event()
        self.one_at_a_time = threading.Lock()

    def __call__(self, **kw: Any) -> FlowRun:
        params = kw["parameters"]
        if params["lot"] == 1 and not self.lot2_done.is_set():
            assert self.lot2_done.wait(240), "lot 2's lane never ended"
        with self.one_at_a_time:
            self.calls.append(kw)
            self.monkeypatch.setenv(LOT_ENV, str(params["lot"]))
            state = lane(**params, return_state=True)
        if params["lot"] == 2:
            self.lot2_done.set()
        return FlowRun(id=uuid.uuid4(), flow_id=uuid.uuid4(), name=kw["flow_run_name"], state=state)


def test_a_lot_that_ends_mid_lane_hands_the_rest_of_its_lane_to_the_other_machine(
    prefect_harness: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    opened = datetime.now(UTC) - timedelta(hours=1)
    spec_path = _spec(tmp_path, opened=opened)
    cs = load_spec(spec_path)
    plan = calendar.plan(cs)
    chains = machine_chains(plan, spec=cs)
    assert chains == {1: [["control", "bf16"]], 2: [[CUT_RUN, "short"]]}
    out = tmp_path / "out"
    folder = OutputFolder(out)
    folder.root.mkdir()
    # One store for every machine, as an s3:// bucket is: the campaign folder's checkpoints.
    shared = out / "checkpoints"
    monkeypatch.setattr(store_open, "LocalStore", lambda _root: LocalStore(shared))
    # The clock every machine reads (a worker's process reads the same file).
    clock_file = tmp_path / "clock"
    monkeypatch.setenv(CLOCK_FILE_ENV, str(clock_file))
    lotend.forget_ended_lots()
    past_lot2 = (opened + timedelta(days=3) - datetime.now(UTC)).total_seconds() + 60
    saved = segments.SegmentWriter.saved
    shifted: list[int] = []

    def saved_then_jump(self: segments.SegmentWriter, info: Any) -> None:
        saved(self, info)
        if self.row.run == CUT_RUN and int(info["step"]) >= CUT_AFTER and not shifted:
            shifted.append(int(info["step"]))
            shift_clock(clock_file, by_s=past_lot2)  # lot 2 has ended; lot 1 has days left

    monkeypatch.setattr(segments.SegmentWriter, "saved", saved_then_jump)
    workers = _Workers(monkeypatch)
    try:
        stops = run_on_machines(
            cs,
            plan=plan,
            dropped=[],
            folder=folder,
            dispatch=workers,
            deployment=("lane/main", {"spec": str(spec_path), "out": str(out)}),
        )
    finally:
        lotend.forget_ended_lots()
    assert stops == {}
    assert len(shifted) == 1  # at lot 2's first save past the pilot
    # Lot 2's lane, lot 1's, then the rest of lot 2's on lot 1.
    assert [(c["parameters"]["lot"], c["parameters"]["chains"]) for c in workers.calls] == [
        (2, [[CUT_RUN, "short"]]),
        (1, [["control", "bf16"]]),
        (1, [[CUT_RUN, "short"]]),
    ]
    assert workers.calls[-1]["flow_run_name"] == f"{cs.name} lot 1 for lot 2"
    # The campaign says lot 2's lot ended and where its runs went.
    said = [m for m in caplog.messages if m.startswith("lot 2 ended (its lot's end stopped")]
    assert len(said) == 1 and f"{CUT_RUN}, short go on on lot 1 after its own lane" in said[0]
    rows = [r for r in read_timeline(out) if r.phase == "train"]
    # Lot 2's run stopped at its lot's end, its step saved: on the ledger as lot 2's end.
    ended = [r for r in rows if r.outcome and r.outcome.startswith(LOT_ENDED_OUTCOME)]
    assert [(r.run, r.lot) for r in ended] == [(CUT_RUN, 2)], rows
    ledger = interruptions(read_timeline(out))
    assert ledger["segments"] == []  # nothing lost
    assert [(e["run"], e["lot"], e["resumed_lot"]) for e in ledger["lot_ends"]] == [(CUT_RUN, 2, 1)]
    table = _interruptions_md({"interruptions": ledger})  # the report's
    assert [line for line in table if f"| {CUT_RUN} | lot 2 (" in line and "| lot 1 (" in line]
    # Nothing else ran on lot 2 ("short" was not started there); the rest of its lane ran on
    # lot 1 after lot 1's own lane, and every run ended there.
    assert [r.run for r in rows if r.lot == 2] == [CUT_RUN], rows
    own_end = max(r.end or "" for r in rows if r.run in ("control", "bf16"))
    for run in (CUT_RUN, "short"):
        last = [r for r in rows if r.run == run][-1]
        assert (last.lot, last.outcome) == (1, "ok") and last.start > own_end, last
    # Resumed from its checkpoint: the step lot 2 saved at its end.
    cut_id = cs.resolve_run(CUT_RUN).run_id
    metrics = jsonl(out / "runs" / cut_id / "metrics.jsonl")
    lot_end = [m for m in metrics if m["kind"] == "lot_end"]
    restores = [m for m in metrics if m["kind"] == "restore"]
    assert [m["lot"] for m in lot_end] == [2] and lot_end[0]["step"] >= CUT_AFTER, lot_end
    assert [m["step"] for m in restores] == [lot_end[0]["step"]], restores
    # Every run has its result, and the cut run's final parameters are byte for byte those of
    # the same run trained uninterrupted in one process.
    for run in cs.run_names():
        assert (out / "runs" / cs.resolve_run(run).run_id / "result.json").is_file(), run
    train(cs, spec_path.parent, name=CUT_RUN, out="one-machine")
    model = Path("runs", cut_id, "model", "model.safetensors")
    assert (out / model).read_bytes() == (spec_path.parent / "one-machine" / model).read_bytes()


def test_with_no_machine_left_the_campaign_closes_with_what_is_done_and_resumes(
    prefect_harness, tmp_path, monkeypatch
):
    """A machine's lane left unfinished and no machine with time left to take its runs
    (``run_on_machines`` raises ``LanesLeft``, as ``test_machines.py`` shows it does): the
    campaign flow closes with what is done (report, manifest), ends Cancelled saying the runs
    left, why and the fix, and stays resumable: the same campaign run again trains what is
    left and completes."""
    from gpucampaign_prefect.flows import campaign as flow

    spec = tiny_campaign(tmp_path, stop_rules={"futility": False})
    out = tmp_path / "out"
    said = (
        "machines did not finish their lanes (lot 2: flow run 'x lot 2' Crashed; runs left: "
        "lr-high): start each one's worker (`campaign worker --lot K`) and run the campaign "
        "again; it resumes from the store"
    )

    def no_machine_left(cs: Any, **_: Any) -> dict[str, Any]:
        raise LanesLeft(said)

    with monkeypatch.context() as patched:
        patched.setattr(flow, "on_machines", lambda cs, *, plan: True)
        patched.setattr(flow, "run_on_machines", no_machine_left)
        state = run_flow(spec, out)
    assert state.is_cancelled(), state.message
    assert state.message == f"the campaign closed with what is done: {said}"
    assert (out / "report.md").is_file() and (out / "manifest.json").is_file()
    again = run_flow(spec, out)
    assert again.is_completed(), again.message
    assert set(again.result()["runs"].values()) == {"completed"}
