"""Two lots are two machines (issue 44), on the real stack: two process workers, one per lot's
work queue (``campaign worker --lot K``'s line, each with its ``GPUCAMPAIGN_LOT``), stand for
two rented machines; a spec of two lots with its store on the stack's S3 server runs through
``prefect deployment run``. The campaign's flow run (on lot 1's worker, the pool's default
queue) starts one sub-run of the ``lane`` deployment per machine on its lot's queue: each run
trains in the worker process of the machine the plan placed it on, the two machines' training
overlaps, and the campaign closes with one report and one manifest that ``campaign verify``
finds clean; every run's final parameters are those of the same runs trained on one machine.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpucampaign.config import load_spec
from gpucampaign.folder.layout import TIMELINE
from gpucampaign.folder.records import read_result, read_timeline
from gpucampaign.folder.segments import interruptions
from gpucampaign.plan import calendar
from gpucampaign.plan.lanes import machine_chains
from gpucampaign.storage.lanefiles import lane_prefix
from tests.faults.test_worker_killed_s3 import _gone, _sigkill_worker
from tests.helpers import (
    ROOT,
    RUN_TIMEOUT_S,
    S3_BUCKET,
    TERMINAL,
    api,
    bucket_keys,
    create_pool,
    s3_client,
    start_deployment,
    stop_worker,
    tiny_spec,
    wait_flow_run,
)
from tests.helpers.engine import run as train

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

POOL = "gpucampaign-lanes"
NAME = "lanes-e2e"
PREFIX = "e2e/lanes"
LOST = "lanes-lost"  # the deployments of the test of a lost machine
LOST_PREFIX = "e2e/lanes-lost"
SLOW_SITE = ROOT / "tests" / "helpers" / "slowsteps"


def _spec(dest: Path, *, prefix: str = PREFIX, **fields: Any) -> Path:
    """The tiny digits campaign on two one-GPU lots, a control and two variants of equal
    length, each variant free to start beside the control (``after: [decide]``)."""
    path = tiny_spec(
        dest,
        packages=[{"gpu": "rtx4090", "days": 3, "count": 2}],
        storage={"url": f"s3://gpucampaign/{prefix}"},
        **fields,
        # A GPU limit of its own: a spec of two lots raises the stack's shared 'gpu' to two.
        gpu_lock={"name": "gpu-lanes-e2e"},
    )
    data = yaml.safe_load(path.read_text())
    data["variants"] = [v for v in data["variants"] if v["name"] in ("lr-high", "bf16")]
    data["calendar"] = [
        {**s, "after": ["decide"]} if s.get("run") in ("lr-high", "bf16") else s
        for s in data["calendar"]
        if s.get("run") != "short"
    ]
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _copy_deployment(stack: dict[str, Any], flow: str, *, name: str = NAME) -> str:
    """``<flow>/main`` as the stack registered it, again as ``<flow>/<name>`` on ``POOL``,
    its flow runs sending a heartbeat every 30 s (the detector's short window finds a dead
    one within a minute and a half)."""
    main = api(stack["api"], "GET", f"/deployments/name/{flow}/main")
    keys = ("flow_id", "entrypoint", "path", "pull_steps", "parameters")
    body = {key: main[key] for key in (*keys, "parameter_openapi_schema")}
    variables = dict(main.get("job_variables") or {})
    variables["env"] = {**(variables.get("env") or {}), "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30"}
    body |= {"name": name, "work_pool_name": POOL, "job_variables": variables}
    made = api(stack["api"], "POST", "/deployments/", body)
    return str(made["id"])


def _pool(stack: dict[str, Any]) -> None:
    """``POOL`` on the stack's server, made by the module's first test."""
    pools = api(stack["api"], "POST", "/work_pools/filter", {})
    if POOL not in {p["name"] for p in pools}:
        create_pool(stack, POOL)


def _start_machine(
    stack: dict[str, Any], lot: int, *, home: Path, env: dict[str, str] | None = None
) -> subprocess.Popen:
    """`campaign worker --lot K` on ``POOL``, in a folder of the machine's own (it makes its
    queues on the server, then becomes the worker); ``env`` added to the stack's."""
    home.mkdir(parents=True, exist_ok=True)
    args = ["worker", "--lot", str(lot), "--pool", POOL, "--name", f"machine-{lot}"]
    with (home / "worker.log").open("ab") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "gpucampaign.cli", *args],
            cwd=home,
            env={**stack["env"], **(env or {})},
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def _train_rows(out: Path) -> dict[str, Any]:
    return {r.run: r for r in read_timeline(out) if r.phase == "train" and r.start and r.end}


