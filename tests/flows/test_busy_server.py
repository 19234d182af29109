"""A busy embedded server (503: two SQLite writes met) is asked again within milliseconds, not
after the Prefect client's fixed 2 s backoff that cost about 2 s at most GPU handovers."""

from __future__ import annotations

import time

import httpx
import pytest
from prefect.settings import PREFECT_CLIENT_MAX_RETRIES

from gpucampaign_prefect.orchestration import leases


def _status(code: int) -> httpx.HTTPStatusError:
    request = httpx.Request("POST", "http://127.0.0.1/api/v2/concurrency_limits/increment")
    return httpx.HTTPStatusError(
        "x", request=request, response=httpx.Response(code, request=request)
    )


def test_a_busy_answer_is_asked_again_at_once_with_the_clients_backoff_off() -> None:
    tries: list[int] = []

    def call() -> str:
        tries.append(PREFECT_CLIENT_MAX_RETRIES.value())
        if len(tries) < 3:
            raise RuntimeError("wrapped by Prefect") from _status(503)
        return "lease"

    t0 = time.monotonic()
    assert leases._soon(call) == "lease"
    assert tries == [0, 0, 0]  # each quick try without the client's own 2 s backoff
    assert time.monotonic() - t0 < 1.0


@pytest.mark.parametrize("code", [423, 500])
def test_any_other_answer_gets_prefects_own_handling_once(code: int) -> None:
    tries: list[int] = []

    def call() -> str:
        tries.append(PREFECT_CLIENT_MAX_RETRIES.value())
        if len(tries) == 1:
            raise RuntimeError("wrapped") from _status(code)
        return "lease"

    assert leases._soon(call) == "lease"
    assert tries[0] == 0 and tries[1] == PREFECT_CLIENT_MAX_RETRIES.value() > 0


def test_a_server_busy_for_the_whole_window_falls_back_to_prefects_retries(monkeypatch) -> None:
    monkeypatch.setattr(leases, "BUSY_WINDOW_S", 0.2)
    tries: list[int] = []

    def call() -> str:
        tries.append(PREFECT_CLIENT_MAX_RETRIES.value())
        if tries[-1] == 0:
            raise RuntimeError("wrapped") from _status(503)
        return "lease"

    assert leases._soon(call) == "lease"
    assert tries[-1] > 0 and set(tries[:-1]) == {0} and len(tries) >= 3
