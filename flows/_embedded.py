"""The embedded Prefect server of ``campaign run``, started in its own session.

Prefect starts its temporary server as a child in the caller's process group, so the
terminal's Ctrl-C reaches it too and it dies while the training still needs it. Started here
first, in a new session, it only stops when the CLI stops it, after the work is saved.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from types import SimpleNamespace
from typing import Any

from prefect.server.api import server as server_module
from prefect.settings import get_current_settings


def start_detached() -> Any | None:
    """Start Prefect's temporary server in a new session; None when an API URL is set."""
    settings = get_current_settings()
    if settings.api.url or not settings.server.ephemeral.enabled:
        return None
    server = server_module.SubprocessASGIServer()
    if server.running:
        return server
    # The server module spawns through its own ``subprocess`` name: give it one whose Popen
    # starts a new session, for this start only.
    real = server_module.subprocess
    server_module.subprocess = SimpleNamespace(  # type: ignore[assignment]
        Popen=lambda *a, **kw: subprocess.Popen(*a, start_new_session=True, **kw),
        TimeoutExpired=subprocess.TimeoutExpired,
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
