"""The embedded server's lifeline and the reaping of servers an earlier killed run left."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

from gpucampaign_prefect.orchestration.embedded import (
    LIFELINE,
    PARENT_VAR,
    orphan_servers,
    reap_stale,
)


def _sleeper(parent: str) -> subprocess.Popen:
    """A stand-in server: a process in its own session whose environment names ``parent``."""
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"],
        start_new_session=True,
        env={**os.environ, PARENT_VAR: parent},
    )


def _dead_pid() -> int:
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        text=True,
        capture_output=True,
        check=True,
    )
    return int(gone.stdout)


def test_a_server_whose_campaign_run_is_gone_is_reaped_and_a_live_ones_is_not():
    host = socket.gethostname()
    orphan = _sleeper(f"{host}:{_dead_pid()}")
    ours = _sleeper(f"{host}:{os.getpid()}")  # its parent is this process: alive
    try:
        found = orphan_servers()
        assert orphan.pid in found and ours.pid not in found
        assert orphan.pid in reap_stale(wait_s=5)
        assert orphan.wait(timeout=10) == -signal.SIGTERM
        assert ours.poll() is None
    finally:
        for proc in (orphan, ours):
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)


def test_the_lifeline_stops_its_process_when_the_parent_dies():
    """A parent that starts a lifeline-wrapped module and is then SIGKILLed: the child ends."""
    code = (
        "import subprocess, sys; "
        f"p = subprocess.Popen([sys.executable, '-c', {LIFELINE!r}, str(__import__('os').getpid()),"
        " 'http.server', '0', '--bind', '127.0.0.1'], start_new_session=True,"
        " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); print(p.pid, flush=True); "
        "__import__('time').sleep(120)"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        os.kill(child, 0)  # it runs
        parent.kill()
        parent.wait(timeout=10)
        from tests.faults.test_signals import _pid_gone

        assert _pid_gone(child, within_s=5)
    finally:
        if parent.poll() is None:
            parent.kill()
        try:
            os.kill(child, signal.SIGKILL)
        except OSError:
            pass
