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
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpucampaign.config import load_spec
from gpucampaign.folder.records import read_timeline
from gpucampaign.plan import calendar
from gpucampaign.plan.lanes import machine_chains
from tests.helpers import api, bucket_keys, create_pool, run_deployment, stop_worker, tiny_spec
from tests.helpers.engine import run as train

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

POOL = "gpucampaign-lanes"
NAME = "lanes-e2e"
PREFIX = "e2e/lanes"


def _spec(dest: Path) -> Path:
    """The tiny digits campaign on two one-GPU lots, a control and two variants of equal
    length, each variant free to start beside the control (``after: [decide]``)."""
    path = tiny_spec(
        dest,
        packages=[{"gpu": "rtx4090", "days": 3, "count": 2}],
        storage={"url": f"s3://gpucampaign/{PREFIX}"},
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


def _copy_deployment(stack: dict[str, Any], flow: str) -> str:
    """``<flow>/main`` as the stack registered it, again as ``<flow>/NAME`` on ``POOL``."""
    main = api(stack["api"], "GET", f"/deployments/name/{flow}/main")
    keys = ("flow_id", "entrypoint", "path", "pull_steps", "parameters", "job_variables")
    body = {key: main[key] for key in (*keys, "parameter_openapi_schema")}
    made = api(
        stack["api"], "POST", "/deployments/", {**body, "name": NAME, "work_pool_name": POOL}
    )
    return str(made["id"])


def _start_machine(stack: dict[str, Any], lot: int, *, home: Path) -> subprocess.Popen:
    """`campaign worker --lot K` on ``POOL``, in a folder of the machine's own (it makes its
    queues on the server, then becomes the worker)."""
    home.mkdir(parents=True, exist_ok=True)
    args = ["worker", "--lot", str(lot), "--pool", POOL, "--name", f"machine-{lot}"]
    with (home / "worker.log").open("ab") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "gpucampaign.cli", *args],
            cwd=home,
            env=stack["env"],
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def _train_rows(out: Path) -> dict[str, Any]:
    return {r.run: r for r in read_timeline(out) if r.phase == "train" and r.start and r.end}


def test_each_lot_trains_its_lanes_on_its_own_machine(stack, tmp_path):
    create_pool(stack, POOL)
    for flow in ("campaign", "lane"):
        _copy_deployment(stack, flow)
    spec = _spec(tmp_path / "spec")
    chains = machine_chains(calendar.plan(load_spec(spec)), spec=load_spec(spec))
    assert set(chains) == {1, 2}, chains  # the plan uses both machines
    machines = [_start_machine(stack, lot, home=tmp_path / f"machine-{lot}") for lot in (1, 2)]
    out = tmp_path / "out"
    try:
        began = time.monotonic()
        flow_run_id, state = run_deployment(stack, f"campaign/{NAME}", spec=str(spec), out=str(out))
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
    name = load_spec(spec).name
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
    print(f"training: {span:.1f} s on two machines, {serial:.1f} s of segments end to end")
    # Every run's final parameters are those of the same runs trained on one machine, in one
    # process (what `campaign run` of this spec with a local store trains, byte for byte).
    cs = load_spec(spec)
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
