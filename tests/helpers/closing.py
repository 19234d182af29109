"""Build a small, real, closed output folder for the close/verify tests.

Two tiny MLPs (a control and a variant) are trained a few steps on a synthetic corpus, saved
with safetensors, and their predictions written on CPU; the records a campaign writes (plan,
timeline, decisions, stops, pilot measures, results) are written with the library's writers,
then the folder is closed and sealed by the production close. No Prefect, no mock.
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

from gpucampaign.builtin import build_model, fit_input_stats
from gpucampaign.close.closing import analyse_runs, close_folder, seal_folder
from gpucampaign.config import load_spec
from gpucampaign.data.corpus import load_corpus
from gpucampaign.folder.layout import RESULT_FILE, OutputFolder
from gpucampaign.folder.records import (
    AFTER_PILOT,
    DecisionRecord,
    StopRecord,
    TimelineRow,
    append_decision,
    append_stop,
    append_timeline,
    write_pilot,
)
from gpucampaign.folder.runresult import RunResult
from gpucampaign.modelfolder import save_model_dir
from gpucampaign.plan import calendar
from gpucampaign.plan.decision import Decision

SPEC_TEMPLATE = """
name: closing-test
question: Does a wider hidden layer beat the control by 2 points of accuracy?
packages:
  - {{gpu: rtx4090, days: 3, count: 1}}
control: {{recipe: mlp, hidden: [8], lr: 0.05, epochs: 1, max_steps: 6, batch_size: 16, threads: 1}}
variants:
  - {{name: wide, tier: useful, changes: {{hidden: [16]}}}}
decision_rule: {{metric: accuracy, direction: maximize, threshold: {threshold}, min_gain: 0.02}}
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


def _train(spec: Any, run: str, corpus: Any, run_dir: Path, folder: OutputFolder) -> None:
    cfg = spec.run_config(run)
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    train = corpus.split("train")
    X, y = train.tensors()
    model = build_model(cfg, n_features=corpus.n_features, n_classes=corpus.n_classes)
    fit_input_stats(model, X)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
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
                rows.append(
                    {
                        "kind": "eval",
                        "split": "test",
                        "step": step,
                        "eval_s": 0.01,
                        "accuracy": float((logits.argmax(1) == ty).float().mean()),
                        "loss": torch.nn.functional.cross_entropy(logits, ty).item(),
                    }
                )
            rows.append({"kind": "checkpoint", "step": step, "save_s": 0.02, "bytes": 1234})
        for rec in rows:
            folder.append_jsonl(f"{run_dir.relative_to(folder.root).as_posix()}/metrics.jsonl", rec)
    save_model_dir(
        model,
        run_dir / "model",
        config=cfg,
        n_features=corpus.n_features,
        n_classes=corpus.n_classes,
    )
    folder.write_json(
        f"{run_dir.relative_to(folder.root).as_posix()}/params.json",
        {"run": run, "run_id": spec.resolve_run(run).run_id, "config": cfg.model_dump(mode="json")},
    )
    tx, ty = corpus.split("test").tensors()
    with torch.no_grad():
        accuracy = float((model(tx).argmax(1) == ty).float().mean())
    steps = cfg.max_steps or 4
    result = RunResult(
        run_id=spec.resolve_run(run).run_id,
        run=run,
        completed=True,
        steps_done=steps,
        planned_steps=steps,
        metrics={"accuracy": accuracy},
        timings={},
        n_checkpoints=steps // 3,
        checkpoint_every=3,
        save_interval=None,
        resumed_from_step=None,
    )
    folder.write_json(
        f"{run_dir.relative_to(folder.root).as_posix()}/{RESULT_FILE}", result.to_dict()
    )


def _interval(
    step: str, *, phase: str, start: datetime, seconds: float, **fields: Any
) -> TimelineRow:
    return TimelineRow.between(
        step, phase=phase, start=start, end=start + timedelta(seconds=seconds), **fields
    )


