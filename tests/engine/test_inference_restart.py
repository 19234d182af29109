"""`resume: inference`: an interrupted run is not trained further; its last good model is kept,
evaluated and recorded as interrupted (never an accepted delivery); `resume: training` resumes
learning instead."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from gpucampaign.close.closing import analyse_runs, delivery
from gpucampaign.close.evidence import run_evidence
from gpucampaign.close.report import _resume_md
from gpucampaign.core import interrupt
from gpucampaign.core.files import utc_now
from gpucampaign.core.interrupt import Interrupted
from gpucampaign.core.stoprules import InterruptedRun
from gpucampaign.folder.layout import IN_PROGRESS_FILE
from gpucampaign.folder.records import (
    StopRecord,
    append_stop,
    read_stops,
    run_states,
    runs_with_model,
)
from tests.helpers import corpus_of, digits_file, make_spec, run, run_dir, train_losses  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _no_stop_left():
    interrupt.clear_stop()
    yield
    interrupt.clear_stop()


def _interrupt_at(spec: Any, base: Path, step: int) -> int:
    """Train until a stop request at ``step`` (a Ctrl-C); returns the step saved."""

    def stop(info: dict[str, Any]) -> None:
        if info["step"] >= step:
            interrupt.request_stop("SIGINT")

    with pytest.raises(Interrupted) as err:
        run(spec, base, progress=stop)
    interrupt.clear_stop()
    assert err.value.step is not None
    return err.value.step


def _checkpoint_weights(spec: Any, base: Path, step: int) -> dict[str, torch.Tensor]:
    folder = base / "out" / "checkpoints" / spec.resolve_run("control").run_id / f"step-{step:09d}"
    return load_file(folder / "model.safetensors")


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_resume_training_resumes_learning_after_a_stop(tmp_path, digits_file):  # noqa: F811
    spec = make_spec(tmp_path, digits_file, control={"resume": "training"})
    step = _interrupt_at(spec, tmp_path, 7)
    assert (run_dir(spec, tmp_path) / IN_PROGRESS_FILE).is_file()  # the call was cut
    res = run(spec, tmp_path)
    assert res.completed and res.resumed_from_step == step and res.steps_done == 20
    assert res.interrupted is None and res.stop is None
    assert not (run_dir(spec, tmp_path) / IN_PROGRESS_FILE).exists()


def test_resume_inference_keeps_the_last_good_model_and_records_an_interruption(
    tmp_path,
    digits_file,  # noqa: F811
):
    spec = make_spec(tmp_path, digits_file, control={"resume": "inference"})
    rdir, out = run_dir(spec, tmp_path), tmp_path / "out"
    step = _interrupt_at(spec, tmp_path, 7)
    assert 7 <= step < 20

    with pytest.raises(InterruptedRun) as err:
        run(spec, tmp_path)
    stop = err.value
    assert stop.rule == "interrupted" and stop.step == step
    assert f"interrupted at step {step} of 20 (SIGINT)" in stop.reason

    # Not trained further: the training rows stop at the step saved.
    assert [s for s, _ in train_losses(rdir / "metrics.jsonl")] == list(range(1, step + 1))
    # The run's model is the last good checkpoint's, as written and verified.
    assert _same(
        load_file(rdir / "model" / "model.safetensors"), _checkpoint_weights(spec, tmp_path, step)
    )
    assert json.loads((rdir / "model" / "config.json").read_text())["steps"] == step
    result = json.loads((rdir / "result.json").read_text())
    assert result["completed"] is False and result["steps_done"] == step
    assert result["stop"]["rule"] == "interrupted" and result["stop"]["stop_id"] == stop.stop_id
    assert result["interrupted"] == {
        "reason": "SIGINT",
        "reached_step": step,
        "checkpoint_step": step,
        "target_step": 20,
        "planned_steps": 20,
        "lost_steps": 0,
        "restart": "inference",
    }
    assert result["metrics"]["accuracy"] == result["eval_metrics"]["test"]["accuracy"]
    assert not (rdir / IN_PROGRESS_FILE).exists()

    # The run is finished: a later start raises the same stop and trains nothing.
    with pytest.raises(InterruptedRun) as again:
        run(spec, tmp_path)
    assert again.value.stop_id == stop.stop_id
    assert len(train_losses(rdir / "metrics.jsonl")) == step

    # The campaign's records: interrupted, predictions from that model, never a delivery.
    append_stop(
        out, StopRecord.from_dict({**stop.to_record(), "run": "control", "time": utc_now()})
    )
    states = run_states(spec, root=out)
    state = states[spec.resolve_run("control").run_id]
    assert state.status == "interrupted" and state.stop_id == stop.stop_id
    assert read_stops(out)[0].rule == "interrupted"
    assert runs_with_model(states, root=out) == ["control"]
    corpus = corpus_of(tmp_path, spec)
    analyse_runs(spec, root=out, corpus=corpus, runs=runs_with_model(states, root=out))
    assert (rdir / "predictions.csv").is_file() and (rdir / "error_analysis.json").is_file()
    got = delivery(out, state, corpus=corpus)
    assert got["accepted"] is False and got["reason"].startswith("interrupted")
    evidence = run_evidence(spec, root=out, states=states)["control"]
    assert evidence.status == "interrupted" and evidence.values["test"] is not None
    assert evidence.note == f"interrupted: the model of step {step} of 20"
    md = "\n".join(
        _resume_md(
            {
                "runs": [
                    {
                        "run": "control",
                        "run_id": spec.resolve_run("control").run_id,
                        "resume": "inference",
                        "interrupted": result["interrupted"],
                    }
                ]
            }
        )
    )
    assert f"interrupted at step {step} of 20 (SIGINT); inference restarted" in md


def test_a_pilot_stop_is_not_an_interruption(tmp_path, digits_file):  # noqa: F811
    spec = make_spec(tmp_path, digits_file, control={"resume": "inference"})
    pilot = run(spec, tmp_path, stop_after_steps=5)
    assert not pilot.completed and pilot.steps_done == 5
    assert not (run_dir(spec, tmp_path) / IN_PROGRESS_FILE).exists()
    res = run(spec, tmp_path)
    assert res.completed and res.resumed_from_step == 5 and res.steps_done == 20


def test_nothing_saved_before_the_interruption_starts_the_run_afresh(tmp_path, digits_file):  # noqa: F811
    spec = make_spec(tmp_path, digits_file, control={"resume": "inference"})
    rdir = run_dir(spec, tmp_path)
    rdir.mkdir(parents=True)
    # A mark as a process killed before its first save leaves it (no checkpoint).
    (rdir / IN_PROGRESS_FILE).write_text(
        json.dumps({"run_id": spec.resolve_run("control").run_id, "target": 20})
    )
    res = run(spec, tmp_path)
    assert res.completed and res.resumed_from_step is None


@pytest.mark.process
@pytest.mark.slow
def test_resume_inference_after_a_sigkill(tmp_path, digits_file):  # noqa: F811
    """SIGKILL at the 7th step, after the checkpoint of step 4: the rerun keeps the model of
    step 4 and records the 2 steps trained after it as lost."""
    spec = make_spec(
        tmp_path,
        digits_file,
        control={"resume": "inference"},
        checkpoint={"every_steps": 4, "keep": 2},
    )
    (tmp_path / "spec.json").write_text(json.dumps(spec.model_dump(mode="json")))
    env = {
        **os.environ,
        "FAULT_KILL": "train-step:7",
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH")])
        ),
    }
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "helpers" / "killrun.py"), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    rdir = run_dir(spec, tmp_path)
    assert (rdir / IN_PROGRESS_FILE).is_file()

    with pytest.raises(InterruptedRun) as err:
        run(spec, tmp_path)
    assert err.value.step == 4 and "SIGKILL, out of memory or a lost machine" in err.value.reason
    result = json.loads((rdir / "result.json").read_text())
    assert result["interrupted"]["reason"] == "killed"
    assert (result["interrupted"]["reached_step"], result["interrupted"]["lost_steps"]) == (6, 2)
    assert [s for s, _ in train_losses(rdir / "metrics.jsonl")] == [1, 2, 3, 4]
    assert _same(
        load_file(rdir / "model" / "model.safetensors"), _checkpoint_weights(spec, tmp_path, 4)
    )


# --- the whole campaign: interrupted, started again, closed and verified -------------------------
def _stop_when_trained(rdir: Path, *, steps: int, done: threading.Event) -> None:
    """Request a stop (as Ctrl-C does) once ``rdir`` has trained ``steps`` steps."""
    from gpucampaign.folder.metrics import read_metrics

    while not done.is_set():
        path = rdir / "metrics.jsonl"
        rows = read_metrics(path) if path.is_file() else []
        if sum(1 for r in rows if r["kind"] == "train") >= steps:
            interrupt.request_stop("SIGINT")
            return
        done.wait(0.05)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_campaign_restarts_inference_of_an_interrupted_variant_and_verifies(
    prefect_harness, tmp_path
):
    from gpucampaign.config import load_spec
    from gpucampaign.verify.checks import verify_output
    from tests.flows.test_campaign import run_flow, tiny_campaign

    def edit(data: dict[str, Any]) -> None:
        first = data["variants"][0]
        changes = {**first["changes"], "epochs": 200, "resume": "inference"}
        data["variants"] = [{**first, "changes": changes}]
        data["calendar"] = [
            s
            for s in data["calendar"]
            if s.get("run") in (None, "control", data["variants"][0]["name"])
        ]
        data["checkpoint"] = {"every_steps": 50, "keep": 2}

    spec_path = tiny_campaign(tmp_path, edit=edit)
    cs = load_spec(spec_path)
    variant = next(r for r in cs.run_names() if r != "control")
    rid = cs.resolve_run(variant).run_id
    out = tmp_path / "out"
    done = threading.Event()
    watcher = threading.Thread(
        target=_stop_when_trained, args=(out / "runs" / rid,), kwargs={"steps": 120, "done": done}
    )
    watcher.start()
    try:
        first = run_flow(spec_path, out)
    finally:
        done.set()
        watcher.join()
    assert not first.is_completed()
    interrupt.clear_stop()
    latest = json.loads((out / "checkpoints" / rid / "LATEST").read_text())["step"]
    assert latest >= 120 and not (out / "manifest.json").exists()

    second = run_flow(spec_path, out)
    assert second.is_completed(), second.message
    rdir = out / "runs" / rid
    result = json.loads((rdir / "result.json").read_text())
    assert result["completed"] is False and result["steps_done"] == latest
    assert result["interrupted"]["checkpoint_step"] == latest
    assert max(s for s, _ in train_losses(rdir / "metrics.jsonl")) == latest
    assert (rdir / "predictions.csv").is_file()
    manifest = json.loads((out / "manifest.json").read_text())
    entry = manifest["runs"][rid]
    assert entry["status"] == "interrupted" and entry["stop_id"] == result["stop"]["stop_id"]
    assert manifest["runs"][cs.resolve_run("control").run_id]["status"] == "completed"
    report = (out / "report.md").read_text()
    assert "interrupted at step" in report and "inference restarted" in report
    verified = verify_output(out)
    assert verified.verified, verified.problems
    assert rid in verified.reloaded_runs  # its kept model reloads and reproduces its predictions


# --- the verdict on an interrupted run's evidence ------------------------------------------------
def test_the_verdict_reads_an_interrupted_run_as_evidence_at_its_step():
    from gpucampaign.close.scores import Scores
    from gpucampaign.close.verdict import RunEvidence, decide_verdict
    from gpucampaign.config import DecisionRule

    rule = DecisionRule(metric="accuracy", threshold=0.9, min_gain=0.02)
    note = "interrupted: the model of step 50 of 300"

    def evidence(v: float, **kw: str) -> RunEvidence:
        # Every example scores the value, on two seeds: a zero-width interval on it.
        rows = tuple(Scores(("r0", "r1"), {"accuracy": (v, v)}, seed=k) for k in (0, 1))
        return RunEvidence(values={"val": v, "test": v}, scores={"val": rows, "test": rows}, **kw)

    def cut(v: float) -> RunEvidence:
        return evidence(v, status="interrupted", note=note)

    done = evidence(0.92)

    # Already clearing the rule at step 50: decisive, and the text says at which step.
    adopt = decide_verdict(rule, control=done, variants={"a": cut(0.97)})
    assert (adopt.kind, adopt.run) == ("adopt", "a") and note in adopt.text
    # Not clearing it at step 50 proves nothing about a complete run: not a complete negative.
    short = decide_verdict(rule, control=done, variants={"a": cut(0.91)})
    assert short.kind == "inconclusive" and "'a' stopped learning early" in short.text
    assert "Negative result (complete)" not in short.text
    # An interrupted control is no reference to compare with.
    ref = decide_verdict(rule, control=cut(0.92), variants={"a": done})
    assert ref.kind == "stopped" and "the control, the essential reference, was interrupted" in (
        ref.text
    )


def test_the_interruptions_count_an_inference_restart_apart_from_resumes():
    from gpucampaign.folder.records import TimelineRow
    from gpucampaign.folder.segments import interruptions

    rows = [
        TimelineRow(phase="train", run="a", outcome="interrupted: interrupted by SIGINT"),
        TimelineRow(phase="train", run="a", outcome="failed: interrupted: interrupted at step 5"),
        TimelineRow(phase="train", run="b", outcome="interrupted: killed"),
        TimelineRow(phase="train", run="b", outcome="ok"),
    ]
    info = interruptions(rows)
    assert info["resumes"] == {"b": 1} and info["inference_restarts"] == {"a": 1}
