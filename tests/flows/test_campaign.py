"""The campaign flow on a real (test) Prefect server with real torch training on the digits corpus.

Each test builds a tiny campaign with `campaign init` (a few dozen steps per run) and its own GPU
lock name, since the Prefect database is shared by the session.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpucampaign.cli.scaffold import init_campaign
from gpucampaign.folder.layout import RunFolder
from gpucampaign.verify.checks import verify_output

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
GPU_PHASES = {"pilot", "train", "restart"}
#: The tiny demo's decision after its round of seeds (deterministic on CPU).
DECIDED = "adopt"


def start_campaign_run(spec: Path, *, out: Path) -> subprocess.Popen:
    """``campaign run SPEC --out OUT`` in a session of its own, like a terminal's foreground
    group: a signal sent to the group reaches it and the embedded server it starts."""
    return subprocess.Popen(
        [str(Path(sys.executable).parent / "campaign"), "run", str(spec), "--out", str(out)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def tiny_campaign(tmp: Path, **edit: Any) -> Path:
    """`campaign init` cut down to seconds of training, with a private GPU lock.

    ``edit`` replaces top-level spec sections (a callable receives the loaded spec and edits it).
    """
    spec_path = init_campaign(tmp / "spec")
    data = yaml.safe_load(spec_path.read_text())
    data["name"] = f"t{uuid.uuid4().hex[:8]}"
    data["gpu_lock"] = {"name": f"gpu-{uuid.uuid4().hex[:8]}", "timeout_s": 600, "lease_s": 60}
    data["control"] = {**data["control"], "epochs": 2}
    data["pilot"] = {"steps": 5}
    data["decision_rule"] = {**data["decision_rule"], "threshold": 0.5, "min_gain": 0.0}
    for key, value in edit.items():
        if callable(value):
            value(data)
        else:
            data[key] = value
    # No round of seeds beyond the plan unless a test asks for it (tests/flows/test_rounds.py):
    # each test here decides on its planned runs, in the time it always took.
    data["decision_point"] = {"rounds": 0, **(data.get("decision_point") or {})}
    spec_path.write_text(yaml.safe_dump(data, sort_keys=False))
    return spec_path


def run_flow(spec: Any, out: Path, **kw: Any):
    """The campaign flow on a spec file (a Path) or a spec object."""
    from gpucampaign_prefect.flows.campaign import campaign

    return campaign(
        spec=str(spec) if isinstance(spec, Path) else spec, out=str(out), return_state=True, **kw
    )


def jsonl(path: Path) -> list[dict[str, Any]]:
    return (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if path.exists()
        else []
    )


def _t(s: str) -> datetime:
    return datetime.fromisoformat(s)


def gpu_overlaps(timeline: list[dict[str, Any]]) -> list[tuple[str, str]]:
    rows = sorted((r for r in timeline if r["phase"] in GPU_PHASES), key=lambda r: r["start"])
    return [
        (a["step"], b["step"])
        for a, b in zip(rows, rows[1:], strict=False)
        if _t(b["start"]) < _t(a["end"])
    ]


def _artifact_versions(key: str) -> list[Any]:
    """Every version of the artifact ``key`` on the test server, the newest first."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    with get_client(sync_client=True) as client:
        return client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])),
            sort=ArtifactSort.CREATED_DESC,
        )


def _assert_ui_tables(spec: Path, out: Path) -> None:
    """The live tables of the UI: every evaluation of each run (one key per run), and the GPU
    lock's holders on this host (free again at the end)."""
    from gpucampaign.config import load_spec
    from gpucampaign.folder.records import read_campaign_id
    from gpucampaign_prefect.orchestration.gpu_lock import holders_key
    from gpucampaign_prefect.orchestration.ui import evaluations_key

    cs = load_spec(spec)
    campaign = read_campaign_id(out)
    for run in cs.run_names():
        rid = cs.resolve_run(run).run_id
        versions = _artifact_versions(evaluations_key(rid, campaign=campaign))
        assert versions and versions[0].type == "table", rid
        rows = (
            json.loads(versions[0].data) if isinstance(versions[0].data, str) else versions[0].data
        )
        evals = [r for r in jsonl(out / "runs" / rid / "metrics.jsonl") if r.get("kind") == "eval"]
        assert [r["step"] for r in rows] == sorted(
            {e["step"] for e in evals if e["split"] == "val"}
        )
        assert {"step", "train_loss", "metric", "value", "elapsed", "eta"} <= set(rows[-1])
        assert rows[-1]["eta"] == "done" and rows[-1]["value"] is not None
    holders = _artifact_versions(holders_key(cs.gpu_lock.name))
    assert len(holders) >= 2  # a version at each take and each release
    newest = json.loads(holders[0].data) if isinstance(holders[0].data, str) else holders[0].data
    assert newest[0]["holder"] == "(free on this host)"
    taken = [json.loads(v.data) if isinstance(v.data, str) else v.data for v in holders]
    assert any(row.get("holder", "").startswith("train of ") for t in taken for row in t)


