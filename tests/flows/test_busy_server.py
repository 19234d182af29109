"""A busy Prefect server (503: on the embedded one, two SQLite writes met) is asked again for a
slot within milliseconds, not after the Prefect client's fixed 2 s backoff, which cost about 2 s
at most GPU handovers; an answer the quick try does not expect goes to Prefect's own call."""

from __future__ import annotations

import time
import uuid

import httpx
import pytest
from prefect.client.orchestration import get_client

from gpucampaign_prefect.orchestration.gpu_lock import ensure_gpu_limit
from gpucampaign_prefect.orchestration.leases import acquire_slots, release_slots, try_slot

pytestmark = pytest.mark.usefixtures("prefect_harness")

_PATH = "/api/v2/concurrency_limits/increment-with-lease"


def _answer_first(monkeypatch: pytest.MonkeyPatch, code: int, times: int) -> list[int]:
    """The server's first ``times`` slot requests are answered ``code`` (by the transports of
    both the sync and the async client, Prefect's service uses the latter); the list of the
    slot requests' answers, filled as they come."""
    answers: list[int] = []

    def answer(request: httpx.Request) -> httpx.Response | None:
        if request.url.path != _PATH:
            return None
        if sum(1 for a in answers if a == code) < times:
            answers.append(code)
            return httpx.Response(code, json={"exception_message": "busy"}, request=request)
        return None

    def heard(request: httpx.Request, response: httpx.Response) -> httpx.Response:
        if request.url.path == _PATH:
            answers.append(response.status_code)
        return response

    sync_send = httpx.HTTPTransport.handle_request
    async_send = httpx.AsyncHTTPTransport.handle_async_request

    def handle(self: httpx.HTTPTransport, request: httpx.Request) -> httpx.Response:
        canned = answer(request)
        if canned is not None:
            return canned
        return heard(request, sync_send(self, request))

    async def handle_async(self: httpx.AsyncHTTPTransport, request: httpx.Request):
        canned = answer(request)
        if canned is not None:
            return canned
        return heard(request, await async_send(self, request))

    monkeypatch.setattr(httpx.HTTPTransport, "handle_request", handle)
    monkeypatch.setattr(httpx.AsyncHTTPTransport, "handle_async_request", handle_async)
    return answers


def _active(name: str) -> int:
    with get_client(sync_client=True) as client:
        return client.read_global_concurrency_limit_by_name(name).active_slots


@pytest.mark.parametrize("take", ["acquire_slots", "try_slot"])
def test_a_busy_server_is_asked_again_at_once(monkeypatch: pytest.MonkeyPatch, take: str) -> None:
    name = f"test-busy-{uuid.uuid4().hex[:8]}"
    ensure_gpu_limit(name, 1, clear_stale=False)
    answers = _answer_first(monkeypatch, 503, times=2)
    t0 = time.monotonic()
    if take == "acquire_slots":
        lease = acquire_slots(name, slots=1, timeout_s=30, lease_s=60)
    else:
        lease = try_slot(name, lease_s=60)
    took = time.monotonic() - t0
    assert answers == [503, 503, 200]
    assert took < 1.5, f"{took:.2f} s: the client's 2 s backoff ran"  # Prefect's: 2 s, then 4
    assert _active(name) == 1
    release_slots(lease)
    assert _active(name) == 0


def test_an_unexpected_answer_goes_to_prefects_own_call(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"test-busy-{uuid.uuid4().hex[:8]}"
    ensure_gpu_limit(name, 1, clear_stale=False)
    answers = _answer_first(monkeypatch, 500, times=1)
    lease = acquire_slots(name, slots=1, timeout_s=30, lease_s=60)
    assert answers == [500, 200]  # the quick try's 500, then Prefect's call, granted
    assert _active(name) == 1
    release_slots(lease)
    assert _active(name) == 0
