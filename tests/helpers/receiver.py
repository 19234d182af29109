"""A webhook receiver of the tests' own on 127.0.0.1, and the stack's automations pointed at
it for a while: what a notification target gets, recorded."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from tests.helpers.stack import STACK


class Receiver:
    """An HTTP server on 127.0.0.1 (a free port) that records every JSON body posted to it."""

    def __init__(self) -> None:
        got: list[dict[str, Any]] = []
        self.got = got

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                got.append(json.loads(raw or b"{}"))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def wait_for(self, pattern: str, *, timeout_s: float = 600) -> dict[str, Any]:
        """The first message whose subject matches ``pattern`` (fails after ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for message in list(self.got):
                if re.search(pattern, str(message.get("subject", ""))):
                    return message
            time.sleep(0.1)  # a look at this process's own list: the test goes on at once
        raise AssertionError(f"no message matching {pattern!r}; got {self.got}")

    def matching(self, pattern: str) -> list[dict[str, Any]]:
        """Every message so far whose subject matches ``pattern``."""
        return [m for m in list(self.got) if re.search(pattern, str(m.get("subject", "")))]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def set_automations(stack: dict[str, Any], **env: str) -> subprocess.CompletedProcess:
    """`infra/stack.sh automations` on the stack's server, as documented for a running server."""
    done = subprocess.run(
        ["bash", str(STACK), "automations"],
        env={**stack["env"], **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


@contextmanager
def notifying(stack: dict[str, Any], **env: str) -> Iterator[Receiver]:
    """A receiver, with the stack's automations pointed at it (and ``env`` added to their
    setup); the stack's own setup again afterwards (no notifications, the default window)."""
    hook = Receiver()
    try:
        done = set_automations(stack, GPUCAMPAIGN_NOTIFY_URL=hook.url, **env)
        assert "notifications go to the webhook" in done.stdout
        yield hook
    finally:
        plain = {k: v for k, v in stack["env"].items() if k != "GPUCAMPAIGN_NOTIFY_URL"}
        subprocess.run(
            ["bash", str(STACK), "automations"], env=plain, capture_output=True, timeout=300
        )
        hook.close()