def test_campaign_completes_verifies_and_a_rerun_repeats_nothing(prefect_harness, tmp_path):
    # Every run completes here: futility off, since bf16 ties the control exactly on CPU and
    # would stop as futile (tests/flows/test_futility.py runs that rule).
    # One round of seeds beyond the plan allowed (decision_point.rounds).
    spec = tiny_campaign(
        tmp_path, stop_rules={"futility": False}, decision_point={"mode": "auto", "rounds": 1}
    )
    out = tmp_path / "out"
    state = run_flow(spec, out)
    assert state.is_completed(), state.message
    summary = state.result()
    assert summary["verified"] is True and summary["problems"] == []
    assert set(summary["runs"].values()) == {"completed"}
    # Training on CPU is deterministic: the demo chooses the short variant, every time; with
    # one seed a side it is not adopted (training noise is not measured) and the verdict names
    # the seeds that would settle it: the campaign buys them in the lot (the chosen variant and
    # the control only) and decides again.
    rounds = jsonl(out / "rounds.jsonl")
    new = ["control.s1", "control.s2", "short.s1", "short.s2"]
    assert [(r["round"], r["bought"], r["by"], r["runs"]) for r in rounds] == [
        (1, True, "auto", new)
    ]
    assert rounds[0]["seeds"] == {"control": [0, 1, 2], "short": [0, 1, 2]}
    assert "training noise is not measured" in rounds[0]["why"]
    assert "more seed(s) of both 'control' and 'short'" in rounds[0]["why"]
    assert 0 < rounds[0]["lot_share"] < 1e-3
    verdict = summary["verdict"]
    assert (verdict["kind"], verdict["run"]) == (DECIDED, "short"), verdict["answer"]
    assert verdict["numbers"]["family"]["look"] == 1
    assert verdict["variants"]["short"]["test"]["seeds"]["control"] == [0, 1, 2]
    # Chosen on val, confirmed on test: the verdict prints the interval it rests on.
    assert (verdict["select_split"], verdict["report_split"]) == ("val", "test")
    low, high = verdict["variants"]["short"]["test"]["gain_ci95"]
    assert low <= verdict["variants"]["short"]["test"]["gain"] <= high
    assert "[95% CI " in verdict["text"]
    report_json = json.loads((out / "report.json").read_text())
    assert report_json["rounds"][0]["text"].startswith("round 1 of 1: 2 more seed(s) (1, 2)")
    assert summary["spent_usd"] == 47.14
    _assert_ui_tables(spec, out)

    for name in (
        "plan.json",
        "report.md",
        "report.html",
        "manifest.json",
        "RELOAD.md",
        "restart.json",
        "figures/calendar.png",
        "figures/curves.png",
        "figures/confusion.png",
    ):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    # summary["verified"] above is the close's own verify_output(reload=True), anchored by the
    # manifest's sha256: every model reloaded in a fresh process; not repeated here.
    assert json.loads((out / "restart.json").read_text())["identical"] is True
    report = (out / "report.md").read_text()
    assert summary["verdict"]["text"] in report
    assert "### Rounds of seeds beyond the plan" in report and "% of the lot" in report
    # Every completed run is a delivery whose model reloads and reproduces its predictions.
    assert report_json["budget"]["accepted_deliveries"] == 8

    timeline = timeline_rows(out)
    trained = {r["run"] for r in timeline if r["phase"] == "train" and r.get("steps", 0) > 0}
    assert trained == {"control", "lr-high", "bf16", "short", *new}
    assert any(r["phase"] == "decide" and "round 1 of 1" in r["note"] for r in timeline)
    assert {r["step"] for r in timeline if r["phase"] == "pilot"} == {"pilot"}
    # One GPU slot: the pilot, the four runs and the restart check never overlap, and the
    # essential work comes first: the control, its restart check, then useful, then exploratory.
    assert gpu_overlaps(timeline) == []
    order = [
        (r["phase"], r["run"])
        for r in sorted(timeline, key=lambda r: r["start"])
        if r["phase"] in GPU_PHASES
    ]
    # Every run is piloted first (essential, useful, exploratory), each re-forecast on its own.
    assert order[:6] == [
        ("pilot", "control"),
        ("pilot", "lr-high"),
        ("pilot", "bf16"),
        ("pilot", "short"),
        ("train", "control"),
        ("restart", "control"),
    ]
    assert {run for _, run in order[6:8]} == {"lr-high", "bf16"}
    assert order[8:] == [("train", run) for run in ["short", *new]]  # the round after the plan
    pilots = json.loads((out / "pilot.json").read_text())
    assert set(pilots) == {"control", "lr-high", "bf16", "short"}
    assert all(len(m["early_losses"]) == 5 for m in pilots.values())

    # A rerun into the same folder repeats nothing finished and keeps the plan and decision.
    plan_before = (out / "plan.json").read_bytes()
    n_rows, n_decisions = len(timeline), len(jsonl(out / "decisions.jsonl"))
    state2 = run_flow(spec, out)
    assert state2.is_completed(), state2.message
    new_rows = timeline_rows(out)[n_rows:]
    assert [
        r for r in new_rows if r.get("steps", 0) > 0 or r["phase"] in {"pilot", "restart", "decide"}
    ] == []
    assert len(jsonl(out / "decisions.jsonl")) == n_decisions
    assert (out / "plan.json").read_bytes() == plan_before
    assert verify_output(out, reload=False).verified

    # Extended in place: one more seed of the control and 'short' written in the spec, run
    # into the same folder: every finished run is reused, only the two new ones train, and
    # the folder keeps the first spec and plan and says why.
    before = spec.read_bytes()
    data = yaml.safe_load(before)
    data["control"]["seeds"] = [0, 1, 2, 3]
    data["variants"] = [
        {**v, "seeds": [0, 1, 2, 3]} if v["name"] == "short" else v for v in data["variants"]
    ]
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    n_rows = len(timeline_rows(out))
    state3 = run_flow(spec, out)
    assert state3.is_completed(), state3.message
    new_rows = timeline_rows(out)[n_rows:]
    assert {r["run"] for r in new_rows if r.get("steps", 0) > 0} == {"control.s3", "short.s3"}
    assert {r["run"] for r in new_rows if r["phase"] == "pilot"} == {"control.s3", "short.s3"}
    history = jsonl(out / "spec-history.jsonl")
    assert [(h["version"], h["why"]) for h in history] == [
        (1, "extended in place: added seeds 3 of 'control'; seeds 3 of 'short'")
    ]
    assert (out / "specs" / "spec-1.yaml").read_bytes() == before
    assert (out / "specs" / "plan-1.json").read_bytes() == plan_before
    assert (out / "spec.yaml").read_bytes() == spec.read_bytes()
    extended = state3.result()["verdict"]
    assert extended["variants"]["short"]["test"]["seeds"]["control"] == [0, 1, 2, 3]
    assert extended["numbers"]["family"]["look"] == 2  # the round, then the extension
    assert verify_output(out, reload=False).verified
    # The scheduled restart check of a campaign's output: test_two_gpus_give_a_two_slot_lock_...
    # (four runs, checked two at a time, where this folder's ten were checked one by one).


