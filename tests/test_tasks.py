"""Task-level contracts of the phase tasks: stop rules fail a task at once, transient errors retry."""

from __future__ import annotations

from prefect import flow, task

from gpucampaign.spec import parse_spec
from gpucampaign.stoprules import NonFiniteLoss
from tasks._common import PHASE_OPTIONS, artifact_key, calendar_step


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
    spec = parse_spec({
        "name": "x", "packages": [{"gpu": "rtx4090", "days": 3}],
        "calendar": [{"name": "pilot", "kind": "machine", "resource": "gpu", "hours": 1, "phase": "pilot"},
                     {"name": "train-control", "kind": "machine", "resource": "gpu", "hours": 1,
                      "run": "control", "after": ["pilot"]}],
    })
    # The pilot of the control is observed time of the pilot step; its training, of its own step.
    assert calendar_step(spec, run="control", phase="pilot") == "pilot"
    assert calendar_step(spec, run="control", phase="train") == "train-control"
    assert calendar_step(spec, phase="close") is None

