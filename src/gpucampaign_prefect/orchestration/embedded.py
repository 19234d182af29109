"""The embedded Prefect server of ``campaign run``, started in its own session.

Prefect starts its temporary server as a child in the caller's process group, so the
terminal's Ctrl-C reaches it too and it dies while the training still needs it. Started here
first, in a new session, it only stops when the CLI stops it, after the work is saved.

A server in its own session outlives a ``campaign run`` killed without a chance to stop it
(SIGKILL, out of memory). So it runs under a lifeline: a thread in the server's own process
watches its parent and stops the server (SIGTERM, then an exit) once the parent is gone. Its
environment names the ``campaign run`` that started it (host and PID), which lets a later
``campaign run`` find and end a server whose parent died before the lifeline existed.

Its process starts early (``spawn_early``: the command Prefect would run). ``campaign run``
starts it with its first line, held (``hold``: it imports its modules on the second core while
``campaign run`` loads torch and checks the spec, and serves only once the checks pass), or
after the checks when it was not started then; ``start_detached`` adopts it once it answers, or
stops it when the settings name another server. Adopting it points this process's Prefect
settings at its URL (the global settings context, never the environment: a child process, a
rank or a restart check, inherits nothing), so this process never imports Prefect's server
modules, seconds of imports in series that the server's own process already does.
``adopted_api_url`` tells that URL from a shared server's. Nothing here imports Prefect at the
top.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

#: The environment variable of a server started here: ``<host>:<PID of its campaign run>``.
PARENT_VAR = "GPUCAMPAIGN_SERVER_PARENT"

#: Set in the environment of a server spawned to wait for the spec's checks (``spawn_early``
#: with ``hold``): it imports its modules, then serves only once it reads ``go``.
HOLD_VAR = "GPUCAMPAIGN_SERVER_HOLD"

# Runs in the server's process in place of ``python -m uvicorn``: argv[1] is the parent's PID,
# argv[2] the module to run (uvicorn), the rest its command line. A watchdog thread polls the
# parent twice a second. Held (``HOLD_VAR``), it imports the server's modules (seconds, no file
# written, no port opened) and then reads its stdin: ``go`` serves, anything else (the run was
# refused, its parent is gone: end of file) ends it.
LIFELINE = f"""\
import os, runpy, signal, sys, threading, time
parent = int(sys.argv[1])

def _watch():
    while os.getppid() == parent:
        time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGTERM)  # uvicorn's graceful stop
    time.sleep(10)
    os._exit(1)

if os.getppid() != parent:
    sys.exit(0)
threading.Thread(target=_watch, name="lifeline", daemon=True).start()
if os.environ.pop("{HOLD_VAR}", None):
    import uvicorn.main, prefect.server.api.server
    if sys.stdin.readline().strip() != "go":
        sys.exit(0)

    def _warm(api):  # the first calls of a campaign's flow, answered once before it makes them
        import json, urllib.request
        calls = [("/admin/version", None), ("/flow_runs/filter", {{"limit": 1}})]
        deadline = time.monotonic() + 60
        while calls and time.monotonic() < deadline:
            path, body = calls[0]
            data = None if body is None else json.dumps(body).encode()
            method = "POST" if data else "GET"
            request = urllib.request.Request(api + path, data=data, method=method)
            request.add_header("Content-Type", "application/json")
            try:
                urllib.request.urlopen(request, timeout=10).read()
                calls.pop(0)
            except Exception:
                time.sleep(0.05)

    port = sys.argv[sys.argv.index("--port") + 1]
    threading.Thread(target=_warm, args=(f"http://127.0.0.1:{{port}}/api",), daemon=True).start()
