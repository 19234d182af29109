"""Each lot's lanes on that lot's machine: the campaign flow starts one sub-run of the ``lane``
deployment per machine on its work queue, and takes the machines' records from the store into
its one folder; two machines never write the same key (no Prefect server: the machines are
played by a fake ``run_deployment``)."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prefect.client.schemas.objects import FlowRun
from prefect.states import Completed, Crashed

from gpucampaign.config import load_spec
from gpucampaign.core.clock import DrivenClock, use_clock
from gpucampaign.folder.layout import OutputFolder
from gpucampaign.folder.records import read_timeline
from gpucampaign.folder.segments import interruptions
from gpucampaign.plan import calendar
from gpucampaign.plan.lanes import machine_chains
from gpucampaign.storage.base import LocalStore
from gpucampaign.storage.lanefiles import (
    START,
    collect_lanes,
    lane_prefix,
    publish_lane,
    publish_start,
    seed_lane,
)
from gpucampaign_prefect.flows._machines import LanesLeft, on_machines, run_on_machines

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _machine_folder(root: Path, *, runs: list[str], lot: int) -> Path:
    """A machine's local folder after training ``runs``: each run's folder and its timeline."""
    for run_id in runs:
        folder = root / "runs" / run_id
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "result.json").write_text(json.dumps({"run_id": run_id, "lot": lot}))
        (folder / "metrics.jsonl").write_text('{"step": 1}\n')
        (folder / "progress.json").write_text("{}")  # live: stays on the machine
        with open(root / "timeline.jsonl", "a") as f:
            f.write(json.dumps({"segment": run_id, "lot": lot, "phase": "train"}) + "\n")
    return root


def test_two_machines_never_write_the_same_key(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "bucket")
    # Both machines hold files of the same names (timeline, stops, a run folder each).
    keys = {
        lot: set(
            publish_lane(
                _machine_folder(tmp_path / f"m{lot}", runs=[f"run-{lot}"], lot=lot),
                store=store,
                lot=lot,
                run_ids=[f"run-{lot}"],
            )
        )
        for lot in (1, 2)
    }
    assert keys[1] and keys[2] and not keys[1] & keys[2]
    for lot, mine in keys.items():
        assert all(k.startswith(lane_prefix(lot) + "/") for k in mine)
        assert not any(k.endswith("progress.json") for k in mine)
    # The campaign's folder takes both in; collecting again doubles no line.
    root = tmp_path / "campaign"
    root.mkdir()
    (root / "timeline.jsonl").write_text('{"segment": "pilot"}\n')
    for _ in range(2):
        assert collect_lanes(root, store=store, lots=[1, 2]) == {1: 3, 2: 3}
    rows = [json.loads(line) for line in (root / "timeline.jsonl").read_text().splitlines()]
    assert rows == [
        {"segment": "pilot"},
        {"segment": "run-1", "lot": 1, "phase": "train"},
        {"segment": "run-2", "lot": 2, "phase": "train"},
    ]
    assert json.loads((root / "runs/run-2/result.json").read_text())["lot"] == 2
    # The campaign's own copy for the machines to start from is under a key of its own too.
    start = set(publish_start(root, store=store, run_ids=["run-1", "run-2"]))
    assert start and all(k.startswith(START + "/") for k in start)
    assert not start & (keys[1] | keys[2])


def test_a_machine_starts_its_runs_from_the_pilots_folders(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "bucket")
    campaign = _machine_folder(tmp_path / "campaign", runs=["pilot-run", "other"], lot=1)
    (campaign / "stops.jsonl").write_text('{"run_id": "gone"}\n')
    publish_start(campaign, store=store, run_ids=["pilot-run", "other"])
    machine = tmp_path / "machine"
    (machine / "runs/other").mkdir(parents=True)
    (machine / "runs/other/metrics.jsonl").write_text('{"step": 7}\n')  # an earlier start's
    assert seed_lane(machine, store=store, run_ids=["pilot-run", "other"]) == 4
    assert (machine / "runs/pilot-run/metrics.jsonl").read_text() == '{"step": 1}\n'
    assert (machine / "runs/other/metrics.jsonl").read_text() == '{"step": 7}\n'
    assert (machine / "stops.jsonl").is_file() and not (machine / "timeline.jsonl").exists()


class _Machines:
    """The workers of two queues, played: each call is one machine's flow run."""

    def __init__(self, cs: Any, *, bucket: Path, crashed: int | None = None) -> None:
        self.cs, self.bucket, self.crashed = cs, bucket, crashed
        self.calls: list[dict[str, Any]] = []

    def __call__(self, **kw: Any) -> FlowRun:
        self.calls.append(kw)
        lot = kw["parameters"]["lot"]
        runs = [r for chain in kw["parameters"]["chains"] for r in chain]
        ids = [self.cs.resolve_run(r).run_id for r in runs]
        local = _machine_folder(self.bucket.parent / f"machine-{lot}", runs=ids, lot=lot)
        publish_lane(local, store=LocalStore(self.bucket), lot=lot, run_ids=ids)
        state = Crashed() if lot == self.crashed else Completed()
        return FlowRun(id=uuid.uuid4(), flow_id=uuid.uuid4(), name=kw["flow_run_name"], state=state)


