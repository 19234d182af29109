"""Reads of the S3 store ride out an outage: retried with backoff while the store does not
answer, said once, and given up only when ``storage.read_wait_s`` has passed, with a message
that says the campaign resumes when run again. Writes never wait (the spool takes them)."""

from __future__ import annotations

import hashlib
import logging
from datetime import UTC, datetime, timedelta

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from gpucampaign.checkpoint.manager import CheckpointManager
from gpucampaign.config import parse_spec
from gpucampaign.storage import S3Store, StorageError, StoreUnreachable, check_storage
from gpucampaign.storage.open import open_store, read_wait_s
from gpucampaign.storage.outage import OUTAGE_LOGGER, Outages
from gpucampaign.storage.readwait import ReadWait
from gpucampaign.storage.s3 import is_transient
from tests.helpers import TRAIN_CONTROL, one_lot_spec

BODY = b'{"step": 20, "meta_sha256": "' + b"0" * 64 + b'"}'


class Clock:
    """Monotonic time that moves only when slept."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


class OutageS3:
    """The client calls of a read, refused (as by a stopped server) until ``down_until``
    seconds of the clock have passed; ``code`` makes it answer an S3 error instead."""

    class meta:  # noqa: N801 - boto3's attribute name
        endpoint_url = "http://127.0.0.1:9"

    def __init__(self, clock: Clock, *, down_until: float, code: str | None = None) -> None:
        self.clock, self.down_until, self.code = clock, down_until, code
        self.calls = 0

    def _gate(self) -> None:
        self.calls += 1
        if self.clock.now < self.down_until:
            if self.code:
                raise ClientError({"Error": {"Code": self.code, "Message": "no"}}, "HeadObject")
            raise EndpointConnectionError(endpoint_url=self.meta.endpoint_url)

    def head_object(self, **_: object) -> dict[str, object]:
        self._gate()
        meta = {"sha256": hashlib.sha256(BODY).hexdigest(), "size": str(len(BODY))}
        return {"ContentLength": len(BODY), "Metadata": meta}

    def download_fileobj(self, *, Fileobj, **_: object) -> None:  # noqa: N803
        self._gate()
        Fileobj.seek(0)
        Fileobj.write(BODY)


def _store(clock: Clock, client: OutageS3, *, wait_s: float) -> S3Store:
    store = S3Store("s3://bucket/camp", client=client, read_wait_s=wait_s)
    store._reads._sleep, store._reads._clock = clock.sleep, lambda: clock.now  # noqa: SLF001
    store._reads.outages = Outages(clock=lambda: clock.now)  # noqa: SLF001
    return store


def test_a_read_waits_out_an_outage_and_says_so_once(caplog) -> None:
    clock = Clock()
    client = OutageS3(clock, down_until=30.0)  # a 30 s outage
    store = _store(clock, client, wait_s=900)
    with caplog.at_level(logging.WARNING, logger=OUTAGE_LOGGER):
        assert store.read_bytes("control-0123456789/LATEST") == BODY
    # Backoff 1, 2, 4, 8, 16 s: answered on the first try after the outage ended.
    assert clock.slept == [1, 2, 4, 8, 16] and 30 <= clock.now < 60
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2, said
    assert "does not answer" in said[0] and "control-0123456789/LATEST" in said[0]
    assert "15 min" in said[0] and "storage.read_wait_s" in said[0]
    assert "answers again after 31 s" in said[1]


def test_past_the_bound_the_read_stops_with_what_to_do() -> None:
    clock = Clock()
    store = _store(clock, OutageS3(clock, down_until=10_000), wait_s=120)
    with pytest.raises(StoreUnreachable) as err:
        store.read_bytes("control-0123456789/LATEST")
    assert clock.now == pytest.approx(120)
    text = str(err.value)
    assert "did not answer for 2 min (storage.read_wait_s)" in text
    assert "cannot reach the S3 endpoint" in text and "run the same campaign again" in text
    # A checkpoint that cannot be read for an outage is not refused for an older one.
    manager = CheckpointManager(store, run_id="control-0123456789", config_sha256="ab" * 32)
    with pytest.raises(StoreUnreachable):
        manager.load_latest()


@pytest.mark.parametrize("code", ["ServiceUnavailable", "SlowDown", "InternalError"])
def test_a_server_that_answers_busy_is_waited_for(code: str) -> None:
    clock = Clock()
    store = _store(clock, OutageS3(clock, down_until=5, code=code), wait_s=60)
    assert store.exists("k") and store.size("k") == len(BODY)


@pytest.mark.parametrize("code", ["AccessDenied", "NoSuchBucket"])
def test_a_refusal_is_not_waited_for(code: str) -> None:
    clock = Clock()
    store = _store(clock, OutageS3(clock, down_until=5, code=code), wait_s=600)
    with pytest.raises(StorageError) as err:
        store.read_bytes("k")
    assert not isinstance(err.value, StoreUnreachable) and not is_transient(err.value)
    assert clock.slept == []


def test_no_bound_fails_at_once_as_before() -> None:
    """``read_wait_s: 0``, the preflight's probe and ``campaign status``: no waiting."""
    clock = Clock()
    client = OutageS3(clock, down_until=5)
    with pytest.raises(StorageError, match="cannot reach the S3 endpoint") as err:
        _store(clock, client, wait_s=0).read_bytes("k")
    assert not isinstance(err.value, StoreUnreachable) and clock.slept == []
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "k"}
    env |= {"AWS_SECRET_ACCESS_KEY": "s", "GPUCAMPAIGN_S3_CONNECT_TIMEOUT_S": "0.5"}
    store = open_store("s3://bucket/p", out=".", env=env, spool=False, read_wait_s=0)
    assert store._reads.bound_s == 0  # type: ignore[attr-defined]  # noqa: SLF001
    with pytest.raises(Exception, match="not usable"):
        check_storage("s3://bucket/p", env=env)


