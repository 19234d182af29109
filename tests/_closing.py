"""Build a small, real, closed output folder for the close/verify tests.

Two tiny MLPs (a control and a variant) are trained a few steps on a synthetic corpus, saved
with safetensors, and their predictions written on CPU; then everything the close writes:
plan, timeline, decisions, verdict, budget, forecast vs actual, figures, report, RELOAD.md and
the manifest. No Prefect, no mock: the same library functions the flow calls.
"""

from __future__ import annotations

import csv
import hashlib
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpucampaign import calendar, figures
from gpucampaign.close import (
    actual_intervals,
    build_report,
    close_budget,
    decide_verdict,
    forecast_vs_actual,
    write_report,
)
from gpucampaign.corpus import load_corpus
from gpucampaign.folder import OutputFolder
from gpucampaign.manifest import (
    build_manifest,
    collect_environment,
    reference_corpus,
    write_reload_md,
)
from gpucampaign.predictions import error_analysis, read_predictions, write_run_predictions
from gpucampaign.recipes import build_model, fit_input_stats, save_model_dir
from gpucampaign.spec import load_spec

SPEC_TEMPLATE = """
name: closing-test
question: Does a wider hidden layer beat the control by 2 points of accuracy?
packages:
  - {{gpu: rtx4090, days: 3, count: 1}}
control: {{recipe: mlp, hidden: [8], lr: 0.05, epochs: 1, max_steps: 6, batch_size: 16, threads: 1}}
variants:
  - {{name: wide, tier: useful, changes: {{hidden: [16]}}}}
decision_rule: {{metric: accuracy, direction: maximize, threshold: {threshold}, min_gain: 0.02, split: test}}
corpus: {{path: corpus.csv, sha256: "{sha}"}}
deliveries: {{unit: {unit}}}
calendar:
  - {{name: prep, kind: human, hours: 2}}
  - {{name: load, kind: machine, resource: cpu, hours: 1, after: [prep], phase: audit}}
  - {{name: control, kind: machine, resource: gpu, hours: 3, after: [load], run: control}}
  - {{name: wide, kind: machine, resource: gpu, hours: 2, after: [load], run: wide, tier: useful}}
  - {{name: outputs, kind: machine, resource: cpu, hours: 1, after: [control, wide], phase: close}}
"""


