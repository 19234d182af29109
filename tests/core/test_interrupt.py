"""Graceful interruption: a stop request saves at the next step and raises; the rerun resumes.

SIGINT/SIGTERM to a real `campaign run`, and a cancellation from the Prefect UI, are in the fault
suite (tests/faults/test_signals.py), which counts the signals and the runs saved in the grace."""

from __future__ import annotations

import json
import os
import pickle
import signal
import time
from typing import Any

import pytest

from gpucampaign.core import interrupt
from gpucampaign.core.interrupt import Interrupted
from gpucampaign.folder.metrics import read_metrics
from tests.helpers import digits_file, make_spec, run, run_dir, train_losses  # noqa: F401


@pytest.fixture(autouse=True)
def _no_stop_left():
    interrupt.clear_stop()
    yield
    interrupt.clear_stop()


def test_interrupted_keeps_its_reason_step_and_exit_code_through_pickle():
    exc = Interrupted("SIGTERM", step=42)
    back = pickle.loads(pickle.dumps(exc))  # Prefect keeps task exceptions pickled
    assert (back.reason, back.step, str(back)) == ("SIGTERM", 42, str(exc))
    assert "step 42" in str(exc)
    assert (Interrupted("SIGINT").exit_code, back.exit_code, Interrupted("other").exit_code) == (
        130,
        143,
        1,
    )


def test_a_stop_request_keeps_its_first_reason_and_stops_work_not_started():
    interrupt.raise_if_stopped(what="nothing")  # no request: no error
    interrupt.request_stop("SIGTERM")
    interrupt.request_stop("SIGINT")
    assert interrupt.stop_requested() == "SIGTERM"
    with pytest.raises(Interrupted, match="the pilot not started") as err:
        interrupt.raise_if_stopped(what="the pilot")
    assert err.value.reason == "SIGTERM"
    interrupt.clear_stop()
    assert interrupt.stop_requested() is None


def test_a_signal_becomes_a_stop_request_and_the_handlers_come_back():
    before = signal.getsignal(signal.SIGTERM)
    with interrupt.graceful_signals(grace_s=600) as previous:
        assert previous[signal.SIGTERM] is before
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 5
        while interrupt.stop_requested() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert interrupt.stop_requested() == "SIGTERM"
        os.kill(os.getpid(), signal.SIGTERM)  # a second SIGTERM changes nothing
        time.sleep(0.05)
        assert interrupt.stop_requested() == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before
    with pytest.raises(ValueError, match="grace_s"), interrupt.graceful_signals(grace_s=0):
        pass


def test_a_stop_saves_the_step_reached_and_the_rerun_resumes_identically(tmp_path, digits_file):  # noqa: F811
    spec = make_spec(tmp_path, digits_file)
    alone = run(spec, tmp_path, out="alone")
    saved: list[int] = []

    def stop_at_step_7(info: dict[str, Any]) -> None:
        if info["step"] >= 7:
            interrupt.request_stop("SIGINT")

    with pytest.raises(Interrupted) as err:
        run(spec, tmp_path, progress=stop_at_step_7, on_save=lambda s: saved.append(s["step"]))
    step = err.value.step
    assert err.value.reason == "SIGINT" and step is not None and 7 <= step < 20
    assert saved[-1] == step  # the heartbeat callback saw the stop's checkpoint
    latest = json.loads(
        (
            tmp_path / "out" / "checkpoints" / spec.resolve_run("control").run_id / "LATEST"
        ).read_text()
    )
    assert latest["step"] == step
    rows = read_metrics(run_dir(spec, tmp_path) / "metrics.jsonl")
    assert {"kind": "interrupt", "step": step, "reason": "SIGINT"} in [
        {k: r.get(k) for k in ("kind", "step", "reason")} for r in rows
    ]

    interrupt.clear_stop()
    res = run(spec, tmp_path)
    assert res.completed and res.resumed_from_step == step
    assert res.metrics == alone.metrics
    assert train_losses(run_dir(spec, tmp_path) / "metrics.jsonl") == train_losses(
        run_dir(spec, tmp_path, out="alone") / "metrics.jsonl"
    )
