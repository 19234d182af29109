"""The embedded Prefect server of ``campaign run``, started in its own session.

Prefect starts its temporary server as a child in the caller's process group, so the
terminal's Ctrl-C reaches it too and it dies while the training still needs it. Started here
first, in a new session, it only stops when the CLI stops it, after the work is saved.

A server in its own session outlives a ``campaign run`` killed without a chance to stop it
(SIGKILL, out of memory). So it runs under a lifeline: a thread in the server's own process
watches its parent and stops the server (SIGTERM, then an exit) once the parent is gone. Its
environment names the ``campaign run`` that started it (host and PID), which lets a later
``campaign run`` find and end a server whose parent died before the lifeline existed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from prefect.server.api import server as server_module
from prefect.settings import get_current_settings

#: The environment variable of a server started here: ``<host>:<PID of its campaign run>``.
PARENT_VAR = "GPUCAMPAIGN_SERVER_PARENT"

# Runs in the server's process in place of ``python -m uvicorn``: argv[1] is the parent's PID,
# argv[2] the module to run (uvicorn), the rest its command line. A watchdog thread polls the
# parent twice a second.
LIFELINE = """\
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


def start_detached() -> Any | None:
    """Start Prefect's temporary server in a new session; None when an API URL is set."""
    settings = get_current_settings()
    if settings.api.url or not settings.server.ephemeral.enabled:
        return None
    server = server_module.SubprocessASGIServer()
    if server.running:
        return server
    # The server module spawns through its own ``subprocess`` name: give it one whose Popen
    # starts a new session under the lifeline, for this start only.
    real = server_module.subprocess
    server_module.subprocess = SimpleNamespace(  # type: ignore[assignment]
        Popen=_lifeline_popen, TimeoutExpired=subprocess.TimeoutExpired
    )
    try:
        server.start()
    finally:
        server_module.subprocess = real
    return server


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