sys.argv = sys.argv[2:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def _lifeline_popen(args: list[str], **kw: Any) -> subprocess.Popen[Any]:
    """Popen for Prefect's server command: a new session, the lifeline, the parent's name."""
    if list(args[1:3]) == ["-m", "uvicorn"]:
        args = [args[0], "-c", LIFELINE, str(os.getpid()), "uvicorn", *args[3:]]
    env = dict(kw.pop("env", None) or os.environ)
    env[PARENT_VAR] = f"{socket.gethostname()}:{os.getpid()}"
    return subprocess.Popen(args, start_new_session=True, env=env, **kw)


@dataclass
class EarlyServer:
    """The process of a temporary server started before Prefect loads here, and its port."""

    process: subprocess.Popen[Any]
    port: int
    adopted: bool = False  # this process's Prefect API now: stopped at the interpreter's exit

    @property
    def server_process(self) -> subprocess.Popen[Any]:
        """Its process (the name Prefect's own server object gives it, for ``stop``)."""
        return self.process

    @property
    def api_url(self) -> str:
        """Its API's URL."""
        return f"http://127.0.0.1:{self.port}/api"

    def go(self) -> None:
        """Let a held server serve (the spec's checks passed); nothing for one not held."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            with contextlib.suppress(OSError):  # it ended: adopting it fails, Prefect starts one
                self.process.stdin.write(b"go\n")
                self.process.stdin.close()

    def stop(self) -> None:
        """End it and its session (not adopted: a spec refused, another server named)."""
        with contextlib.suppress(OSError):
            os.killpg(self.process.pid, signal.SIGTERM)
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def spawn_early(*, hold: bool = False) -> EarlyServer | None:
    """Start the temporary server's process now, as Prefect would start it (uvicorn serving
    ``prefect.server.api.server:create_app`` on a free local port, the UI off), under the
    lifeline; None when the environment names a server or turns the temporary one off (a
    profile that names one is found at adoption, which then stops this process).

    ``hold``: it only imports until ``EarlyServer.go`` (started before the spec's checks, it
    serves nothing and writes nothing for a run they refuse)."""
    if os.environ.get("PREFECT_API_URL") or os.environ.get(
        "PREFECT_SERVER_EPHEMERAL_ENABLED", ""
    ).lower() in ("0", "false"):
        return None
    found = importlib.util.find_spec("prefect")
    if found is None or found.origin is None:
        return None
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    args = [
        *(sys.executable, "-m", "uvicorn", "--app-dir", str(Path(found.origin).parent.parent)),
        *("--factory", "prefect.server.api.server:create_app", "--host", "127.0.0.1"),
        *("--port", str(port), "--log-level", "error", "--lifespan", "on"),
    ]
    env = {
        # No automation runs on a campaign's own temporary server (notifications need the
        # real stack: README), so its triggers and actions services stay off unless asked
        # for: they took 0.14 s of its start, which the first training step waits for.
        "PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED": "false",
        **os.environ,
        "PREFECT_UI_ENABLED": "0",
        # Prefect's own settings of its temporary server (private, no public form: the
        # environment `SubprocessASGIServer` gives uvicorn, checked against Prefect 3.9.1).
        "PREFECT__SERVER_EPHEMERAL": "1",
        "PREFECT__SERVER_FINAL": "1",
        **({HOLD_VAR: "1"} if hold else {}),
    }
    stdin = subprocess.PIPE if hold else None
    return EarlyServer(process=_lifeline_popen(args, env=env, stdin=stdin), port=port)


#: The early server this process adopted (its Prefect API), once it has.
_ADOPTED: list[EarlyServer] = []


def adopted_api_url() -> str | None:
    """The API URL of the temporary server this ``campaign run`` started and adopted (its own,
    gone with it, unlike a shared server at ``PREFECT_API_URL``); None when there is none."""
    return _ADOPTED[0].api_url if _ADOPTED else None


def adopted_server_pid() -> int | None:
    """The PID of the temporary server this process adopted; None when there is none."""
    return _ADOPTED[0].process.pid if _ADOPTED else None


#: What Prefect imports at a flow's call, when it starts its engine and serializes the flow's
#: parameters (fastapi's encoder, ~0.2 s).
FLOW_START_MODULES = (
    "prefect.utilities.visualization",
    "prefect.flow_engine",
    "prefect.task_engine",
    "fastapi.encoders",
)


def preload_flow_start() -> None:
    """Import ``FLOW_START_MODULES`` now, in this thread (the one that would import them at the
    flow's call), while ``campaign run`` waits for its server; one that is missing is left to
    the flow."""
    for name in FLOW_START_MODULES:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


def _answers(early: EarlyServer, *, timeout_s: float) -> bool:
    """Whether ``early`` answers within ``timeout_s`` (False: it ended first, a port taken
    meanwhile)."""
    # The standard library's client: an httpx client builds a TLS context first (40 ms of CPU
    # that the first training step waits for), for a plain local URL.
    import http.client

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and early.process.poll() is None:
        conn = http.client.HTTPConnection("127.0.0.1", early.port, timeout=2)
        try:
            conn.request("GET", "/api/health")
            if conn.getresponse().status == 200:
                return True
        except (OSError, http.client.HTTPException):
            pass
        finally:
            conn.close()
        time.sleep(0.05)
    return False


def _adopt(early: EarlyServer, *, timeout_s: float) -> bool:
    """Make ``early`` this process's Prefect API once it answers; it stops at the interpreter's
    exit. False (and stopped) when it never answered."""
    if not _answers(early, timeout_s=timeout_s):
        early.stop()
        return False
    import prefect.context
    from prefect.settings import PREFECT_API_URL

    # The global context, which every thread without its own settings reads; the environment
    # stays as it was, so no child process takes this server for a shared one. No public call
    # sets it (`temporary_settings` holds for one thread); checked against Prefect 3.9.1.
    current = prefect.context.SettingsContext.get()
    assert current is not None
    prefect.context.GLOBAL_SETTINGS_CONTEXT = prefect.context.SettingsContext(
        profile=current.profile,
        settings=current.settings.copy_with_update(updates={PREFECT_API_URL: early.api_url}),
    )
    early.adopted = True
    _ADOPTED[:] = [early]
    atexit.register(early.stop)  # after Prefect's own exit handlers: its last logs reach it
    return True


def require_named_server(*, fix: str) -> str | None:
    """The URL of the Prefect server the settings name (``PREFECT_API_URL``), checked to
    answer before anything is written; None when none is named (`campaign run` then starts its
    own). ``campaign deploy`` and ``campaign run`` share it.

    Raises:
        SettingError: The named server does not answer; the paragraph names it, the error,
            and ``fix``.
    """
    from prefect.client.orchestration import get_client
    from prefect.settings import (
        PREFECT_CLIENT_MAX_RETRIES,
        get_current_settings,
        temporary_settings,
    )

    from gpucampaign.core.errors import SettingError
    from gpucampaign.core.text import redact_secrets

    url = get_current_settings().api.url
    if not url:
        return None
    # One try: a server that refuses the connection is down, not busy (the client's default
    # retries waited about 12 s to say so).
    with (
        temporary_settings(updates={PREFECT_CLIENT_MAX_RETRIES: 0}),
        get_client(sync_client=True) as client,
    ):
        failed = client.api_healthcheck()
    if failed is not None:
        raise SettingError(
            f"the Prefect server at PREFECT_API_URL {redact_secrets(url)} does not answer "
            f"({redact_secrets(str(failed))[:200]}); start it, or {fix}",
            field="PREFECT_API_URL",
        )
    return str(url)


def start_detached(early: EarlyServer | None = None) -> Any | None:
    """Start Prefect's temporary server in a new session, or adopt ``early`` (when given and
    it answers: then it is returned); None when an API URL is set."""
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    if settings.api.url or not settings.server.ephemeral.enabled:
        if early is not None:
            early.stop()
        return None
    timeout_s = float(settings.server.ephemeral.startup_timeout_seconds)
    if early is not None and _adopt(early, timeout_s=timeout_s):
        return early
    # Prefect's server module loads here only when there is no early server to adopt.
    from prefect.server.api import server as server_module

    server = server_module.SubprocessASGIServer()
    if server.running:
        return server
    # The server module spawns through its own ``subprocess`` name: give it one whose Popen
    # starts a new session under the lifeline, for this start only (`SubprocessASGIServer` takes
    # no Popen of its own; checked against Prefect 3.9.1).
    real = server_module.subprocess
    server_module.subprocess = SimpleNamespace(  # type: ignore[assignment]
        Popen=_lifeline_popen, TimeoutExpired=subprocess.TimeoutExpired
    )
    try:
        server.start()
    finally:
        server_module.subprocess = real
    return server


def release(server: Any | None, *, timeout_s: float = 10.0) -> None:
    """At the end of a run in this process on an adopted early server: Prefect's events and
    logs workers send what they hold to it and stop (the server itself stops at the exit).

    A running-server events worker is one per process, bound to the URL it first read; left
    running it would send a later flow's events (another server's, in the same process) to
    this run's server.
    """
    if not getattr(server, "adopted", False):
        return
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (EventsWorker, APILogWorker):
        with contextlib.suppress(Exception):
            worker.drain_all(timeout=timeout_s, at_exit=False)


def stop(server: Any | None, *, wait: bool = True) -> None:
    """Stop the server and its session's processes (SIGTERM, then SIGKILL when not waiting)."""
    if server is None:
        return
    process = server.server_process
    if process is not None:
        with contextlib.suppress(OSError):  # its session: the server and anything it started
            os.killpg(process.pid, signal.SIGTERM if wait else signal.SIGKILL)
    server.stop()


def orphan_servers(proc: Path = Path("/proc")) -> list[int]:
    """PIDs of servers started here (on this host) whose ``campaign run`` is gone.

    A server is an orphan when its parent process is no longer the one named in its
    environment. Only processes of this user are readable; elsewhere than Linux, none.
    """
    host = socket.gethostname()
    found = []
    for entry in proc.glob("[0-9]*"):
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        marker = next((v for v in environ if v.startswith(PARENT_VAR.encode() + b"=")), None)
        if marker is None:
            continue
        named_host, _, named_pid = marker.split(b"=", 1)[1].decode().rpartition(":")
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # field 4, after the command's name
        if named_host == host and named_pid != str(ppid) and int(entry.name) != os.getpid():
            found.append(int(entry.name))
    return sorted(found)


def reap_stale(*, wait_s: float = 5.0) -> list[int]:
    """End the servers an earlier, killed ``campaign run`` left behind; returns their PIDs."""
    pids = orphan_servers()
    for pid in pids:
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGTERM)  # a session leader: its group is its session
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and any(_runs(p) for p in pids):
        time.sleep(0.1)
    for pid in pids:
        if _runs(pid):
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
    return pids


def _runs(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
