"""End to end on the real stack: Prefect server + worker started by infra/stack.sh, the
deployments of deployments/prefect.yaml, and `prefect deployment run campaign/main` (tracked to
the stack's MLflow server through a URI whose password holds a quote: it leaks nowhere).

Takes a few minutes on 2 cores (server start, deploy, worker, one tiny campaign). The stack
and the campaign are session fixtures (conftest.py), shared with the other tests here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpucampaign.config import load_spec
from gpucampaign.folder.layout import (
    CHECKPOINT_LATEST,
    CHECKPOINT_META,
    CHECKPOINT_STATE,
    WEIGHTS_FILE,
)
from gpucampaign.storage.mirror import MIRROR_INDEX
from tests.helpers import ROOT, S3_BUCKET, api, bucket_keys, run_deployment, s3_client, worker_log
from tests.helpers.leaks import (
    NO_SERVER,
    file_leaks,
    leaked,
    mlflow_leaks,
    plain_tracking_uri,
    prefect_leaks,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]


def test_scheduled_restart_verification_is_deployed(stack):
    dep = api(stack["api"], "GET", "/deployments/name/restart-verification/scheduled")
    schedules = dep["schedules"]
    assert [s["schedule"].get("cron") for s in schedules] == ["0 */6 * * *"]
    assert schedules[0]["active"] is True
    assert dep["parameters"] == {"out": "out/campaign"}
    assert dep["work_pool_name"] == "gpucampaign"
    # This stack is throwaway: no scheduled check may fire into the repo while the test runs.
    api(
        stack["api"],
        "PATCH",
        f"/deployments/{dep['id']}/schedules/{schedules[0]['id']}",
        {"active": False},
    )


def test_server_runs_on_postgresql(stack):
    pid = int((stack["dir"] / "postgres.pid").read_text())
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    assert "postgres" in cmdline and "listen_addresses=127.0.0.1" in cmdline
    server_pid = int((stack["dir"] / "server.pid").read_text())
    assert api(stack["api"], "GET", "/health") is True
    # The server has no SQLite database: everything it stores goes to PostgreSQL.
    assert not list((stack["dir"] / "prefect-home").glob("*.db"))
    password = (stack["dir"] / "postgres.password").read_text().strip()
    assert len(password) >= 32
    assert (stack["dir"] / "postgres.password").stat().st_mode & 0o777 == 0o600
    env_file = stack["dir"] / "env"
    assert env_file.stat().st_mode & 0o777 == 0o600
    assert password not in env_file.read_text()
    # Only the server knows the database URL; the worker and its flow runs never see it.
    server_env = Path(f"/proc/{server_pid}/environ").read_bytes().split(b"\0")
    assert any(
        e.startswith(b"PREFECT_SERVER_DATABASE_CONNECTION_URL=postgresql+asyncpg://")
        for e in server_env
    )
    worker_pid = int((stack["dir"] / "worker.pid").read_text())
    assert password.encode() not in Path(f"/proc/{worker_pid}/environ").read_bytes()


def test_gpu_limit_and_main_deployment(stack):
    limit = api(stack["api"], "GET", "/v2/concurrency_limits/gpu")
    assert (limit["limit"], limit["active_slots"]) == (1, 0)
    dep = api(stack["api"], "GET", "/deployments/name/campaign/main")
    assert dep["entrypoint"] == "gpucampaign_prefect.flows.campaign:campaign"
    assert dep["parameters"] == {"spec": "examples/digits/campaign.yaml", "out": "out/campaign"}
    step = dep["pull_steps"][0]["prefect.deployments.steps.set_working_directory"]
    assert step["directory"] == str(ROOT)


def test_deployment_run_completes_with_outputs(stack, finished_campaign):
    flow_run_id, state, out = (finished_campaign[k] for k in ("id", "state", "out"))
    assert state.get("type") == "COMPLETED", (
        f"flow run {flow_run_id} ended {state.get('type')}: {state.get('message')}\n"
        f"--- worker.log (tail) ---\n{worker_log(stack)}"
    )
    manifest = json.loads((out / "manifest.json").read_text())
    # One seed a side and no round of seeds beyond the plan (tiny_spec): any decision kind.
    assert manifest["verdict"]["kind"] in {"adopt", "inconclusive", "negative"}
    assert set(r["status"] for r in manifest["runs"].values()) == {"completed"}
    assert (out / "report.md").is_file()
    # The GPU lock was taken and given back.
    assert api(stack["api"], "GET", "/v2/concurrency_limits/gpu")["active_slots"] == 0
    prefix = finished_campaign["prefix"]
    control = load_spec(finished_campaign["spec"]).resolve_run("control").run_id
    _assert_in_the_bucket(stack, prefix=prefix, manifest=manifest, control=control)
    _assert_no_secret_anywhere(stack, flow_run_id=flow_run_id, out=out)

    # The scheduled restart check, run now on this output (a fresh copy retrieved from the
    # bucket, its checkpoints read from there): every run resumes exactly ...
    check_id, check = run_deployment(stack, "restart-verification/scheduled", out=str(out), steps=5)
    assert check.get("type") == "COMPLETED", (
        f"restart check {check_id} ended {check.get('type')}: "
        f"{check.get('message')}\n{worker_log(stack)}"
    )
    # ... and fails loudly once the checkpoints are gone from the bucket.
    client = s3_client(stack)
    for rid in manifest["runs"]:
        for key in bucket_keys(stack, f"{prefix}/{rid}"):
            client.delete_object(Bucket=S3_BUCKET, Key=f"{prefix}/{rid}/{key}")
    _, failed = run_deployment(stack, "restart-verification/scheduled", out=str(out))
    assert failed.get("type") == "FAILED"
    assert "no_usable_restart" in (failed.get("message") or "")


def _assert_no_secret_anywhere(stack, *, flow_run_id: str, out: Path) -> None:
    """The campaign ran with ``MLFLOW_TRACKING_URI=http://alice:Pw'...@host`` (a quote in the
    password): the worker's terminal, every file of the output folder, the flow run's Prefect
    records (states, task runs, logs, artifacts) and every MLflow record hold it nowhere."""
    leaks = [f"worker.log: {line}" for line in _worker_lines(stack) if leaked(line)]
    leaks += file_leaks(out)
    leaks += prefect_leaks(stack["api"], flow_run_id)
    uri = plain_tracking_uri(stack)
    if uri != NO_SERVER:
        found, n_runs = mlflow_leaks(uri)
        leaks += found
        # The campaign reached the server through the URI that holds the password.
        assert n_runs >= 1, f"no campaign tracked to {uri}"
    assert leaks == [], "\n".join(leaks[:10])


def _worker_lines(stack) -> list[str]:
    path = stack["dir"] / "worker.log"
    return path.read_text(errors="replace").splitlines() if path.exists() else []


def _assert_in_the_bucket(stack, *, prefix: str, manifest: dict, control: str) -> None:
    """Checked with plain boto3: the checkpoints (every file of the one LATEST names) and the
    mirrored output folder are under the campaign's prefix."""
    # The stack's worker (and so its flow runs) got the S3 server's variables from stack.sh.
    worker_pid = int((stack["dir"] / "worker.pid").read_text())
    environ = Path(f"/proc/{worker_pid}/environ").read_bytes().split(b"\0")
    endpoint = f"AWS_ENDPOINT_URL={stack['env']['AWS_ENDPOINT_URL']}".encode()
    assert endpoint in environ
    assert any(e.startswith(b"AWS_SECRET_ACCESS_KEY=") for e in environ)

    keys = bucket_keys(stack, prefix)
    client = s3_client(stack)
    for rid in manifest["runs"]:
        body = client.get_object(Bucket=S3_BUCKET, Key=f"{prefix}/{rid}/{CHECKPOINT_LATEST}")[
            "Body"
        ]
        latest = json.loads(body.read())
        step_dir = f"{rid}/step-{latest['step']:09d}"
        assert {
            f"{step_dir}/{n}" for n in (WEIGHTS_FILE, CHECKPOINT_STATE, CHECKPOINT_META)
        } <= keys, rid
    assert f"{control}/{CHECKPOINT_LATEST}" in keys
    # The mirrored output folder: every file the manifest lists, the manifest and its index.
    assert {"manifest.json", MIRROR_INDEX, "report.md", "RELOAD.md"} <= keys
    assert {f["path"] for f in manifest["files"]} <= keys
