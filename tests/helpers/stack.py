"""Helpers of the end-to-end tests on the real stack (infra/stack.sh): the Prefect REST API,
`prefect deployment run`, extra process workers on a work pool of their own, the stack's S3
server through plain boto3, the tiny example spec, and headless Chromium on the UI."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from gpucampaign.cli.scaffold import write_spec_copy

ROOT = Path(__file__).resolve().parents[2]
STACK = ROOT / "infra" / "stack.sh"
EXAMPLE = ROOT / "examples" / "digits" / "campaign.yaml"
S3_BUCKET = "gpucampaign"  # the bucket infra/s3server.py creates
RUN_TIMEOUT_S = 600
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
CHROMIUM = "/usr/bin/chromium"
SCREENSHOTS = ROOT / "tests" / "e2e" / "artifacts"  # where keep_screenshot copies them
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1000",
    "--virtual-time-budget=15000",
)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def api(base: str, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    """One call of the Prefect REST API; the decoded JSON answer (None when empty)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        base + path, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        raw = resp.read()
    return json.loads(raw) if raw else None


def tiny_spec(dest: Path, **fields: Any) -> Path:
    """The digits example cut down to a few steps, with the files it names copied beside it.

    ``fields`` replace top-level fields of the result (``storage``, ``checkpoint``, ...);
    ``control`` is merged into the cut-down control.
    """
    data = yaml.safe_load(EXAMPLE.read_text())
    data["name"] = f"{data['name']}-e2e"
    data["control"] = {**(data.get("control") or {}), "epochs": 1, "max_steps": 40}
    data["variants"] = [
        {**v, "changes": {**v.get("changes", {}), "max_steps": 40}}
        for v in data.get("variants", [])
    ]
    data["pilot"] = {**(data.get("pilot") or {}), "steps": 10}
    # No round of seeds beyond the plan: on the stack each round's runs cost minutes of CI,
    # and rounds are tested in-process (tests/flows/test_campaign.py, the quickstart).
    data["decision_point"] = {**(data.get("decision_point") or {}), "mode": "auto", "rounds": 0}
    if data.get("decision_rule"):
        # 40 steps prove the plumbing, not the model: no essential run may miss the floor.
        data["decision_rule"] = {**data["decision_rule"], "threshold": 0.2}
        data["stop_rules"] = {**(data.get("stop_rules") or {}), "quality_floor": None}
    data["control"] = {**data["control"], **fields.pop("control", {})}
    data.update(fields)
    return write_spec_copy(data, source_dir=EXAMPLE.parent, dest=dest)


def wait_flow_run(stack: dict[str, Any], flow_run_id: str) -> dict[str, Any]:
    """Poll a flow run until it reaches a terminal state (or RUN_TIMEOUT_S); its last state."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    state: dict[str, Any] = {}
    while time.monotonic() < deadline:
        state = api(stack["api"], "GET", f"/flow_runs/{flow_run_id}")["state"] or {}
        if state.get("type") in TERMINAL:
            break
        time.sleep(1)  # one GET a second: the test goes on within a second of the end
    return state


def start_deployment(
    stack: dict[str, Any], name: str, *, job_variables: dict[str, Any] | None = None, **params: Any
) -> str:
    """`prefect deployment run NAME --param k=json [--job-variable k=json]`: the flow run's id,
    without waiting for it (``job_variables``: e.g. ``{"env": {...}}``, its environment)."""
    args = ["prefect", "deployment", "run", name]
    for key, value in params.items():
        args += ["--param", f"{key}={json.dumps(value)}"]
    for key, value in (job_variables or {}).items():
        args += ["--job-variable", f"{key}={json.dumps(value)}"]
    run = subprocess.run(args, env=stack["env"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    found = re.search(r"UUID: ([0-9a-f-]{36})", run.stdout)
    assert found, run.stdout
    return found.group(1)


def run_deployment(
    stack: dict[str, Any], name: str, *, job_variables: dict[str, Any] | None = None, **params: Any
) -> tuple[str, dict[str, Any]]:
    """`start_deployment`, then wait for the flow run's terminal state (or RUN_TIMEOUT_S)."""
    flow_run_id = start_deployment(stack, name, job_variables=job_variables, **params)
    return flow_run_id, wait_flow_run(stack, flow_run_id)