def test_optional_stop_is_recorded_and_reduce_drops_the_exploratory_variant(
    prefect_harness, tmp_path
):
    def edit(data: dict[str, Any]) -> None:
        data["variants"] = [
            {
                "name": "boom",
                "tier": "useful",
                "changes": {"optimizer": "sgd", "lr": 1.0e6},
                "combined": True,
                "hypothesis": "diverges",
            },
            # Re-forecast from the pilot's step time, 10^9 epochs need far more than the 72 h
            # window.
            {
                "name": "long",
                "tier": "exploratory",
                "changes": {"epochs": 1_000_000_000},
                "hypothesis": "longer",
            },
        ]
        cal = [s for s in data["calendar"] if s.get("run") not in ("lr-high", "bf16", "short")]
        i = next(k for k, s in enumerate(cal) if s["name"] == "train-control")
        cal[i + 1 : i + 1] = [
            {
                "name": "train-boom",
                "kind": "machine",
                "resource": "gpu",
                "hours": 0.1,
                "after": ["train-control"],
                "tier": "useful",
                "run": "boom",
            },
            {
                "name": "train-long",
                "kind": "machine",
                "resource": "gpu",
                "hours": 0.1,
                "after": ["train-control"],
                "tier": "exploratory",
                "run": "long",
            },
        ]
        data["calendar"] = cal

    spec = tiny_campaign(tmp_path, edit=edit)
    out = tmp_path / "out"
    state = run_flow(spec, out)
    assert state.is_completed(), state.message
    summary = state.result()
    decision = jsonl(out / "decisions.jsonl")[-1]["decision"]
    # 'boom' diverges in its pilot already: it cannot change the choice, so it is dropped too.
    assert decision["action"] == "reduce" and decision["dropped_runs"] == ["boom", "long"]
    assert decision["dropped_steps"] == ["train-boom", "train-long"]
    assert any(
        "'boom' is dropped: its pilot tripped non_finite_loss" in r for r in decision["reasons"]
    )

    stops = jsonl(out / "stops.jsonl")
    assert [(s["run"], s["rule"]) for s in stops] == [("boom", "non_finite_loss")]
    assert stops[0]["step"] is not None
    manifest = json.loads((out / "manifest.json").read_text())
    status = {v["run"]: v["status"] for v in manifest["runs"].values()}
    assert status == {"control": "completed", "boom": "stopped", "long": "dropped"}
    assert summary["verified"] is True
    assert "long" not in {r["run"] for r in timeline_rows(out) if r["phase"] == "train"}