def _write_records(folder: OutputFolder, spec: Any, corpus: Any, *, stop_variant: bool) -> None:
    """What the campaign's phases write before the close: timeline, decision, stops, runs."""
    t0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
    append_timeline(
        folder.root, _interval("load", phase="load", start=t0, seconds=40, note="audit")
    )
    append_timeline(
        folder.root,
        _interval("prep", phase="human", kind="human", start=t0 - timedelta(hours=1), seconds=3600),
    )
    append_decision(
        folder.root,
        DecisionRecord(
            point=AFTER_PILOT,
            time=t0.isoformat(),
            decision=Decision(action="continue", reasons=["fits"]),
        ),
    )
    write_pilot(
        folder.root,
        {"control": {"load_s": 6.0, "step_s": 0.005, "eval_s": [0.01, 0.03], "save_s": [0.02]}},
    )
    t = t0 + timedelta(minutes=1)
    for run in spec.run_names():
        rid = spec.resolve_run(run).run_id
        if run == "wide" and stop_variant:
            append_stop(
                folder.root,
                StopRecord(
                    stop_id="stop-0123456789ab",
                    rule="non_finite_loss",
                    run_id=rid,
                    run=run,
                    step=3,
                    reason="loss became nan at step 3",
                ),
            )
            append_timeline(
                folder.root,
                _interval(run, phase="train", run=run, start=t, seconds=30, note="stopped"),
            )
            continue
        _train(spec, run, corpus, folder.run(rid).path, folder)
        append_timeline(
            folder.root, _interval(run, phase="train", run=run, start=t, seconds=90, steps=6)
        )
        append_timeline(
            folder.root,
            _interval(run, phase="save", run=run, start=t + timedelta(seconds=90), seconds=2),
        )
        t += timedelta(minutes=3)


def start_folder(spec_file: Path, *, corpus_file: Path, out: Path) -> tuple[Any, Any, OutputFolder]:
    """What a campaign's start leaves: ``(spec, corpus, folder)``, the output folder ``out``
    holding the spec's copy and the plan."""
    spec = load_spec(spec_file)
    folder = OutputFolder(out)
    folder.copy_in(spec_file, "spec.yaml")
    folder.write_plan_once(calendar.plan(spec).to_dict())
    return spec, load_corpus(corpus_file, corpus_spec=spec.corpus), folder


def close_and_seal(
    spec: Any, *, out: Path, base_dir: Path, corpus: Any, trained: list[str], campaign_id: str
) -> tuple[Any, Any]:
    """The production close of ``out`` (the trained runs analysed, then closed and sealed);
    ``(closed, report)``."""
    analyses = analyse_runs(spec, root=out, corpus=corpus, runs=trained)
    closed, report = close_folder(
        spec, root=out, base_dir=base_dir, campaign_id=campaign_id, analyses=analyses
    )
    seal_folder(spec, root=out, summary=closed.summary(campaign_id))
    return closed, report


def build_closed_folder(
    base: Path, *, threshold: float = 0.2, unit: str = "null", stop_variant: bool = False
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
    (src / "campaign.yaml").write_text(
        SPEC_TEMPLATE.format(sha=sha, threshold=threshold, unit=unit)
    )
    out = base / "out"
    spec, corpus, folder = start_folder(
        src / "campaign.yaml", corpus_file=src / "corpus.csv", out=out
    )
    _write_records(folder, spec, corpus, stop_variant=stop_variant)

    run_ids = {r: spec.resolve_run(r).run_id for r in spec.run_names()}
    trained = [r for r, rid in run_ids.items() if (out / "runs" / rid / RESULT_FILE).is_file()]
    closed, report = close_and_seal(
        spec, out=out, base_dir=src, corpus=corpus, trained=trained, campaign_id="closing-test-0001"
    )
    return {
        "out": out,
        "spec": spec,
        "run_ids": run_ids,
        "verdict": closed.verdict,
        "budget": closed.budget,
        "report": report,
    }


def reseal(out: Path) -> None:
    """Rebuild the manifest's file list after a test changed a file on purpose."""
    from gpucampaign.close.manifest import list_files
    from gpucampaign.core.files import sha256_file

    m = json.loads((out / "manifest.json").read_text())
    m["files"] = [
        {"path": rel, "size": (out / rel).stat().st_size, "sha256": sha256_file(out / rel)}
        for rel in list_files(out)
    ]
    (out / "manifest.json").write_text(json.dumps(m, indent=2, sort_keys=True) + "\n")


def train_every_run(spec: Any, *, folder: Any, corpus: Any) -> list[str]:
    """Train each run of ``spec`` into ``folder`` (checkpoints in its ``checkpoints/``); a stop
    rule is recorded in ``stops.jsonl``, as the campaign's task does. Returns the runs trained."""
    from gpucampaign.core.stoprules import StopRule
    from gpucampaign.engine.loop import train_run
    from gpucampaign.storage import LocalStore

    for run in spec.run_names():
        resolved = spec.resolve_run(run)
        try:
            train_run(
                spec,
                run=resolved,
                corpus=corpus,
                store=LocalStore(folder.root / "checkpoints"),
                run_folder=folder.run(resolved.run_id),
            )
        except StopRule as stop:
            folder.append_jsonl("stops.jsonl", stop.to_record())
    return spec.run_names()