def test_the_bound_comes_from_the_spec_and_stops_at_the_rental_end() -> None:
    spec = one_lot_spec(TRAIN_CONTROL)
    assert read_wait_s(spec) == 900  # the default
    data = spec.model_dump(mode="json", exclude_none=True)
    data["storage"] = {"url": "s3://bucket/p", "read_wait_s": 3600}
    start = datetime(2026, 3, 1, 0, 0, tzinfo=UTC)
    data["packages"][0]["starts_at"] = start.isoformat()
    dated = parse_spec(data)
    assert read_wait_s(dated, now=start) == 3600
    end = start + timedelta(days=3)
    assert read_wait_s(dated, now=end - timedelta(minutes=10)) == pytest.approx(600)
    assert read_wait_s(dated, now=end + timedelta(hours=1)) == 0
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "k"}
    env |= {"AWS_SECRET_ACCESS_KEY": "s"}
    store = open_store("s3://bucket/p", out=".", env=env, read_wait_s=42)
    assert store.remote._reads.bound_s == 42  # type: ignore[attr-defined]  # noqa: SLF001
    with pytest.raises(Exception, match="read_wait_s"):
        parse_spec({**data, "storage": {"url": "s3://bucket/p", "read_wait_s": -1}})


def test_read_wait_alone_is_bounded_and_passes_values_through() -> None:
    clock = Clock()
    wait = ReadWait("s3://b", bound_s=10, transient=lambda e: True, sleep=clock.sleep)
    wait._clock = lambda: clock.now  # noqa: SLF001
    assert wait.run("x", lambda: 7) == 7 and clock.slept == []


def test_a_campaigns_start_waits_out_a_store_that_does_not_answer(caplog, monkeypatch) -> None:
    """S3 frozen while a run starts (issue 45): the start's probe of the store waits for it,
    said once, up to ``read_wait_s``, then ends in one paragraph that says nothing is lost;
    ``campaign plan``'s probe (no wait) fails at once."""
    from gpucampaign.core.clock import DrivenClock, use_clock
    from gpucampaign.core.errors import SpecError
    from gpucampaign.storage import NoAnswer
    from gpucampaign.storage import open as opening

    class FrozenStore(S3Store):
        """A store whose probe times out (a frozen server) until ``answers_at`` seconds."""

        answers_at = 30.0
        tries = 0

        def check(self) -> None:
            FrozenStore.tries += 1
            if driven.monotonic() < self.answers_at:
                raise NoAnswer("cannot write s3://bucket/camp/probe: ReadTimeoutError: timeout")

    driven = DrivenClock(datetime(2026, 3, 1, tzinfo=UTC))
    store = FrozenStore("s3://bucket/camp", client=OutageS3(Clock(), down_until=0))
    monkeypatch.setattr(opening, "open_store", lambda *a, **k: store)
    with use_clock(driven), caplog.at_level(logging.WARNING, logger=OUTAGE_LOGGER):
        check_storage("s3://bucket/camp", wait_s=900)
        assert 30 <= driven.monotonic() < 60 and FrozenStore.tries == 6  # backoff 1 2 4 8 16
        said = [r.getMessage() for r in caplog.records if r.name == OUTAGE_LOGGER]
        assert len(said) == 2 and "up to 15 min" in said[0], said  # down once, back once

        FrozenStore.answers_at = float("inf")
        start = driven.monotonic()
        with pytest.raises(SpecError) as ended:
            check_storage("s3://bucket/camp", wait_s=900)
        assert driven.monotonic() - start == pytest.approx(900)
        text = str(ended.value)
        assert text.startswith("field 'storage.url': store s3://bucket/camp did not answer for")
        assert "Nothing is lost" in text and "run the same campaign again" in text
        slept = len(driven.slept)
        with pytest.raises(SpecError, match="is not usable"):
            check_storage("s3://bucket/camp")  # plan: at once
        assert len(driven.slept) == slept
