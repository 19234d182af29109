"""The MLflow tracking server of the stack and of the tests: ``mlflow server`` (PyPI ``mlflow``,
the ``tracking`` extra) on 127.0.0.1, its backend a database (the stack's PostgreSQL), its
artifacts proxied by the server (``--serve-artifacts``) to a destination (the stack's S3
bucket), so clients need no S3 keys.

The backend URI (it holds the database password) reaches the server through its environment
(``MLFLOW_BACKEND_STORE_URI``), never its command line. An S3 destination takes the endpoint
from ``MLFLOW_S3_ENDPOINT_URL`` (else ``AWS_ENDPOINT_URL``) and the keys from ``AWS_*``. The
server runs in its own session (``stop`` ends its worker processes too); ready means
``/health`` answers. The port picked at the first start is recorded in ``DIR/mlflowport`` and
reused by every later start, so ``MLFLOW_TRACKING_URI`` stays valid across a restart.

Use from Python (tests)::

    server = start_server(Path(tmp), backend="sqlite:///...", artifacts="/tmp/x")
    server.uri ...
    stop_server(Path(tmp))

or as a script (``infra/stack.sh``)::

    MLFLOW_BACKEND_STORE_URI=postgresql://... python infra/mlflowserver.py start DIR \\
        --artifacts s3://gpucampaign/mlflow      # prints: export MLFLOW_TRACKING_URI=...
    python infra/mlflowserver.py status DIR
    python infra/mlflowserver.py stop DIR
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

HOST = "127.0.0.1"
STATE_FILE = "mlflow.json"
PORT_FILE = "mlflowport"
LOG_FILE = "mlflow.log"
READY_TIMEOUT_S = 180.0


@dataclass
class MlflowServer:
    """A running tracking server."""

    pid: int
    port: int

    @property
    def uri(self) -> str:
        return f"http://{HOST}:{self.port}"


def mlflow_binary() -> str:
    """The ``mlflow`` script beside this interpreter (the venv's), else the one on PATH."""
    beside = Path(sys.executable).parent / "mlflow"
    if beside.exists():
        return str(beside)
    return "mlflow"


def command(*, port: int, artifacts: str) -> list[str]:
    """The server's command line (the backend comes through the environment)."""
    return [
        mlflow_binary(),
        "server",
        "--host",
        HOST,
        "--port",
        str(port),
        "--serve-artifacts",
        "--artifacts-destination",
        artifacts,
        "--workers",
        "1",
    ]


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def healthy(uri: str) -> bool:
    """True when the server's ``/health`` answers."""
    try:
        with urllib.request.urlopen(f"{uri}/health", timeout=3) as resp:
            return resp.status == 200
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # a zombie child of ours is gone for our purpose
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().split(") ")[-1][:1] != "Z"
    except OSError:
        return True


def load_server(root: Path) -> MlflowServer | None:
    """The server recorded in ``root``, if it still runs."""
    try:
        state = json.loads((root / STATE_FILE).read_text(encoding="utf-8"))
        server = MlflowServer(pid=int(state["pid"]), port=int(state["port"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return server if _alive(server.pid) else None


def start_server(
    root: Path,
    *,
    backend: str | None = None,
    artifacts: str,
    port: int | None = None,
    timeout_s: float = READY_TIMEOUT_S,
    env: dict[str, str] | None = None,
) -> MlflowServer:
    """Start the server (or return the one running) and wait until ``/health`` answers.

    Args:
        root: Its folder: PID, port, log.
        backend: The backend store URI; None: ``MLFLOW_BACKEND_STORE_URI`` from the environment.
        artifacts: The artifacts destination (``s3://bucket/prefix`` or a local folder).
        port: The port; None: the recorded one when free, else a free one.
        timeout_s: Longest wait for ``/health``.
        env: More environment for the server (the S3 endpoint and keys of the destination).
    """
    root.mkdir(parents=True, exist_ok=True)
    running = load_server(root)
    if running is not None:
        return running
    if port is None:
        try:
            port = int((root / PORT_FILE).read_text().strip())
        except (OSError, ValueError):
            port = None
        if port is None or not _port_free(port):
            port = _free_port()
    (root / PORT_FILE).write_text(f"{port}\n")
    env = {**os.environ, **(env or {})}
    if backend is not None:
        env["MLFLOW_BACKEND_STORE_URI"] = backend
    if "MLFLOW_BACKEND_STORE_URI" not in env:
        raise SystemExit("mlflowserver: no backend: set MLFLOW_BACKEND_STORE_URI")
    if env.get("AWS_ENDPOINT_URL") and not env.get("MLFLOW_S3_ENDPOINT_URL"):
        env["MLFLOW_S3_ENDPOINT_URL"] = env["AWS_ENDPOINT_URL"]
    # The job runner (GenAI evaluation jobs, eight more processes) has nothing to do here.
    env.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    env.setdefault("MLFLOW_ENABLE_TELEMETRY", "false")
    env.setdefault("DO_NOT_TRACK", "1")
    log = open(root / LOG_FILE, "ab")  # noqa: SIM115 - the child holds it
    proc = subprocess.Popen(
        command(port=port, artifacts=artifacts),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    log.close()
    server = MlflowServer(pid=proc.pid, port=port)
    (root / STATE_FILE).write_text(json.dumps({"pid": proc.pid, "port": port}))
    deadline = time.monotonic() + timeout_s
    while not healthy(server.uri):
        if proc.poll() is not None:
            raise SystemExit(f"mlflowserver: the server exited (see {root / LOG_FILE})")
        if time.monotonic() > deadline:
            stop_server(root)
            raise SystemExit(f"mlflowserver: no answer after {timeout_s:.0f}s ({root / LOG_FILE})")
        time.sleep(0.5)
    return server


def stop_server(root: Path, *, grace_s: float = 20.0) -> bool:
    """Stop the recorded server and its workers (SIGTERM to its group, SIGKILL after
    ``grace_s``). Returns False when none ran."""
    server = load_server(root)
    (root / STATE_FILE).unlink(missing_ok=True)
    if server is None:
        return False
    try:
        os.killpg(server.pid, signal.SIGTERM)
    except OSError:
        return False
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.killpg(server.pid, 0)
        except OSError:
            break
        try:  # reap it when it is our child (a test), so it does not linger as a zombie
            os.waitpid(server.pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.2)
    else:
        try:
            os.killpg(server.pid, signal.SIGKILL)
        except OSError:
            pass
    return True


def _main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python infra/mlflowserver.py")
    p.add_argument("cmd", choices=["start", "stop", "status"])
    p.add_argument("dir", type=Path)
    p.add_argument("--artifacts", default=None, help="artifacts destination (start)")
    a = p.parse_args(argv)
    root = a.dir.resolve()
    if a.cmd == "start":
        if not a.artifacts:
            p.error("start needs --artifacts")
        server = start_server(root, artifacts=a.artifacts)
        print(f"export MLFLOW_TRACKING_URI={server.uri}")
        return 0
    if a.cmd == "stop":
        return 0 if stop_server(root) else 1
    server = load_server(root)
    if server is None or not healthy(server.uri):
        return 1
    print(f"at {server.uri} (pid {server.pid})")
    return 0


if __name__ == "__main__":
    sys.exit(_main())
