"""Many GPU hosts, played on one machine: two process workers on the local stack (one per
"host", each taking one flow run at a time) run two campaigns at once; both campaigns share the
GPU limit `gpu` of one slot, so their GPU phases (pilot, train, restart) never overlap.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from gpucampaign.folder.records import read_timeline
from tests.helpers import (
    ROOT,
    api,
    create_pool,
    pool_deployment,
    start_worker,
    stop_worker,
    tiny_spec,
    wait_flow_run,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

POOL = "gpucampaign-hosts"
HOSTS = ("host-a", "host-b")
GPU_PHASES = {"pilot", "train", "restart"}


def _gpu_intervals(out: Path) -> list[tuple[datetime, datetime]]:
    # One row per segment (its start, heartbeat and end lines folded), as the report reads it.
    return [
        (datetime.fromisoformat(r.start), datetime.fromisoformat(r.end))
        for r in read_timeline(out)
        if r.phase in GPU_PHASES and r.start and r.end
    ]


def _submitted_by(stack: dict[str, Any], flow_run_id: str) -> set[str]:
    logs = api(
        stack["api"],
        "POST",
        "/logs/filter",
        {"logs": {"flow_run_id": {"any_": [flow_run_id]}}, "limit": 200},
    )
    return {h for h in HOSTS for log in logs if f"Worker '{h}' submitting" in log["message"]}


def test_two_workers_sharing_one_gpu_slot_never_overlap(stack, tmp_path):
    create_pool(stack, POOL)
    deployment_id = pool_deployment(stack, pool=POOL, name="hosts")
    spec = tiny_spec(tmp_path / "spec")
    workers = [start_worker(stack, pool=POOL, name=h, log=tmp_path / f"{h}.log") for h in HOSTS]
    try:
        outs = [tmp_path / f"out-{h}" for h in HOSTS]
        run_ids = [
            api(
                stack["api"],
                "POST",
                f"/deployments/{deployment_id}/create_flow_run",
                {"parameters": {"spec": str(spec), "out": str(out)}},
            )["id"]
            for out in outs
        ]
        states = [wait_flow_run(stack, run_id) for run_id in run_ids]
    finally:
        for proc in workers:
            stop_worker(proc)
    logs = "\n".join((tmp_path / f"{h}.log").read_text(errors="replace")[-3000:] for h in HOSTS)
    assert [s.get("type") for s in states] == ["COMPLETED", "COMPLETED"], f"{states}\n{logs}"
    # Each worker ("host") ran one of the two campaigns.
    assert set().union(*(_submitted_by(stack, r) for r in run_ids)) == set(HOSTS)
    runs = [api(stack["api"], "GET", f"/flow_runs/{r}") for r in run_ids]
    starts = [datetime.fromisoformat(r["start_time"]) for r in runs]
    ends = [datetime.fromisoformat(r["end_time"]) for r in runs]
    assert max(starts) < min(ends), "the two campaigns did not run at the same time"

    first, second = (_gpu_intervals(out) for out in outs)
    assert len(first) >= 5 and len(second) >= 5  # pilot, 4 trainings, the restart check
    for a_start, a_end in first:
        for b_start, b_end in second:
            assert a_end <= b_start or b_end <= a_start, (
                f"GPU phases overlap: {a_start}..{a_end} and {b_start}..{b_end}"
            )
    assert api(stack["api"], "GET", "/v2/concurrency_limits/gpu")["active_slots"] == 0


def test_the_kubernetes_gpu_template_is_a_valid_work_pool(stack):
    """The server accepts infra/k8s/gpu-job-template.json (no cluster here: no Job is run)."""
    template = json.loads((ROOT / "infra" / "k8s" / "gpu-job-template.json").read_text())
    pool = api(
        stack["api"],
        "POST",
        "/work_pools/",
        {"name": "gpu-k8s-e2e", "type": "kubernetes", "base_job_template": template},
    )
    stored = pool["base_job_template"]
    container = stored["job_configuration"]["job_manifest"]["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "{{ gpus }}"}
    assert stored["variables"]["properties"]["gpus"]["default"] == 1
    api(stack["api"], "DELETE", "/work_pools/gpu-k8s-e2e")
    # Rendered as a worker renders it: the GPU count lands as a number, the keys in a Secret.
    from prefect.utilities.templating import apply_values

    job = apply_values(
        template["job_configuration"],
        {"gpus": 2, "name": "c", "image": "i:1", "s3_secret": "s3", "namespace": "n"},
    )
    pod = job["job_manifest"]["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": 2}
    assert pod["containers"][0]["envFrom"] == [{"secretRef": {"name": "s3"}}]
    assert "AWS_SECRET_ACCESS_KEY" not in json.dumps(template)