def write_corpus(path: Path, *, n: int = 90, seed: int = 0) -> str:
    """A 3-class, 4-feature corpus with train/val/test splits; returns its sha256."""
    rng = np.random.RandomState(seed)
    rows = []
    for i in range(n):
        label = i % 3
        x = rng.normal(loc=label, scale=1.0, size=4)
        split = "test" if i % 5 == 0 else ("val" if i % 7 == 0 else "train")
        rows.append([f"r{i:03d}", split, label, *[f"{v:.4f}" for v in x]])
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["id", "split", "label", "f0", "f1", "f2", "f3"])
        w.writerows(rows)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _train(spec: Any, run: str, corpus: Any, run_dir: Path, folder: OutputFolder) -> list[dict[str, Any]]:
    cfg = spec.run_config(run)
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    train = corpus.split("train")
    X, y = train.tensors()
    model = build_model(cfg, n_features=corpus.n_features, n_classes=corpus.n_classes)
    fit_input_stats(model, X)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    metrics = []
    for step in range(1, (cfg.max_steps or 4) + 1):
        idx = torch.arange((step - 1) * cfg.batch_size, step * cfg.batch_size) % len(X)
        loss = torch.nn.functional.cross_entropy(model(X[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        rows = [{"kind": "train", "step": step, "loss": loss.item(), "lr": cfg.lr, "step_s": 0.004}]
        if step % 3 == 0:
            with torch.no_grad():
                tx, ty = corpus.split("test").tensors()
                logits = model(tx)
                rows.append({"kind": "eval", "split": "test", "step": step, "eval_s": 0.01,
                             "accuracy": float((logits.argmax(1) == ty).float().mean()),
                             "loss": torch.nn.functional.cross_entropy(logits, ty).item()})
            rows.append({"kind": "checkpoint", "step": step, "save_s": 0.02, "bytes": 1234})
        for rec in rows:
            metrics.append(rec)
            folder.append_jsonl(f"{run_dir.relative_to(folder.root).as_posix()}/metrics.jsonl", rec)
    save_model_dir(model, run_dir / "model", config=cfg, n_features=corpus.n_features, n_classes=corpus.n_classes)
    folder.write_json(
        f"{run_dir.relative_to(folder.root).as_posix()}/params.json",
        {"run": run, "run_id": spec.run_id(run), "config": cfg.model_dump(mode="json")},
    )
    write_run_predictions(folder.root, spec.run_id(run), corpus=corpus, split="test")
    return metrics


def build_closed_folder(
    base: Path,
    *,
    threshold: float = 0.2,
    unit: str = "null",
    stop_variant: bool = False,
) -> dict[str, Any]:
    """Write a spec + corpus under ``base/src`` and a closed output folder at ``base/out``.

    Args:
        base: an empty folder.
        threshold: the decision threshold (set it above 1 for a negative result).
        unit: the delivery unit in the spec (YAML, e.g. ``model`` or ``null``).
        stop_variant: the variant stops with a recorded stop instead of completing.

    Returns:
        ``{out, spec, run_ids, verdict, budget, report}``.
    """
    src = base / "src"
    src.mkdir(parents=True)
    sha = write_corpus(src / "corpus.csv")
    (src / "campaign.yaml").write_text(SPEC_TEMPLATE.format(sha=sha, threshold=threshold, unit=unit))
    spec = load_spec(src / "campaign.yaml")
    out = base / "out"
    folder = OutputFolder(out)
    folder.copy_in(src / "campaign.yaml", "spec.yaml")
    plan0 = calendar.plan(spec)
    folder.write_plan_once(plan0.to_dict())
    corpus = load_corpus(src / "corpus.csv", corpus_spec=spec.corpus)

    t0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
    folder.record_timeline("load", phase="load", start=t0, end=t0 + timedelta(seconds=40), note="audit")
    folder.record_timeline("prep", phase="human", kind="human", start=t0 - timedelta(hours=1), end=t0)
    decision = {
        "point": "after-pilot",
        "time": t0.isoformat(),
        "decision": {"action": "continue", "dropped_runs": [], "dropped_steps": [], "reasons": ["fits"], "by": "auto"},
    }
    folder.append_jsonl("decisions.jsonl", decision)

    run_ids = {r: spec.run_id(r) for r in spec.run_names()}
    metrics: dict[str, list[dict[str, Any]]] = {}
    expected: dict[str, dict[str, Any]] = {}
    stops: list[dict[str, Any]] = []
    t = t0 + timedelta(minutes=1)
    for run, rid in run_ids.items():
        if run == "wide" and stop_variant:
            stop = {"stop_id": "stop-0123456789ab", "rule": "non_finite_loss", "run_id": rid, "run": run,
                    "step": 3, "reason": "loss became nan at step 3"}
            folder.append_jsonl("stops.jsonl", stop)
            stops.append(stop)
            expected[rid] = {"run": run, "tier": spec.tier_of(run), "status": "stopped", "stop_id": stop["stop_id"]}
            folder.record_timeline(run, phase="train", run=run, start=t, end=t + timedelta(seconds=30), note="stopped")
            continue
        metrics[run] = _train(spec, run, corpus, folder.run_dir(rid), folder)
        folder.record_timeline(run, phase="train", run=run, start=t, end=t + timedelta(seconds=90), steps=6)
        folder.record_timeline(run, phase="save", run=run, start=t + timedelta(seconds=90), end=t + timedelta(seconds=92))
        t += timedelta(minutes=3)
        expected[rid] = {"run": run, "tier": spec.tier_of(run), "status": "completed"}

    preds = {r: read_predictions(out / "runs" / run_ids[r] / "predictions.csv") for r in metrics}
    runs_out = []
    for run, rid in run_ids.items():
        analysis = None
        if run in preds:
            analysis = error_analysis(
                preds[run], control=None if run == "control" else preds.get("control"),
                class_names=[str(c) for c in corpus.classes],
            )
            folder.write_json(f"runs/{rid}/error_analysis.json", analysis)
        runs_out.append({
            "run_id": rid, "run": run, "tier": expected[rid]["tier"], "status": expected[rid]["status"],
            "metric": None if analysis is None else analysis["accuracy"],
            "stop_id": expected[rid].get("stop_id"), "analysis": analysis,
        })
    rule = spec.decision_rule
    verdict = decide_verdict(
        rule,
        control_metric=runs_out[0]["metric"],
        variant_metrics={r["run"]: r["metric"] for r in runs_out[1:]},
        stops=stops,
    )
    deliveries = [
        {"id": r["run_id"], "content_sha256": hashlib.sha256(r["run_id"].encode()).hexdigest(),
         "accepted": r["status"] == "completed", "reason": "complete" if r["status"] == "completed" else "stopped"}
        for r in runs_out
    ]
    budget = close_budget(spec.packages, expenses=spec.expenses, deliveries=deliveries,
                          unit=spec.deliveries.unit, result_text=verdict.text)
    fva = forecast_vs_actual(
        folder.read_json("plan.json"), reforecast=None, timeline=folder.read_jsonl("timeline.jsonl"),
        decisions=folder.read_jsonl("decisions.jsonl"), stops=stops, metrics=metrics,
        pilot={"control": {"load_s": 6.0, "step_s": 0.005, "eval_s": [0.01, 0.03], "save_s": [0.02]}},
    )
    figs = {
        "calendar": "figures/calendar.png",
        "curves": "figures/curves.png",
        "confusion": "figures/confusion.png",
    }
    figures.plot_calendar(plan0, out / figs["calendar"], actual=actual_intervals(folder.read_jsonl("timeline.jsonl")))
    figures.plot_curves(metrics, out / figs["curves"])
    a0 = runs_out[0]["analysis"]
    figures.plot_confusion(a0["confusion"], a0["classes"], out / figs["confusion"], title="control")
    report = build_report(
        campaign_id="closing-test-0001", name=spec.name, question=spec.question, verdict=verdict,
        budget=budget, forecast=fva, runs=runs_out, stops=stops,
        decisions=folder.read_jsonl("decisions.jsonl"), figures=figs,
    )
    write_report(out, report)
    corpus_ref = reference_corpus(out, src / "corpus.csv", sha256=sha)
    env = collect_environment()
    write_reload_md(out, runs={rid: r for r, rid in run_ids.items() if r in metrics}, corpus_ref=corpus_ref,
                    environment=env)
    build_manifest(
        out, spec=spec, campaign_id="closing-test-0001", expected_runs=expected, verdict=verdict,
        stops=stops, decisions=folder.read_jsonl("decisions.jsonl"), budget=budget, environment=env,
        corpus_ref=corpus_ref,
    )
    return {"out": out, "spec": spec, "run_ids": run_ids, "verdict": verdict, "budget": budget, "report": report}


def reseal(out: Path) -> None:
    """Rebuild the manifest's file list after a test changed a file on purpose."""
    from gpucampaign.files import sha256_file
    from gpucampaign.manifest import list_files

    m = json.loads((out / "manifest.json").read_text())
    m["files"] = [
        {"path": rel, "size": (out / rel).stat().st_size, "sha256": sha256_file(out / rel)} for rel in list_files(out)
    ]
    (out / "manifest.json").write_text(json.dumps(m, indent=2, sort_keys=True) + "\n")
