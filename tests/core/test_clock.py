"""The product's clock: real when nothing drives it; driven by a test in its process, or across
processes through the offset file a test names; the waits that read it take no real time."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest

from gpucampaign.core import clock
from gpucampaign.core.clock import (
    CLOCK_FILE_ENV,
    DrivenClock,
    RealClock,
    ShiftedClock,
    shift_clock,
    use_clock,
)
from gpucampaign.engine import lotend
from gpucampaign.storage.base import NoAnswer
from gpucampaign.storage.outage import Outages
from gpucampaign.storage.readwait import ReadWait
from tests.helpers import ROOT

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def test_nothing_drives_it_in_production(monkeypatch):
    monkeypatch.delenv(CLOCK_FILE_ENV, raising=False)
    assert isinstance(clock.current(), RealClock)
    before = datetime.now(UTC)
    assert before <= clock.now() <= datetime.now(UTC)
    assert lotend._now().tzinfo is not None
    started = time.monotonic()
    clock.sleep(0.01)
    assert time.monotonic() - started >= 0.01


def test_a_driven_clock_moves_only_when_told_and_is_removed_after(monkeypatch):
    monkeypatch.delenv(CLOCK_FILE_ENV, raising=False)
    with use_clock(DrivenClock(T0, tick_s=1.0)) as driven:
        assert clock.now() == T0 + timedelta(seconds=1)
        assert lotend._now() == T0 + timedelta(seconds=2)  # the lot's end reads it
        driven.advance(3600)
        assert clock.now() == T0 + timedelta(seconds=3603)
        started = time.monotonic()
        clock.sleep(600)  # ten minutes on the clock, none of the test's
        assert time.monotonic() - started < 1
        assert driven.slept == [600] and clock.monotonic() == 4203
        assert driven.reads == [T0 + timedelta(seconds=s) for s in (1, 2, 3603)]
    assert isinstance(clock.current(), RealClock)


def test_an_outage_back_off_takes_no_real_time_on_a_driven_clock():
    tries = []

    def read() -> bytes:
        tries.append(clock.monotonic())
        if clock.monotonic() < 100:  # the store answers again after 100 s
            raise NoAnswer("connection refused")
        return b"ok"

    wait = ReadWait("s3://b/p", bound_s=600, transient=lambda e: True, outages=Outages())
    started = time.monotonic()
    with use_clock(DrivenClock(T0)) as driven:
        assert wait.run("LATEST", read) == b"ok"
    assert time.monotonic() - started < 1
    # The same back-off as on the real clock: doubling from 1 s up to 30 s.
    assert driven.slept == [1, 2, 4, 8, 16, 30, 30, 30] and tries[-1] >= 100


def test_another_process_reads_the_offset_file_a_test_names(tmp_path, monkeypatch):
    path = tmp_path / "clock"
    monkeypatch.delenv(CLOCK_FILE_ENV, raising=False)
    assert shift_clock(path, by_s=86400) == 86400
    assert shift_clock(path, by_s=3600) == 90000
    code = "from gpucampaign.core import clock; print(clock.now().isoformat())"
    env = {**os.environ, CLOCK_FILE_ENV: str(path), "PYTHONPATH": f"{ROOT / 'src'}"}
    before = datetime.now(UTC)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    shifted = datetime.fromisoformat(out.stdout.strip()) - timedelta(seconds=90000)
    assert before <= shifted <= datetime.now(UTC)
    # Unset, the same code reads the real clock.
    del env[CLOCK_FILE_ENV]
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert before <= datetime.fromisoformat(out.stdout.strip()) <= datetime.now(UTC)


def test_a_shift_ends_a_sleep_on_the_shifted_clock_at_once(tmp_path, monkeypatch):
    path = tmp_path / "clock"
    monkeypatch.setenv(CLOCK_FILE_ENV, str(path))
    assert isinstance(clock.current(), ShiftedClock)
    assert clock.current().offset_s() == 0.0  # no file yet: no offset
    timer = threading.Timer(0.2, shift_clock, args=(path,), kwargs={"by_s": 3600})
    started = time.monotonic()
    timer.start()
    clock.sleep(3000)
    took = time.monotonic() - started
    assert 0.2 <= took < 5, took


@pytest.mark.parametrize("text", ["", "not a number"])
def test_an_unreadable_offset_is_no_offset(tmp_path, text):
    path = tmp_path / "clock"
    path.write_text(text)
    assert ShiftedClock(path).offset_s() == 0.0