def test_each_machine_trains_its_lanes_as_a_sub_run_on_its_lots_queue(tmp_path: Path) -> None:
    cs = load_spec(EXAMPLES / "two-lots.yaml")
    plan = calendar.plan(cs)
    folder = OutputFolder(tmp_path / "out")
    folder.root.mkdir()
    # A local store keeps its keys under out/checkpoints: the machines write there.
    machines = _Machines(cs, bucket=folder.root / "checkpoints")
    stops = run_on_machines(
        cs,
        plan=plan,
        dropped=[],
        folder=folder,
        dispatch=machines,
        deployment=("lane/main", {"spec": "two-lots.yaml", "out": "out/two-lots"}),
    )
    assert stops == {}
    # The plan's chains (the calendar puts decay after the control on lot 1).
    assert machine_chains(plan, spec=cs) == {1: [["control", "decay"]], 2: [["dropout"]]}
    by_lot = {c["parameters"]["lot"]: c for c in machines.calls}
    assert set(by_lot) == {1, 2}
    for lot, call in by_lot.items():
        assert call["name"] == "lane/main" and call["as_subflow"] is True
        assert call["work_queue_name"] == f"lot-{lot}"
        assert call["flow_run_name"] == f"two-lots lot {lot}"
        assert call["parameters"]["spec"] == "two-lots.yaml"
        assert call["parameters"]["out"] == "out/two-lots"
    assert by_lot[1]["parameters"]["chains"] == [["control", "decay"]]
    assert by_lot[2]["parameters"]["chains"] == [["dropout"]]
    # Every run's folder is in the campaign's folder, trained on its machine.
    for run, lot in (("control", 1), ("decay", 1), ("dropout", 2)):
        result = folder.root / "runs" / cs.resolve_run(run).run_id / "result.json"
        assert json.loads(result.read_text())["lot"] == lot


def test_a_machine_lost_after_its_last_run_hands_nothing_over(tmp_path: Path) -> None:
    cs = load_spec(EXAMPLES / "two-lots.yaml")
    folder = OutputFolder(tmp_path / "out")
    folder.root.mkdir()
    machines = _Machines(cs, bucket=folder.root / "checkpoints", crashed=2)
    stops = run_on_machines(
        cs,
        plan=calendar.plan(cs),
        dropped=["decay"],
        folder=folder,
        dispatch=machines,
        deployment=("lane/main", {"spec": "s.yaml", "out": "o"}),
    )
    assert stops == {}  # its runs all ended before its flow run Crashed
    assert sorted(c["parameters"]["lot"] for c in machines.calls) == [1, 2]


def test_lanes_stay_threads_of_one_process_without_a_deployment_or_an_s3_store() -> None:
    cs = load_spec(EXAMPLES / "two-lots.yaml")
    plan = calendar.plan(cs)
    assert not on_machines(cs, plan=plan)  # a local store
    s3 = cs.model_copy(update={"storage": cs.storage.model_copy(update={"url": "s3://b/c"})})
    assert not on_machines(s3, plan=plan)  # no flow run of a deployment (campaign run)