def test_each_lot_trains_its_lanes_on_its_own_machine(stack, tmp_path):
    _pool(stack)
    for flow in ("campaign", "lane"):
        _copy_deployment(stack, flow)
    spec = _spec(tmp_path / "spec", checkpoint={"every_steps": 5, "keep": 3})
    cs = load_spec(spec)
    chains = machine_chains(calendar.plan(cs), spec=cs)
    assert set(chains) == {1, 2}, chains  # the plan uses both machines
    # Whether the two machines' training overlaps must not hang on how fast each worker
    # picks up its sub-run (on a loaded CI machine one lane of 40 tiny steps can end before
    # the other machine's flow-run process has imported torch): once the lanes are started,
    # both machines' steps wait 1.5 s each until each machine has checkpointed past its
    # pilot, then run at full speed again. The numbers do not change (the one-machine
    # comparison below), only the pace.
    pace = tmp_path / "step-sleep-s"
    pace.write_text("0")
    slow = {
        "PYTHONPATH": os.pathsep.join([str(SLOW_SITE), str(ROOT / "src"), str(ROOT)]),
        "GPUCAMPAIGN_TEST_STEP_SLEEP_S": "0.001",
        "GPUCAMPAIGN_TEST_STEP_SLEEP_FILE": str(pace),
    }
    machines = [
        _start_machine(stack, lot, home=tmp_path / f"machine-{lot}", env=slow) for lot in (1, 2)
    ]
    first = {lot: cs.resolve_run(lanes[0][0]).run_id for lot, lanes in chains.items()}
    out = tmp_path / "out"
    try:
        began = time.monotonic()
        flow_run_id = start_deployment(stack, f"campaign/{NAME}", spec=str(spec), out=str(out))
        give_up = began + RUN_TIMEOUT_S
        subs_filter = {"flow_runs": {"parent_flow_run_id": {"any_": [flow_run_id]}}}
        while not api(stack["api"], "POST", "/flow_runs/filter", subs_filter):
            state = api(stack["api"], "GET", f"/flow_runs/{flow_run_id}")["state"] or {}
            assert state.get("type") not in TERMINAL and time.monotonic() < give_up, state
            time.sleep(0.2)
        pace.write_text("1.5")  # the lanes are started: the pilots (10 steps) are behind
        while any(_latest_step(stack, rid, prefix=PREFIX) < 15 for rid in first.values()):
            state = api(stack["api"], "GET", f"/flow_runs/{flow_run_id}")["state"] or {}
            assert state.get("type") not in TERMINAL and time.monotonic() < give_up, state
            time.sleep(0.2)
        pace.write_text("0")
        state = wait_flow_run(stack, flow_run_id)
        wall = time.monotonic() - began
    finally:
        for proc in machines:
            stop_worker(proc)
    logs = "\n".join(
        (tmp_path / f"machine-{lot}" / "worker.log").read_text(errors="replace")[-3000:]
        for lot in (1, 2)
    )
    assert state.get("type") == "COMPLETED", f"{state}\n{logs}"
    print(f"two-machine campaign: {wall:.1f} s from `deployment run` to Completed")
    # The machines' runs are sub-runs of the campaign's, named by lot.
    subs = api(
        stack["api"],
        "POST",
        "/flow_runs/filter",
        {"flow_runs": {"parent_flow_run_id": {"any_": [flow_run_id]}}},
    )
    name = cs.name
    assert {r["name"] for r in subs} == {f"{name} lot 1", f"{name} lot 2"}, subs
    # Each run trained in the worker process of the machine the plan placed it on.
    rows = _train_rows(out)
    for lot, lanes in chains.items():
        for run in (r for chain in lanes for r in chain):
            assert rows[run].lot == lot and rows[run].worker == f"machine-{lot}", rows[run]
    # The two machines trained at the same time.
    spans = {
        lot: [
            (datetime.fromisoformat(rows[r].start), datetime.fromisoformat(rows[r].end or ""))
            for chain in lanes
            for r in chain
        ]
        for lot, lanes in chains.items()
    }
    assert any(a0 < b1 and b0 < a1 for a0, a1 in spans[1] for b0, b1 in spans[2]), spans
    # The training span against the same segments one after another (one machine's GPU).
    starts = [datetime.fromisoformat(r.start) for r in rows.values()]
    ends = [datetime.fromisoformat(r.end or "") for r in rows.values()]
    serial = sum((e - s).total_seconds() for s, e in zip(starts, ends, strict=True))
    span = (max(ends) - min(starts)).total_seconds()
    print(
        f"training: {span:.1f} s on two machines, {serial:.1f} s of segments end to end"
        " (steps paced while the lanes start)"
    )
    # Every run's final parameters are those of the same runs trained on one machine, in one
    # process (what `campaign run` of this spec with a local store trains, byte for byte).
    for run in cs.run_names():
        run_id = cs.resolve_run(run).run_id
        train(cs, spec.parent, name=run, out=str(tmp_path / "one-machine"))
        model = Path("runs", run_id, "model", "model.safetensors")
        assert (out / model).read_bytes() == (tmp_path / "one-machine" / model).read_bytes(), run
    # One folder in the bucket holds every run; each machine wrote only under its own keys.
    keys = bucket_keys(stack, PREFIX)
    assert {f"runs/{cs.resolve_run(r).run_id}/result.json" for r in cs.run_names()} <= keys
    assert {k.split("/")[1] for k in keys if k.startswith("lanes/")} == {"lot-1", "lot-2", "start"}
    # One report, one manifest, and the folder verifies.
    assert (out / "report.md").is_file() and (out / "manifest.json").is_file()
    verify = subprocess.run(
        [sys.executable, "-m", "gpucampaign.cli", "verify", str(out), "--json"],
        env={**os.environ, **stack["env"]},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert json.loads(verify.stdout)["verified"] is True


def _latest_step(stack: dict[str, Any], run_id: str, *, prefix: str) -> int:
    """The step of ``run_id``'s LATEST checkpoint in the bucket (0 before the first)."""
    try:
        body = s3_client(stack).get_object(Bucket=S3_BUCKET, Key=f"{prefix}/{run_id}/LATEST")
    except Exception:  # noqa: BLE001 -- no LATEST yet (NoSuchKey)
        return 0
    return int(json.loads(body["Body"].read())["step"])


def _shared_segment(stack: dict[str, Any], *, lot: int, run: str, prefix: str) -> bool:
    """Whether machine ``lot``'s timeline in the bucket (copied at each of its saves) holds a
    training segment of ``run``."""
    try:
        body = s3_client(stack).get_object(
            Bucket=S3_BUCKET, Key=f"{prefix}/{lane_prefix(lot)}/{TIMELINE}"
        )
    except Exception:  # noqa: BLE001 -- not copied yet (NoSuchKey)
        return False
    rows = [json.loads(line) for line in body["Body"].read().decode().splitlines() if line]
    return any(r.get("phase") == "train" and r.get("run") == run for r in rows)


def test_a_lost_machines_variant_finishes_on_the_other_after_its_lane(
    stack, tmp_path, short_dead_run_window
):
    """Lot 2's worker (and its flow-run process) SIGKILLed while its variant trains, after a
    checkpoint: the server sets its sub-run Crashed, the campaign's flow sends the variant to
    lot 1 after its own lane, resumed from its checkpoint in the bucket, bit for bit; the loss
    on the ledger with lot 2's worker; the campaign Completed without a command."""
    _pool(stack)
    for flow in ("campaign", "lane"):
        _copy_deployment(stack, flow, name=LOST)
    spec = _spec(tmp_path / "spec", prefix=LOST_PREFIX, checkpoint={"every_steps": 5, "keep": 3})
    cs = load_spec(spec)
    chains = machine_chains(calendar.plan(cs), spec=cs)
    lost_runs = [r for chain in chains[2] for r in chain]  # lr-high, then bf16
    lost_run = lost_runs[0]
    run_id = cs.resolve_run(lost_run).run_id
    slow = {  # lot 2's steps wait 0.5 s each: the kill lands mid-run, after a checkpoint
        "PYTHONPATH": os.pathsep.join([str(SLOW_SITE), str(ROOT / "src"), str(ROOT)]),
        "GPUCAMPAIGN_TEST_STEP_SLEEP_S": "0.5",
    }
    machines = {
        lot: _start_machine(stack, lot, home=tmp_path / f"machine-{lot}", env=env)
        for lot, env in ((1, None), (2, slow))
    }
    out = tmp_path / "out"
    args = ["prefect", "deployment", "run", f"campaign/{LOST}"]
    args += ["--param", f"spec={json.dumps(str(spec))}", "--param", f"out={json.dumps(str(out))}"]
    try:
        started = subprocess.run(
            args, env=stack["env"], capture_output=True, text=True, timeout=120
        )
        assert started.returncode == 0, started.stdout + started.stderr
        flow_run_id = re.search(r"UUID: ([0-9a-f-]{36})", started.stdout).group(1)  # type: ignore[union-attr]
        give_up = time.monotonic() + RUN_TIMEOUT_S
        # Steps 5 and 10 are its pilot's checkpoints (the campaign's flow, lot 1); 15, lot 2's
        # first, mid-run: the run trains 20 steps (one epoch), and a kill after step 20's save
        # raced the run's end line (main: it waited for 20; the fresh-clone CI once found the
        # run ended "ok" on lot 2 and nothing cut). The kill waits for that save's copy of lot
        # 2's timeline in the bucket too (written just after LATEST): a machine that dies
        # between the two leaves no segment to cut.
        while _latest_step(stack, run_id, prefix=LOST_PREFIX) < 15 or not _shared_segment(
            stack, lot=2, run=lost_run, prefix=LOST_PREFIX
        ):
            state = api(stack["api"], "GET", f"/flow_runs/{flow_run_id}")["state"] or {}
            assert state.get("type") not in TERMINAL and time.monotonic() < give_up, state
            time.sleep(0.05)
        killed = _sigkill_worker(machines.pop(2))
        killed_at = datetime.now(UTC)
        at_kill = _latest_step(stack, run_id, prefix=LOST_PREFIX)
        state = wait_flow_run(stack, flow_run_id)
    finally:
        for proc in machines.values():
            stop_worker(proc)
    log = (tmp_path / "machine-1" / "worker.log").read_text(errors="replace")[-3000:]
    assert state.get("type") == "COMPLETED", f"{state}\n{log}"
    assert all(_gone(pid) for pid in killed)
    subs = api(
        stack["api"],
        "POST",
        "/flow_runs/filter",
        {"flow_runs": {"parent_flow_run_id": {"any_": [flow_run_id]}}},
    )
    assert f"{cs.name} lot 1 for lot 2" in {r["name"] for r in subs}, subs
    # The loss on the ledger with its machine; the run resumed on lot 1 and ended there.
    result = read_result(out, run_id)
    assert result is not None and result.completed
    assert 15 <= at_kill < result.planned_steps, (at_kill, result.planned_steps)  # mid-run
    rows = [r for r in read_timeline(out) if r.phase == "train" and r.run == lost_run]
    cut = [r for r in rows if r.interrupted]
    assert [(r.lot, r.worker) for r in cut] == [(2, "machine-2")], rows
    control_end = max(
        r.end or "" for r in read_timeline(out) if r.phase == "train" and r.run == "control"
    )
    for run in lost_runs:  # each of lot 2's runs ended on lot 1, after lot 1's control
        last = [r for r in read_timeline(out) if r.phase == "train" and r.run == run][-1]
        assert (last.lot, last.worker, last.outcome) == (1, "machine-1", "ok"), last
        assert datetime.fromisoformat(last.start) >= datetime.fromisoformat(control_end), last
    losses = interruptions(read_timeline(out))["segments"]
    assert [loss["run"] for loss in losses] == [lost_run] and losses[0]["resumed_at"]
    down = (datetime.fromisoformat(rows[-1].start) - killed_at).total_seconds()
    print(f"machine lost: its variant resumed on lot 1 {down:.1f} s after the kill")
    # Bit for bit the parameters of the same run trained on one machine, uninterrupted.
    train(cs, spec.parent, name=lost_run, out=str(tmp_path / "one-machine"))
    model = Path("runs", run_id, "model", "model.safetensors")
    assert (out / model).read_bytes() == (tmp_path / "one-machine" / model).read_bytes()
