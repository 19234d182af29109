"""Task-level contracts of the phase tasks: stop rules fail a task at once, transient errors
retry."""

from __future__ import annotations

from prefect import flow, task

from gpucampaign.core.stoprules import NonFiniteLoss
from gpucampaign_prefect.orchestration.phases import PHASE_OPTIONS, artifact_key, calendar_step
from tests.helpers import TRAIN_CONTROL, one_lot_spec


def test_a_stop_rule_is_never_retried_and_a_transient_error_is(prefect_harness):
    calls = {"stop": 0, "flaky": 0}

    @task(**PHASE_OPTIONS)
    def stops() -> None:
        calls["stop"] += 1
        raise NonFiniteLoss("control-abc", "loss is nan at step 7", step=7, stop_id="stop-1")

    @task(**PHASE_OPTIONS)
    def flaky() -> str:
        calls["flaky"] += 1
        if calls["flaky"] == 1:
            raise OSError("connection reset by the store")
        return "ok"

    @flow
    def both() -> tuple[str, str]:
        stop_state = stops(return_state=True)
        return stop_state.message, flaky()

    message, result = both()
    assert calls == {"stop": 1, "flaky": 2} and result == "ok"
    # The failed task says the rule, the reason, the stop and the run.
    assert message.endswith("non_finite_loss: loss is nan at step 7 (stop stop-1, run control-abc)")


def test_artifact_keys_and_calendar_steps():
    assert artifact_key("train", "bf16-3F2A_x") == "train-bf16-3f2a-x"
    spec = one_lot_spec({"name": "pilot", "phase": "pilot"}, {**TRAIN_CONTROL, "after": ["pilot"]})
    # The pilot of the control is observed time of the pilot step; its training, of its own step.
    assert calendar_step(spec, run="control", phase="pilot") == "pilot"
    assert calendar_step(spec, run="control", phase="train") == "train-control"
    assert calendar_step(spec, phase="close") is None


def test_busy_time_and_stops_go_through_the_library_writers(tmp_path):
    import pytest

    from gpucampaign.folder.records import read_stops, read_timeline
    from gpucampaign_prefect.orchestration.phases import busy, out_folder, record_stop

    spec = one_lot_spec(TRAIN_CONTROL)
    folder = out_folder(tmp_path)
    with busy(folder, spec, phase="train", run="control", note="c") as row:
        row.steps = 3
    with pytest.raises(RuntimeError), busy(folder, spec, phase="close"):
        raise RuntimeError("disk full")
    ok, failed = read_timeline(tmp_path)
    assert (ok.step, ok.run, ok.steps, ok.outcome, ok.note) == (
        "train-control",
        "control",
        3,
        "ok",
        "c",
    )
    assert ok.interval is not None and ok.seconds >= 0
    assert failed.step is None and failed.outcome == "failed: disk full" and failed.end

    exc = NonFiniteLoss("control-abc", "loss is nan", step=7, stop_id="stop-1")
    first = record_stop(folder, exc, run="control", phase="train")
    record_stop(folder, exc, run="control", phase="train")
    assert read_stops(tmp_path) == [first]
    assert (first.rule, first.run_id, first.step, first.run) == (
        "non_finite_loss",
        "control-abc",
        7,
        "control",
    )
