"""What the Prefect UI shows: flow runs named after the campaign, and a decision form that
asks again, with the reason, when its answer is refused."""

from __future__ import annotations

from types import SimpleNamespace

from gpucampaign.plan.decision import Decision
from gpucampaign_prefect.flows._naming import spec_name
from gpucampaign_prefect.tasks.decide import ask_until_valid


def _check(got):
    if got.action != "reduce" and got.drop:
        raise ValueError("drop: only the 'reduce' action drops runs")
    return Decision(action=got.action, dropped_runs=list(got.drop), by="person")


def test_a_refused_answer_is_asked_again_with_the_reason():
    answers = [
        SimpleNamespace(action="continue", drop=["short"]),
        SimpleNamespace(action="reduce", drop=["short"]),
    ]
    asked: list[tuple[str, int]] = []

    def ask(refused: str, left: int):
        asked.append((refused, left))
        return answers.pop(0)

    decision, refusals = ask_until_valid(ask, check=_check, timeout_s=300)
    assert decision is not None and decision.action == "reduce"
    assert decision.dropped_runs == ["short"]
    assert refusals == ["drop: only the 'reduce' action drops runs"]
    assert [r for r, _ in asked] == ["", "drop: only the 'reduce' action drops runs"]


def test_the_asking_stops_when_the_time_runs_out():
    now = [0.0]

    def ask(refused: str, left: int):
        now[0] += 40.0  # each answer takes 40 s of the 100 s
        return SimpleNamespace(action="continue", drop=["short"])

    decision, refusals = ask_until_valid(ask, check=_check, timeout_s=100, clock=lambda: now[0])
    assert decision is None and len(refusals) == 3  # asked at 0, 40 and 80 s; 20 s left

    decision, refusals = ask_until_valid(lambda r, left: None, check=_check, timeout_s=100)
    assert decision is None and refusals == []  # no answer at all


def test_the_campaign_name_comes_from_the_spec(tmp_path):
    spec = tmp_path / "campaign.yaml"
    spec.write_text("name: digits-mlp\n")
    assert spec_name(str(spec)) == "digits-mlp"
    assert spec_name(SimpleNamespace(name="obj")) == "obj"
    out = tmp_path / "out"
    out.mkdir()
    (out / "spec.yaml").write_text("name: kept\n")
    assert spec_name(None, out=str(out)) == "kept"
    assert spec_name(str(tmp_path / "missing.yaml")) == "missing"


def test_the_flow_run_is_named_after_the_campaign_and_its_output_folder(prefect_harness, tmp_path):
    """A spec the preflight refuses still gives a named flow run (Failed at once)."""
    from prefect.client.orchestration import get_client

    from gpucampaign_prefect.flows.campaign import campaign

    spec = tmp_path / "campaign.yaml"
    spec.write_text("name: watch-me\npackages: []\n")
    out = tmp_path / "out"
    state = campaign(spec=str(spec), out=str(out), return_state=True)
    assert state.is_failed()
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(state.state_details.flow_run_id)
    assert run.name == f"watch-me -> {out}"
