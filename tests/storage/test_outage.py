"""A store's outage is said once for the whole process, however many stores (one per task),
threads, reads and uploads meet it: one line when it starts, one when the store answers again,
and a later outage is said again."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import EndpointConnectionError

from gpucampaign.storage import NoAnswer, S3Store, SpoolingStore
from gpucampaign.storage.outage import BACK, DOWN, OUTAGE_LOGGER, Outages
from tests.storage.test_readwait import BODY, OutageS3

URL = "s3://bucket/camp"


class Switch:
    """An S3 server that is down while ``down`` is set; counts the calls each client made."""

    def __init__(self) -> None:
        self.down = threading.Event()
        self.down.set()


class SwitchedS3(OutageS3):
    """``OutageS3``'s answers, refused while the switch is down."""

    def __init__(self, switch: Switch) -> None:
        super().__init__(clock=None, down_until=0)  # type: ignore[arg-type]
        self.switch = switch

    def _gate(self) -> None:
        self.calls += 1
        if self.switch.down.is_set():
            raise EndpointConnectionError(endpoint_url=self.meta.endpoint_url)


class SwitchedRemote:
    """The remote of a spool: takes uploads only while the switch is up."""

    url = URL

    def __init__(self, switch: Switch) -> None:
        self.switch = switch
        self.got: list[str] = []

    def _gate(self) -> None:
        if self.switch.down.is_set():
            raise NoAnswer(f"cannot reach the S3 endpoint {OutageS3.meta.endpoint_url}")

    def put_file(self, key: str, *, src: Path, sha256: str | None = None) -> None:
        self._gate()
        self.got.append(key)

    def write_bytes(self, key: str, *, data: bytes) -> None:
        self._gate()
        self.got.append(key)


def _task_store(switch: Switch, outages: Outages | None = None, *, url: str = URL) -> S3Store:
    """The store a task opens: its own client and its own read wait, the process's outages
    (``outages``: a test's own)."""
    store = S3Store(url, client=SwitchedS3(switch), read_wait_s=600)
    store._reads._sleep = lambda s: time.sleep(0.01)  # noqa: SLF001
    if outages is not None:
        store._reads.outages = outages  # noqa: SLF001
    return store


def _said(caplog: Any) -> list[str]:
    return [r.store_outage.kind for r in caplog.records if r.name == OUTAGE_LOGGER]


def _wait_until(check: Any) -> None:
    deadline = time.monotonic() + 10
    while not check():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_tasks_waiting_at_once_say_the_outage_once_and_its_end_once(caplog) -> None:
    """Three tasks of one campaign (each opens its store, as tasks/train.py does) wait for the
    store at once: the process's outages (no test's own) say it once, and its end once."""
    url = "s3://bucket/once-for-the-campaign"  # a store of its own: no other test's outage
    switch = Switch()
    stores = [_task_store(switch, url=url) for _ in range(3)]  # three tasks, three threads
    got: list[bytes] = []
    with caplog.at_level(logging.WARNING, logger="gpucampaign.storage"):
        for _ in range(2):  # two outages, one after the other
            threads = [
                threading.Thread(target=lambda s=s: got.append(s.read_bytes("run/LATEST")))
                for s in stores
            ]
            for thread in threads:
                thread.start()
            # Every task waits (tried at least twice) before the store answers again.
            _wait_until(lambda: all(s._client.calls >= 2 for s in stores))  # noqa: SLF001
            switch.down.clear()
            for thread in threads:
                thread.join(timeout=10)
            switch.down.set()
            for s in stores:
                s._client.calls = 0  # noqa: SLF001
    assert got == [BODY] * 6
    said = [r.getMessage() for r in caplog.records]
    assert [m.split(" ", 3)[2] for m in said] == ["does", "answers", "does", "answers"], said
    assert _said(caplog) == [DOWN, BACK, DOWN, BACK]
    down, back = said[:2]
    assert down.startswith(f"store {url} does not answer (cannot read {url}/run/LATEST: cannot")
    assert f"reading {url}/run/LATEST waits for it" in down
    assert "up to 10 min (storage.read_wait_s)" in down and "Said once for this outage" in down
    assert back.startswith(f"store {url} answers again after ")