def test_a_control_stopped_by_the_quality_floor_still_ends_with_the_decision(
    prefect_harness, tmp_path
):
    spec = tiny_campaign(
        tmp_path,
        stop_rules={
            "non_finite_loss": True,
            "below_threshold": True,
            "quality_floor": 0.9999,
            "require_restart": True,
        },
    )
    out = tmp_path / "out"
    state = run_flow(spec, out)
    assert state.is_completed(), state.message  # a decision is reached: not a failed campaign
    summary = state.result()
    stops = jsonl(out / "stops.jsonl")
    control = next(s for s in stops if s["run"] == "control")
    assert control["rule"] == "below_threshold"
    verdict = summary["verdict"]
    assert verdict["kind"] in ("adopt", "negative", "inconclusive")
    assert f"'control' stopped by below_threshold ({control['stop_id']})" in verdict["text"]
    assert summary["essential_stop"] is None and summary["verified"] is True
    report = json.loads((out / "report.json").read_text())
    assert report["budget"]["spent_usd"] == 47.14  # a stopped run still shows its full cost
    rid = next(r for r, v in summary["runs"].items() if r.startswith("control-"))
    assert (out / "runs" / rid / "predictions.csv").is_file()  # the model it reached
    assert rid in verify_output(out, reload=True).reloaded_runs


def timeline_rows(out: Path) -> list[dict[str, Any]]:
    """One row per segment of timeline.jsonl (its start, heartbeat and end lines folded)."""
    from gpucampaign.folder.records import read_timeline

    return [r.to_dict() for r in read_timeline(out)]


def campaign_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`campaign ARGS` in a new process, its output captured."""
    return subprocess.run(
        [str(Path(sys.executable).parent / "campaign"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_campaign_run_cli_exit_codes(tmp_path):
    """Embedded Prefect in a new process: bad input 2 (nothing written), a re-posed question 3."""
    bad = campaign_cli(
        "run", str(tmp_path / "missing.yaml"), "--out", str(tmp_path / "o1"), cwd=ROOT
    )
    assert bad.returncode == 2 and "does not exist" in bad.stderr
    assert not (tmp_path / "o1").exists()

    spec = tiny_campaign(tmp_path, edit=lambda d: d["control"].update(optimizer="sgd", lr=1.0e6))
    out = tmp_path / "o2"
    run = campaign_cli("run", str(spec), "--out", str(out), cwd=ROOT)
    assert run.returncode == 3, run.stdout + run.stderr
    assert "Re-pose the question" in run.stdout and "non_finite_loss" in run.stderr
    assert (out / "report.md").is_file() and (out / "manifest.json").is_file()
    assert [s["rule"] for s in jsonl(out / "stops.jsonl")] == ["non_finite_loss"]

    # Another campaign into the same folder: refused before anything starts, nothing changed.
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    other = tiny_campaign(tmp_path / "other")
    refused = campaign_cli("run", str(other), "--out", str(out), cwd=ROOT)
    assert refused.returncode == 2 and "holds another campaign" in refused.stderr
    assert "Traceback" not in refused.stderr + refused.stdout
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_campaign_run_exits_0_when_a_stopped_control_still_gives_the_decision(tmp_path):
    spec = tiny_campaign(
        tmp_path,
        stop_rules={"below_threshold": True, "quality_floor": 0.9999, "require_restart": False},
    )
    out = tmp_path / "out"
    run = campaign_cli("run", str(spec), "--out", str(out), cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    said = " ".join(run.stdout.split())
    # The closing lines open with the question and its answer, then the runs and the verdict.
    assert said.index("question: ") < said.index("answer: ") < said.index("runs: ")
    assert said.index("answer: ") < said.index("Verdict: ") < said.index("verdict: ")
    assert "below_threshold" in said  # the stop is shown with the verdict
    assert [s["run"] for s in jsonl(out / "stops.jsonl")].count("control") == 1


def _paused_run_of(out: Path, timeout_s: float = 240, other_than: Any = None) -> Any:
    """The flow run (of this test's output folder) once it is Paused at the decision point."""
    import time

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            runs = client.read_flow_runs(
                flow_run_filter=FlowRunFilter(
                    state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.PAUSED]))
                )
            )
            for fr in runs:
                if fr.parameters.get("out") == str(out) and fr.state.id != other_than:
                    return fr
            time.sleep(0.2)  # the form waits for the test: found within a fifth of a second
    raise AssertionError("the flow never paused at the decision point")