def stack_s3_env(stack_dir: Path) -> dict[str, str]:
    """The AWS_* variables of the stack's S3 server, read from ``$STACK_DIR/env`` as a user
    sources them."""
    found = {}
    for line in (stack_dir / "env").read_text().splitlines():
        name, sep, value = line.removeprefix("export ").partition("=")
        if sep and name.startswith("AWS_"):
            found[name] = value
    return found


def s3_client(stack: dict[str, Any]):
    """A plain boto3 client on the stack's S3 server (path-style, as the server needs)."""
    import boto3
    from botocore.config import Config

    env = stack["env"]
    return boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name=env["AWS_DEFAULT_REGION"],
        config=Config(s3={"addressing_style": "path"}),
    )


def bucket_keys(stack: dict[str, Any], prefix: str) -> set[str]:
    """Every key under ``prefix/`` of the bucket ``gpucampaign``, without the prefix."""
    client, keys = s3_client(stack), set()
    for page in client.get_paginator("list_objects_v2").paginate(
        Bucket=S3_BUCKET, Prefix=f"{prefix}/"
    ):
        keys |= {o["Key"].removeprefix(f"{prefix}/") for o in page.get("Contents", [])}
    return keys


def create_pool(stack: dict[str, Any], pool: str) -> None:
    """A process work pool of its own, so the stack's worker never picks its runs up."""
    created = subprocess.run(
        ["prefect", "work-pool", "create", pool, "--type", "process"],
        env=stack["env"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert created.returncode == 0, created.stdout + created.stderr


def pool_deployment(stack: dict[str, Any], *, pool: str, name: str) -> str:
    """campaign/main again, as deployment ``campaign/NAME`` on the work pool ``pool``; its ID."""
    main = api(stack["api"], "GET", "/deployments/name/campaign/main")
    body = {
        key: main[key]
        for key in (
            "flow_id",
            "entrypoint",
            "path",
            "pull_steps",
            "parameters",
            "parameter_openapi_schema",
            "job_variables",
        )
    }
    return api(
        stack["api"], "POST", "/deployments/", {**body, "name": name, "work_pool_name": pool}
    )["id"]


def start_worker(stack: dict[str, Any], *, pool: str, name: str, log: Path) -> subprocess.Popen:
    """`prefect worker start` on ``pool`` (one flow run at a time), in a session of its own."""
    with log.open("ab") as sink:
        return subprocess.Popen(
            [
                "prefect",
                "worker",
                "start",
                "--pool",
                pool,
                "--type",
                "process",
                "--name",
                name,
                "--limit",
                "1",
            ],
            cwd=ROOT,
            env=stack["env"],
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def stop_worker(proc: subprocess.Popen) -> None:
    """Stop a worker of ``start_worker``: SIGINT to its group, SIGKILL after 30 s."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def worker_log(stack: dict[str, Any], name: str = "worker.log") -> str:
    """The tail of a log of the stack folder, for an assertion message."""
    path = stack["dir"] / name
    return path.read_text(errors="replace")[-6000:] if path.exists() else f"({name} missing)"


def page_text(dom: str) -> str:
    """The visible text of a dumped DOM: scripts and styles dropped, tags removed, spaces joined."""
    dom = re.sub(r"<(script|style)\b.*?</\1>", " ", dom, flags=re.S | re.I)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", dom))).strip()


def keep_screenshot(shot: Path) -> Path:
    """A copy of a screenshot that outlives the test: in $OUT when that is set, else in
    tests/e2e/artifacts/ (ignored by git)."""
    dest_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else SCREENSHOTS
    dest_dir.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy2(shot, dest_dir / shot.name))


def chromium(url: str, *, dump_dom: bool = False, screenshot: Path | None = None) -> str:
    """Open URL in headless Chromium with a throwaway profile; the DOM text (or '')."""
    profile = tempfile.mkdtemp(prefix="gpucampaign-chromium-")
    try:
        args = [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}"]
        if screenshot is not None:
            args.append(f"--screenshot={screenshot}")
        if dump_dom:
            args.append("--dump-dom")
        done = subprocess.run(args + [url], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"chromium failed on {url}:\n{done.stderr[-3000:]}"
        return page_text(done.stdout) if dump_dom else ""
    finally:
        shutil.rmtree(profile, ignore_errors=True)