def test_an_upload_the_outage_sends_to_the_spool_joins_the_same_outage(caplog, tmp_path) -> None:
    """A read waits and an upload goes to the spool during one outage: said once; the spool's
    upload when the store answers again says its end, once (the waiting read says nothing
    more)."""
    switch, outages = Switch(), Outages()
    reader = _task_store(switch, outages)
    remote = SwitchedRemote(switch)
    spooling = SpoolingStore(
        remote,  # type: ignore[arg-type]
        spool_dir=tmp_path / "spool",
        retry_s=3600,  # no background retry: the test drains
        outages=outages,
    )
    key = "control-0123456789/step-000000004/meta.json"
    with caplog.at_level(logging.INFO):
        thread = threading.Thread(target=lambda: reader.read_bytes("run/LATEST"))
        thread.start()
        _wait_until(lambda: outages.is_down(URL))
        spooling.write_bytes(key, data=b"{}")
        assert spooling.pending() == [key]
        switch.down.clear()
        assert spooling.drain(timeout_s=5) == [] and remote.got == [key]
        thread.join(timeout=10)
    assert _said(caplog) == [DOWN, BACK]
    spool_lines = [r for r in caplog.records if r.name == "gpucampaign.storage.spool"]
    # The spool's own line is a detail (INFO), not a second warning of the outage.
    assert [r.levelno for r in spool_lines if "did not take" in r.getMessage()] == [logging.INFO]


def test_an_upload_alone_opens_the_outage_and_a_refusal_is_not_one(caplog, tmp_path) -> None:
    switch, outages = Switch(), Outages()
    remote = SwitchedRemote(switch)
    spooling = SpoolingStore(
        remote,  # type: ignore[arg-type]
        spool_dir=tmp_path / "spool",
        retry_s=3600,
        outages=outages,
    )
    with caplog.at_level(logging.WARNING):
        spooling.write_bytes("a/step-000000001/x.bin", data=b"x")
        spooling.write_bytes("a/step-000000002/x.bin", data=b"y")
        switch.down.clear()
        spooling.drain(timeout_s=5)
    assert _said(caplog) == [DOWN, BACK]
    (down,) = [r.getMessage() for r in caplog.records if r.name == OUTAGE_LOGGER][:1]
    assert "uploading a/step-000000001/x.bin waits in the spool" in down

    caplog.clear()
    denied = SpoolingStore(
        type("Denied", (), {"url": URL, "write_bytes": staticmethod(_denied)})(),  # type: ignore[arg-type]
        spool_dir=tmp_path / "spool2",
        retry_s=3600,
        outages=outages,
    )
    with caplog.at_level(logging.WARNING):
        denied.write_bytes("b/LATEST", data=b"{}")
    assert _said(caplog) == [] and not outages.is_down(URL)
    assert any("did not take b/LATEST" in r.getMessage() for r in caplog.records)


def _denied(key: str, *, data: bytes) -> None:
    from gpucampaign.storage import StorageError

    raise StorageError("access denied")


def test_the_error_said_is_redacted() -> None:
    outages = Outages()
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger(OUTAGE_LOGGER)
    keep = Keep()
    logger.addHandler(keep)
    try:
        outages.down(
            URL,
            what="reading x",
            error="cannot reach https://AKIA:s3cr3t@127.0.0.1:9/?X-Amz-Signature=abc",
            then="waits",
        )
    finally:
        logger.removeHandler(keep)
    (record,) = records
    assert "s3cr3t" not in record.getMessage() and "abc" not in record.store_outage.error


@pytest.mark.parametrize("seconds, said", [(31, "31 s"), (600, "10 min")])
def test_the_end_says_how_long_it_lasted(seconds: float, said: str, caplog) -> None:
    now = [0.0]
    outages = Outages(clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger=OUTAGE_LOGGER):
        assert outages.down(URL, what="reading x", error="refused", then="waits")
        assert not outages.down(URL, what="reading y", error="refused", then="waits")
        now[0] = seconds
        assert outages.back(URL) and not outages.back(URL)
    assert f"answers again after {said}" in caplog.records[-1].getMessage()
    assert caplog.records[-1].store_outage.lasted_s == seconds