def test_a_deployments_run_of_two_lots_with_a_local_store_is_refused_writing_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flow run of a deployment (its lots' workers would run the lanes) refuses a local
    store before the output folder, a lock or the store is touched."""
    import logging

    from gpucampaign_prefect.flows import campaign as flow_module

    monkeypatch.setattr(flow_module, "from_deployment", lambda: True)
    monkeypatch.setattr(flow_module, "get_run_logger", lambda: logging.getLogger("test"))
    state = flow_module.campaign.fn(spec=str(EXAMPLES / "two-lots.yaml"), out=str(tmp_path / "o"))
    assert state.is_failed()
    assert state.message.startswith("refused before anything started: field 'storage.url'")
    assert "`storage.url: s3://BUCKET/PREFIX`" in state.message
    assert list(tmp_path.iterdir()) == []  # nothing written


def _dated(cs: Any, *, starts: list[datetime] | None = None) -> Any:
    """``cs`` with its two lots dated: ``starts``, by default one after the other (the lot-end
    hand-over's)."""
    first = datetime(2026, 12, 1, tzinfo=UTC)
    starts = starts or [first, first + timedelta(days=3)]
    lots = [cs.packages[0].model_copy(update={"count": 1, "starts_at": at}) for at in starts]
    s3 = cs.storage.model_copy(update={"url": "s3://b/c"})
    return type(cs).model_validate({**cs.model_dump(), "packages": lots, "storage": s3})


def test_dated_lots_follow_one_another_and_never_run_as_machines_side_by_side(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fresh-clone CI's test_lotend_s3 sent both dated lots their lanes at once: dated lots
    are the lot-end hand-over's (one after the other), never machines of their own."""
    from gpucampaign_prefect.flows import _machines

    run = SimpleNamespace(flow_run=SimpleNamespace(deployment_id=uuid.uuid4()))
    monkeypatch.setattr(_machines.FlowRunContext, "get", lambda: run)  # a deployment's run
    two = load_spec(EXAMPLES / "two-lots.yaml")
    s3 = two.model_copy(update={"storage": two.storage.model_copy(update={"url": "s3://b/c"})})
    assert on_machines(s3, plan=calendar.plan(s3))  # undated: two machines side by side
    dated = _dated(two)
    assert len(calendar.plan(dated).machines) == 2
    assert not on_machines(dated, plan=calendar.plan(dated))
    # Dated lots rented side by side (one start, open now) are machines side by side, each
    # with its own end; a lot that opens later, even before the first ends, follows it (the
    # e2e test_lotend_s3's lots).
    opened = datetime.now(UTC) - timedelta(hours=1)
    side = _dated(two, starts=[opened, opened])
    assert on_machines(side, plan=calendar.plan(side))
    later = _dated(two, starts=[opened - timedelta(days=2), opened])
    assert not on_machines(later, plan=calendar.plan(later))


class _LosingMachines(_Machines):
    """Lot 2's worker dies while ``dropout`` trains (after a checkpoint at step 40): its lane
    published an open segment and no end; a later call on lot 1's queue trains what is left."""

    def __init__(self, cs: Any, *, bucket: Path, lost: set[int]) -> None:
        super().__init__(cs, bucket=bucket)
        self.lost = lost

    def __call__(self, **kw: Any) -> FlowRun:
        lot, chains = kw["parameters"]["lot"], kw["parameters"]["chains"]
        if lot not in self.lost:
            run = super().__call__(**kw)
            self._segment(lot, run="dropout", end=True) if chains == [["dropout"]] else None
            return run
        self.calls.append(kw)
        self._segment(lot, run="dropout", end=False)
        return FlowRun(
            id=uuid.uuid4(), flow_id=uuid.uuid4(), name=kw["flow_run_name"], state=Crashed()
        )

    def _segment(self, lot: int, *, run: str, end: bool) -> None:
        local = self.bucket.parent / f"machine-{lot}"
        local.mkdir(parents=True, exist_ok=True)
        start = f"2026-12-06T10:0{lot}:00.000+00:00"
        row = {
            "phase": "train",
            "run": run,
            "segment": f"seg-{lot}",
            "event": "start",
            "start": start,
            "host": f"host-{lot}",
            "lot": lot,
        }
        lines = [row, {**row, "event": "heartbeat", "checkpoint_step": 40, "seen": start}]
        if end:
            lines.append({**row, "event": "end", "end": start, "seconds": 1.0, "outcome": "ok"})
        with open(local / "timeline.jsonl", "a") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)
        publish_lane(local, store=LocalStore(self.bucket), lot=lot, run_ids=[])


def _lose(
    tmp_path: Path, *, lost: set[int], cs: Any = None
) -> tuple[Any, OutputFolder, _LosingMachines, Any]:
    cs = cs or load_spec(EXAMPLES / "two-lots.yaml")
    folder = OutputFolder(tmp_path / "out")
    folder.root.mkdir()
    machines = _LosingMachines(cs, bucket=folder.root / "checkpoints", lost=lost)

    def run() -> Any:
        return run_on_machines(
            cs,
            plan=calendar.plan(cs),
            dropped=[],
            folder=folder,
            dispatch=machines,
            deployment=("lane/main", {"spec": "s.yaml", "out": "o"}),
        )

    return cs, folder, machines, run


def test_a_lost_machines_runs_go_on_on_the_other_machine_after_its_lane(tmp_path: Path) -> None:
    cs, folder, machines, run = _lose(tmp_path, lost={2})
    assert run() == {}
    # Lot 1 trained its own lane, then (a second sub-run on its queue) lot 2's dropout.
    calls = [(c["work_queue_name"], c["parameters"]["chains"]) for c in machines.calls]
    assert sorted(calls[:2]) == [("lot-1", [["control", "decay"]]), ("lot-2", [["dropout"]])]
    assert calls[2:] == [("lot-1", [["dropout"]])]
    last = machines.calls[-1]
    assert last["flow_run_name"] == "two-lots lot 1 for lot 2" and last["as_subflow"] is True
    result = folder.root / "runs" / cs.resolve_run("dropout").run_id / "result.json"
    assert json.loads(result.read_text())["lot"] == 1
    # The loss is on the ledger with its machine, resumed on the other one.
    lost = interruptions(read_timeline(folder.root))
    assert [(s["run"], s["host"], s["resumed_host"]) for s in lost["segments"]] == [
        ("dropout", "host-2", "host-1")
    ]
    assert lost["segments"][0]["checkpoint_step"] == 40 and lost["relaunches"] == 1


def test_with_no_other_machine_the_runs_left_are_said(tmp_path: Path) -> None:
    _, _, machines, run = _lose(tmp_path, lost={1, 2})
    with pytest.raises(LanesLeft, match=r"runs left: control, decay, dropout\).*--lot K"):
        run()
    assert len(machines.calls) == 2  # nothing handed over: no machine finished its lane


def test_a_lost_machines_runs_never_go_to_a_machine_whose_lot_has_ended_too(tmp_path: Path) -> None:
    """Lot 2 lost its lane while lot 1's lot is inside its least margin (5 s left): lot 1
    would refuse to start them (``refuse_start``), so nothing is handed over and the runs left
    are said."""
    opened = datetime(2026, 12, 1, tzinfo=UTC)
    two = load_spec(EXAMPLES / "two-lots.yaml")
    cs = _dated(two, starts=[opened, opened]).model_copy(update={"storage": two.storage})
    _, _, machines, run = _lose(tmp_path, lost={2}, cs=cs)
    near_end = opened + timedelta(days=3) - timedelta(seconds=5)
    with (
        use_clock(DrivenClock(near_end)),
        pytest.raises(LanesLeft, match=r"runs left: dropout\): no machine .* time left"),
    ):
        run()
    assert sorted(c["parameters"]["lot"] for c in machines.calls) == [1, 2]  # no hand-over