def no_restart_check(data: dict[str, Any]) -> None:
    """The calendar without its restart check (one more process per campaign): for a test of
    something else; the check itself is tested by the campaigns that keep it."""
    data["calendar"] = [s for s in data["calendar"] if s.get("phase") != "restart"]
    for step in data["calendar"]:
        if "after" in step:
            step["after"] = [a for a in step["after"] if a != "restart-check"]


def test_ask_mode_takes_a_persons_answer_from_the_ui(prefect_harness, tmp_path):
    """Mode 'ask': the flow pauses for the form; the answer (drop 'short') is applied and
    recorded."""
    from concurrent.futures import ThreadPoolExecutor

    from prefect.flow_runs import resume_flow_run

    spec = tiny_campaign(
        tmp_path, decision_point={"mode": "ask", "timeout_s": 300}, edit=no_restart_check
    )
    out = tmp_path / "out"
    name = yaml.safe_load(spec.read_text())["name"]
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(run_flow, spec, out)
        paused = _paused_run_of(out)
        # The UI shows the campaign: the run's name and tag say which one and where.
        assert paused.name == f"{name} -> {out}" and f"campaign:{name}" in paused.tags
        # An invalid combination (drop without 'reduce') is asked again, not taken silently.
        resume_flow_run(paused.id, run_input={"action": "continue", "drop": ["short"]})
        again = _paused_run_of(out, other_than=paused.state.id)
        assert again.id == paused.id
        resume_flow_run(
            paused.id,
            run_input={"action": "reduce", "drop": ["short"], "note": "no time to read it"},
        )
        state = running.result(timeout=600)
    assert state.is_completed(), state.message
    record = jsonl(out / "decisions.jsonl")[-1]
    assert record["decision"]["action"] == "reduce" and record["decision"]["by"] == "person"
    assert record["decision"]["dropped_runs"] == ["short"]
    assert any("no time to read it" in r for r in record["decision"]["reasons"])
    status = {
        v["run"]: v["status"]
        for v in json.loads((out / "manifest.json").read_text())["runs"].values()
    }
    assert status["short"] == "dropped" and status["control"] == "completed"
    decide = [r for r in timeline_rows(out) if r["phase"] == "decide"]
    assert [r["kind"] for r in decide] == ["human"]


def test_ask_mode_falls_back_to_the_automatic_choice_after_the_timeout(prefect_harness, tmp_path):
    spec = tiny_campaign(
        tmp_path, decision_point={"mode": "ask", "timeout_s": 3}, edit=no_restart_check
    )
    out = tmp_path / "out"
    state = run_flow(spec, out)
    assert state.is_completed(), state.message
    decision = jsonl(out / "decisions.jsonl")[-1]["decision"]
    assert decision["action"] == "continue" and decision["by"] == "timeout"
    assert "no answer in time" in decision["reasons"]


