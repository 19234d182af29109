"""The webhook's secret stays a secret in Prefect: the notification block that
``infra/automations.py`` makes keeps the URL's authorizing part (a path token, a query token,
user:password) in its secret field, so the block as the UI and ``prefect block inspect`` read
it (without secrets) never shows it, while a notification sent through it still reaches the
whole URL.

Each credential form goes through ``automations.main`` against the test server, as
``infra/stack.sh automations`` runs it; the block is then read back the ways a person can.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import httpx
import pytest

from infra import automations

SECRET = "canary-hook-7f3a9c21"
#: Credential forms of a webhook URL ({port}: the test receiver's), each with its secret part.
FORMS = {
    "path token": "http://127.0.0.1:{port}/services/T0/B1/" + SECRET,
    "query token": "http://127.0.0.1:{port}/hook?token=" + SECRET,
    "access_token query": "http://127.0.0.1:{port}/hook?x=1&access_token=" + SECRET,
    "user:password": "http://alice:" + SECRET + "@127.0.0.1:{port}/hook",
    "token-only userinfo": "http://" + SECRET + "@127.0.0.1:{port}/hook",
}


@pytest.fixture
def receiver() -> Iterator[dict[str, Any]]:
    """A webhook receiver on 127.0.0.1 that records each request's path and JSON body."""
    got: list[tuple[str, dict[str, Any], str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            got.append((self.path, json.loads(raw or b"{}"), self.headers.get("Authorization")))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            return

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield {"port": server.server_port, "got": got}
    finally:
        server.shutdown()
        server.server_close()


def _api() -> str:
    from prefect.settings import PREFECT_API_URL

    return str(PREFECT_API_URL.value())


def _reads_without_secrets(block_id: str) -> dict[str, str]:
    """The block document as the UI's Blocks pages, the client and the API read it."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        by_name = client.read_block_document_by_name(
            automations.BLOCK_NAME, block_type_slug="custom-webhook", include_secrets=False
        )
        by_id = client.read_block_document(by_name.id, include_secrets=False)
        hooks = [
            a.model_dump_json()
            for a in client.read_automations()
            if a.name.startswith(automations.PREFIX)
        ]
    assert str(by_name.id) == block_id
    with httpx.Client(base_url=_api()) as http:
        page = http.get(f"/block_documents/{block_id}").text  # the UI's block page
        listed = http.post("/block_documents/filter", json={}).text  # the UI's Blocks list
    return {
        "client by name": by_name.model_dump_json(),
        "client by id": by_id.model_dump_json(),
        "API block page": page,
        "API blocks list": listed,
        "automations": "\n".join(hooks),
    }


def _inspect(block: str) -> str:
    """``prefect block inspect`` and its JSON form, as a person runs them."""
    env = {**os.environ, "PREFECT_API_URL": _api()}
    said = []
    for extra in ([], ["-o", "json"]):
        done = subprocess.run(
            [sys.executable, "-m", "prefect", "block", "inspect", block, *extra],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        said.append(done.stdout + done.stderr)
    return "\n".join(said)


def test_the_webhooks_secret_is_in_the_blocks_secret_field(
    prefect_harness, receiver, monkeypatch, capsys, faults
):
    from prefect.blocks.notifications import CustomWebhookNotificationBlock

    monkeypatch.setenv("PREFECT_API_URL", _api())
    leaks: list[str] = []
    for form, pattern in FORMS.items():
        url = pattern.format(port=receiver["port"])
        faults.add("credential_forms_tried")
        assert automations.main(["--notify-url", url]) == 0
        said = capsys.readouterr()
        assert "notifications go to the webhook" in said.out
        leaks += [f"{form}: automations' output"] * (SECRET in said.out + said.err)
        loaded = CustomWebhookNotificationBlock.load(automations.BLOCK_NAME)
        block_id = str(loaded._block_document_id)
        reads = _reads_without_secrets(block_id)
        leaks += [f"{form}: {where}" for where, text in reads.items() if SECRET in text]
        assert block_id in reads["automations"]  # the notifying automations send through it
        assert "127.0.0.1" in reads["client by name"]  # where it goes stays in sight
        if form == "user:password":
            leaks += [f"{form}: prefect block inspect"] * (
                SECRET in _inspect("custom-webhook/" + automations.BLOCK_NAME)
            )
        # Delivery: the block as the server's automation loads it (with its secrets) posts
        # to the whole URL.
        receiver["got"].clear()
        loaded.notify(body="the body", subject="the subject")
        ((path, body, auth),) = receiver["got"]
        assert body == {"subject": "the subject", "body": "the body"}
        sent = path + " " + (base64.b64decode(auth.split()[1]).decode() if auth else "")
        assert SECRET in sent, (form, sent)  # in the path, the query or the basic auth
    faults.add("secrets_leaked", len(leaks))
    assert leaks == []


@pytest.mark.parametrize("url", ["ftp://" + SECRET, SECRET, "https://", "http:///" + SECRET])
def test_a_webhook_url_that_is_not_one_is_refused_without_echoing_it(url, capsys, faults):
    faults.add("credential_forms_tried")
    with pytest.raises(SystemExit) as exc:
        automations.split_webhook_url(url)
    said = capsys.readouterr()
    assert exc.value.code == 2 and "GPUCAMPAIGN_NOTIFY_URL" in said.err
    faults.add("secrets_leaked", (said.out + said.err).count(SECRET))
    assert SECRET not in said.out + said.err and "Traceback" not in said.err