def max_concurrent(timeline: list[dict[str, Any]]) -> int:
    events = sorted(
        [(_t(r["start"]), 1) for r in timeline if r["phase"] in GPU_PHASES]
        + [(_t(r["end"]), -1) for r in timeline if r["phase"] in GPU_PHASES]
    )
    level = peak = 0
    for _, delta in events:
        level += delta
        peak = max(peak, level)
    return peak


def test_two_gpus_give_a_two_slot_lock_and_the_same_numbers(prefect_harness, tmp_path):
    """Two lots -> a lock of 2: at most two GPU phases at once, and runs that shared the process
    still give exactly the numbers each gives alone. The spec is passed as an object. Then the
    scheduled restart check of the output (the `restart_verification` flow)."""
    from prefect.client.orchestration import get_client

    from gpucampaign.config import load_spec
    from gpucampaign.data.corpus import load_spec_corpus
    from gpucampaign.engine.loop import train_run
    from gpucampaign.storage import LocalStore

    spec = tiny_campaign(
        tmp_path,
        packages=[{"gpu": "rtx4090", "days": 3, "count": 2}],
        stop_rules={"futility": False},  # every run to its end: the numbers are compared
    )
    out = tmp_path / "out"
    cs = load_spec(spec)
    state = run_flow(cs, out, base_dir=str(spec.parent))  # the flow takes the spec object too
    assert state.is_completed(), state.message
    assert load_spec(out / "spec.yaml") == cs
    with get_client(sync_client=True) as client:
        assert client.read_global_concurrency_limit_by_name(cs.gpu_lock.name).limit == 2
    peak = max_concurrent(timeline_rows(out))
    assert 1 <= peak <= 2

    corpus = load_spec_corpus(cs, base_dir=spec.parent)
    for run in cs.run_names():
        rid = cs.resolve_run(run).run_id
        alone = train_run(
            cs,
            run=cs.resolve_run(run),
            corpus=corpus,
            store=LocalStore(tmp_path / "alone" / "ck"),
            run_folder=RunFolder.scratch(tmp_path / "alone" / rid, rid),
        )
        recorded = json.loads((out / "runs" / rid / "result.json").read_text())
        assert recorded["metrics"] == alone.metrics, run

    # The scheduled restart check of this output: every run resumes exactly in a new process ...
    from gpucampaign_prefect.flows.restart_check import restart_verification

    reports = restart_verification(out=str(out), steps=5)
    assert {r["run"] for r in reports} == set(cs.run_names())
    assert all(r["identical"] and r["compared_steps"] == 5 for r in reports)
    # ... and fails loudly when nothing is left to resume from.
    shutil.rmtree(out / "checkpoints")
    failed = restart_verification(out=str(out), return_state=True)
    assert failed.is_failed()
    assert "no_usable_restart" in failed.message and "no run" in failed.message


def test_a_killed_campaign_resumes_from_its_last_good_checkpoint(tmp_path):
    """`campaign run` killed (SIGKILL) mid-training; the rerun clears the dead holder's GPU slot,
    resumes the run from its last checkpoint instead of step 0, and completes."""
    import os
    import signal
    import time

    def edit(data: dict[str, Any]) -> None:
        data["control"].update(epochs=150)  # ~3000 steps: killed in the middle, at step 400+
        data["variants"] = []
        data["calendar"] = [s for s in data["calendar"] if s.get("run") in (None, "control")]
        data["checkpoint"] = {"every_steps": 200, "keep": 3}

    spec = tiny_campaign(tmp_path, edit=edit)
    out = tmp_path / "out"
    proc = start_campaign_run(spec, out=out)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            # A checkpoint counts once LATEST points to it (a step folder alone may be
            # half-written).
            latest = [
                json.loads(p.read_text())["step"]
                for p in (out / "checkpoints").glob("control-*/LATEST")
            ]
            if latest and latest[0] >= 400:
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the campaign ended before it could be interrupted"
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert not (out / "manifest.json").exists()

    rerun = campaign_cli("run", str(spec), "--out", str(out), cwd=ROOT)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    rid = next(p.name for p in (out / "runs").iterdir())
    result = json.loads((out / "runs" / rid / "result.json").read_text())
    assert result["resumed_from_step"] >= 400 and result["completed"]
    said = (rerun.stderr + rerun.stdout).lower()
    assert "took over the lock" in said  # the killed run's folder lock, named and taken over
    trained = [r for r in timeline_rows(out) if r["phase"] == "train"]
    assert trained and trained[-1]["steps"] == result["steps_done"] - result["resumed_from_step"]
    assert verify_output(out, reload=False).verified
