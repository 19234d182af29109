"""Decisions from evidence: chosen on val, reported on test, with a paired-bootstrap interval.

Each case writes its own small table corpus, trains the built-in ``mlp`` for real, and closes
the folder with the production close: no mock.
"""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from gpucampaign.cli import app
from gpucampaign.close.bootstrap import Gain, paired_gain, to_resolve
from gpucampaign.close.error_analysis import Predictions
from gpucampaign.config import load_spec
from gpucampaign.data.corpus import load_corpus
from gpucampaign.engine.loop import train_run
from gpucampaign.folder.layout import OutputFolder
from gpucampaign.storage import LocalStore
from gpucampaign.verify.checks import verify_output
from tests.helpers import close_and_seal, start_folder, train_every_run

LEARNS = {"recipe": "mlp", "hidden": [8], "lr": 0.05, "epochs": 4, "batch_size": 32, "threads": 1}
LEARNS_NOTHING = {"lr": 1e-9}


def write_table(
    path: Path, *, n: dict[str, int], flip_test: bool = False, noise: float = 0.0, seed: int = 0
) -> str:
    """A two-class table: the label is ``f0 > 0`` (flipped with probability ``noise``; every
    test label flipped with ``flip_test``). Returns the file's sha256."""
    rng = np.random.RandomState(seed)
    rows = []
    for split, count in n.items():
        for i in range(count):
            x = rng.normal(size=3)
            y = int(x[0] > 0)
            if rng.rand() < noise or (flip_test and split == "test"):
                y = 1 - y
            rows.append([f"{split}{i:04d}", split, y, *[f"{v:.5f}" for v in x]])
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["id", "split", "label", "f0", "f1", "f2"])
        w.writerows(rows)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def campaign(
    base: Path,
    *,
    sha: str,
    variants: list[dict[str, Any]],
    rule: dict[str, Any],
    stop_rules: dict[str, Any] | None = None,
    control: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Train every run of a small campaign for real, then close and seal its output folder."""
    spec_data = {
        "name": "evidence",
        "question": "Does the variant beat the control?",
        "packages": [{"gpu": "rtx4090", "days": 3}],
        "corpus": {"path": "corpus.csv", "sha256": sha},
        "control": {**LEARNS, **(control or {})},
        "variants": variants,
        "decision_rule": {"metric": "accuracy", "direction": "maximize", **rule},
        "stop_rules": {"require_restart": False, **(stop_rules or {})},
        "calendar": [
            {"name": "control", "kind": "machine", "resource": "gpu", "hours": 2, "run": "control"},
            *[
                {
                    "name": v["name"],
                    "kind": "machine",
                    "resource": "gpu",
                    "hours": 1,
                    "run": v["name"],
                    "tier": "useful",
                }
                for v in variants
            ],
        ],
    }
    (base / "campaign.yaml").write_text(yaml.safe_dump(spec_data, sort_keys=False))
    out = base / "out"
    spec, corpus, folder = start_folder(
        base / "campaign.yaml", corpus_file=base / "corpus.csv", out=out
    )
    trained = train_every_run(spec, folder=folder, corpus=corpus)
    closed, report = close_and_seal(
        spec, out=out, base_dir=base, corpus=corpus, trained=trained, campaign_id="evidence-0001"
    )
    return {"out": out, "verdict": closed.verdict, "report": report, "spec": spec}


def test_the_verdict_follows_val_and_says_when_test_disagrees(tmp_path: Path):
    # Test labels are the opposite of train/val: the control, which learns, is best on val;
    # the variant, which learns nothing, is best on test.
    sha = write_table(
        tmp_path / "corpus.csv", n={"train": 200, "val": 100, "test": 100}, flip_test=True
    )
    got = campaign(
        tmp_path,
        sha=sha,
        variants=[{"name": "idle", "changes": LEARNS_NOTHING}],
        rule={"threshold": 0.3, "min_gain": 0.05},
        # 'idle' trains to its end (neither stopped as futile nor as not learning): its gains.
        stop_rules={"not_learning": False, "futility": False},
    )
    v = got["verdict"]
    assert v.kind == "negative" and v.run == "control"
    assert v.variants["idle"]["val"]["gain"] < 0 < v.variants["idle"]["test"]["gain"] - 0.05
    assert v.test_disagrees
    assert "on test 'idle' would be chosen, on val no variant; the verdict follows val" in v.text


def test_a_gain_below_min_gain_is_negative(tmp_path: Path):
    sha = write_table(tmp_path / "corpus.csv", n={"train": 200, "val": 100, "test": 100})
    got = campaign(
        tmp_path,
        sha=sha,
        variants=[{"name": "seed1", "changes": {"seed": 1}}],
        rule={"threshold": 0.5, "min_gain": 0.2},
        stop_rules={"futility": False},  # to its end: a futile variant has no final gain
    )
    v = got["verdict"]
    assert (v.kind, v.run) == ("negative", "control")
    assert abs(v.variants["seed1"]["val"]["gain"]) < 0.2
    assert "do not beat the control by the min gain 0.2" in v.text


@pytest.mark.process  # the models reload in a fresh process
def test_an_unreachable_threshold_without_the_stop_is_negative_and_the_folder_verifies(
    tmp_path: Path,
):
    sha = write_table(tmp_path / "corpus.csv", n={"train": 200, "val": 60, "test": 60})
    got = campaign(
        tmp_path,
        sha=sha,
        variants=[{"name": "wide", "changes": {"hidden": [16]}}],
        rule={"threshold": 1.01, "min_gain": 0.0},
        stop_rules={"below_threshold": False, "futility": False},  # 'wide' to its end
    )
    v = got["verdict"]
    assert (v.kind, v.run) == ("negative", None)
    assert "no variant meets the threshold on val, and neither does the control" in v.text
    answer = (got["out"] / "report.md").read_text().split("\n\n")[2]
    assert answer.startswith("**Answer:** No: no variant reaches the threshold 1.01")
    assert "(the best on val: 'wide' improves accuracy over the control by" in answer
    assert "on test (95% CI [" in answer and answer.endswith("Verdict: negative.")
    report = verify_output(got["out"], reload=True)
    assert report.verified, report.problems

    summary = json.loads(CliRunner().invoke(app, ["report", str(got["out"]), "--json"]).output)
    verdict = summary["verdict"]
    assert (verdict["kind"], verdict["select_split"], verdict["report_split"]) == (
        "negative",
        "val",
        "test",
    )
    for split in ("val", "test"):
        entry = verdict["variants"]["wide"][split]
        low, high = entry["gain_ci95"]
        assert low <= entry["gain"] <= high


def test_a_straddling_interval_is_inconclusive_with_the_evidence_needed(tmp_path: Path):
    # Noisy labels and a small test split: the variant learns, the control does not; the
    # gain on test is real but its interval is wide.
    sha = write_table(
        tmp_path / "corpus.csv", n={"train": 300, "val": 300, "test": 40}, noise=0.3, seed=3
    )
    got = campaign(
        tmp_path,
        sha=sha,
        variants=[{"name": "learns", "changes": {"lr": 0.05}}],
        rule={"threshold": 0.3, "min_gain": 0.1},
        control=LEARNS_NOTHING,
    )
    v = got["verdict"]
    assert (v.kind, v.run) == ("inconclusive", "learns"), v.text
    low, high = v.variants["learns"]["test"]["gain_ci95"]
    assert low < 0.1 < high
    # One seed a side: training noise is not measured, so only seeds can settle it (up to the
    # plan's three a side), never more examples alone.
    assert v.resolve["more_examples"] is None and v.resolve["more_seeds"] == 2
    assert "training noise is not measured" in v.answer
    # Priced from the runs' measured training time, not from the calendar's allotted hours.
    spec, out = got["spec"], got["out"]
    measured = [
        json.loads((out / "runs" / spec.resolve_run(r).run_id / "result.json").read_text())[
            "timings"
        ]["steps_s_sum"]
        for r in ("control", "learns")
    ]
    # Each run's time is kept to the microsecond (closing.py): a fast pair of runs needs abs.
    assert v.resolve["seed_s"] == pytest.approx(sum(measured), rel=1e-5, abs=2e-6)
    gpu_hours = v.resolve["more_seeds"] * v.resolve["seed_s"] / 3600
    assert v.resolve["gpu_hours"] == pytest.approx(gpu_hours, rel=1e-5)
    assert gpu_hours < 0.01  # seconds of training, where the calendar allotted 3 h a seed
    # ... and as the share of the lot's price: a 3-day rtx4090 lot, 72 GPU hours.
    lot = 47.14
    assert v.resolve["usd"] == pytest.approx(gpu_hours * lot / 72, rel=1e-5)
    assert v.resolve["lot_share"] == pytest.approx(gpu_hours / 72, rel=1e-4)
    assert "more examples alone cannot settle it" in v.text
    assert "s of measured training) = " in v.text
    assert f"of the {lot:.2f} USD for 72 GPU hours" in v.text and "calendar" not in v.text
    assert "2 more seed(s) of both 'control' and 'learns': 2 x (" in v.answer
    report = " ".join((out / "report.md").read_text().split())
    assert "'learns' against the control on test: one seed a side; training noise is not" in (
        report
    )


# --- the bootstrap itself ----------------------------------------------------------------------
def _preds(correct: list[bool]) -> Predictions:
    n = len(correct)
    return Predictions(
        tuple(f"r{i}" for i in range(n)),
        (1,) * n,
        tuple(1 if c else 0 for c in correct),
        (0.9,) * n,
    )


def test_paired_bootstrap_is_seeded_and_exact_for_a_copy():
    rng = np.random.RandomState(0)
    control = _preds(list(rng.rand(200) < 0.7))
    variant = _preds(list(rng.rand(200) < 0.8))
    a = paired_gain([control], [variant], metric="accuracy", seed=7)
    assert a == paired_gain([control], [variant], metric="accuracy", seed=7)
    assert a is not None and a.ci95[0] < a.gain < a.ci95[1] and a.n == 200
    copy = paired_gain([control], [control], metric="accuracy")
    assert copy is not None and (copy.gain, copy.ci95) == (0.0, (0.0, 0.0))
    f1 = paired_gain([control], [variant], metric="macro_f1", samples=200)
    assert f1 is not None and f1.ci95[0] <= f1.gain <= f1.ci95[1]
    assert paired_gain([control], [variant], metric="loss") is None


@pytest.mark.parametrize(("n", "reps"), [(100, 1), (400, 3)])
def test_evidence_needed_scales_with_the_square_of_the_ratio(n: int, reps: int):
    g = Gain(gain=0.05, ci95=(-0.05, 0.15), n=n, replicates=reps)
    need = to_resolve(g, min_gain=0.0)
    assert need["factor"] == pytest.approx(4.0)
    assert need["more_examples"] == 3 * n and need["more_seeds"] == 3 * reps


def test_seed_replicates_run_as_their_own_runs_and_the_verdict_uses_them(tmp_path: Path):
    sha = write_table(tmp_path / "corpus.csv", n={"train": 200, "val": 80, "test": 80})
    got = campaign(
        tmp_path,
        sha=sha,
        variants=[{"name": "wide", "changes": {"hidden": [16]}, "seeds": [0, 1]}],
        rule={"threshold": 0.3, "min_gain": 0.05},
        control={"seeds": [0, 1]},
        stop_rules={"futility": False},  # every replicate to its end ('wide' cannot gain 0.05)
    )
    spec, v = got["spec"], got["verdict"]
    assert spec.run_names() == ["control", "control.s1", "wide", "wide.s1"]
    assert spec.run_config("wide.s1").seed == 1 and spec.run_config("wide").hidden == (16,)
    assert len({spec.resolve_run(r).run_id for r in spec.run_names()}) == 4
    # The control's seed runs are as essential as the control (the adoption needs them).
    assert spec.tier_of("control.s1") == "essential" and spec.tier_of("wide.s1") == "useful"
    assert v.variants["wide"]["test"]["replicates"] == 2
    states = json.loads((got["out"] / "manifest.json").read_text())["runs"]
    assert {info["status"] for info in states.values()} == {"completed"}


# --- the decision point uses the pilots' evidence ---------------------------------------------
def _pilots(base: Path, *, variants: list[dict[str, Any]], steps: int = 6) -> tuple[Any, dict]:
    """Pilot every run of a small campaign for real; returns the spec and the measures."""
    from gpucampaign.folder.metrics import read_metrics
    from gpucampaign.plan.decision import early_losses
    from gpucampaign.plan.reforecast import pilot_measures

    sha = write_table(base / "corpus.csv", n={"train": 200, "val": 60, "test": 60})
    data = {
        "name": "pilots",
        "packages": [{"gpu": "rtx4090", "days": 3}],
        "corpus": {"path": "corpus.csv", "sha256": sha},
        "control": LEARNS,
        "variants": variants,
        "decision_rule": {"metric": "accuracy", "threshold": 0.5},
        "pilot": {"steps": steps},
        "calendar": [
            {"name": "control", "kind": "machine", "resource": "gpu", "hours": 2, "run": "control"}
        ]
        + [
            {
                "name": v["name"],
                "kind": "machine",
                "resource": "gpu",
                "hours": 1,
                "run": v["name"],
                "tier": v.get("tier", "useful"),
            }
            for v in variants
        ],
    }
    (base / "campaign.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    spec = load_spec(base / "campaign.yaml")
    corpus = load_corpus(base / "corpus.csv", corpus_spec=spec.corpus)
    folder = OutputFolder(base / "out")
    measured = {}
    for run in spec.run_names():
        rdir = folder.run(spec.resolve_run(run).run_id).path
        result = train_run(
            spec,
            run=spec.resolve_run(run),
            corpus=corpus,
            store=LocalStore(base / "out" / "ckpt"),
            run_folder=folder.run(spec.resolve_run(run).run_id),
            stop_after_steps=steps,
        )
        losses = early_losses(read_metrics(rdir / "metrics.jsonl"), steps=steps)
        measured[run] = pilot_measures(
            spec.resolve_run(run), result=result, n_train=200, losses=losses
        )
    return spec, measured


def test_a_copy_of_the_control_in_effect_is_flagged_low_information(tmp_path: Path):
    from gpucampaign.plan.decision import decide_after_pilot, decision_markdown

    # A cap of 10^6 steps never binds: the variant trains exactly as the control does.
    spec, measured = _pilots(
        tmp_path,
        variants=[
            {"name": "same", "changes": {"max_steps": 1000000}},
            {"name": "faster", "changes": {"lr": 0.2}},
        ],
    )
    assert len(measured["same"]["early_losses"]) == 6
    refo = decide_after_pilot(spec, catalog=None, pilot=measured, pilot_stops=[])
    d = refo.decision
    assert d.action == "continue" and d.inputs["low_information"] == ["same"]
    assert any(r.startswith("low information: the early loss curve of 'same'") for r in d.reasons)
    md = decision_markdown(d, refo.hours, pilot=measured)
    assert "| same |" in md and "low information: same curve as the control" in md
    # Each run is re-forecast from its own pilot, not scaled from the control's.
    assert all(f"pilot of '{s.run}'" in refo.hours[s.name][1] for s in spec.calendar)


def test_an_optional_run_whose_pilot_tripped_a_stop_is_dropped_and_the_form_offers_choices(
    tmp_path: Path,
):
    from gpucampaign.plan.decision import decide_after_pilot, decision_form

    spec, measured = _pilots(
        tmp_path,
        variants=[
            {"name": "wide", "changes": {"hidden": [16]}},
            {"name": "odd", "changes": {"lr": 0.3}, "tier": "exploratory"},
        ],
    )
    stop = {"stop_id": "stop-x", "rule": "non_finite_loss", "run": "odd", "reason": "nan at 3"}
    d = decide_after_pilot(spec, catalog=None, pilot=measured, pilot_stops=[stop]).decision
    assert (d.action, d.dropped_runs, d.dropped_steps) == ("reduce", ["odd"], ["odd"])
    assert d.inputs["low_information"] == []  # a wider layer learns differently from step 1
    assert "its pilot tripped non_finite_loss (nan at 3), so it cannot change the choice" in (
        "; ".join(d.reasons)
    )

    form = decision_form(spec, auto=d)
    filled = form()
    assert (filled.action, filled.drop) == ("reduce", ["odd"])  # the proposal pre-selected
    schema = form.model_json_schema()
    assert schema["properties"]["drop"]["items"]["enum"] == ["wide", "odd"]  # never the control
    with pytest.raises(ValueError, match="control"):
        form(action="reduce", drop=["control"])


@pytest.mark.process  # the models reload in a fresh process
def test_a_control_stopped_by_the_quality_floor_is_evidence_with_predictions_and_a_reload(
    tmp_path: Path,
):
    from gpucampaign.core.stoprules import STOP_RULES, NonFiniteLoss, stops_the_campaign

    sha = write_table(tmp_path / "corpus.csv", n={"train": 200, "val": 80, "test": 80})
    got = campaign(
        tmp_path,
        sha=sha,
        variants=[{"name": "learns", "changes": {"lr": 0.05}}],
        rule={"threshold": 0.8, "min_gain": 0.05},
        control=LEARNS_NOTHING,  # the control misses the threshold: the floor stops it
    )
    out, spec, v = got["out"], got["spec"], got["verdict"]
    stops = [json.loads(line) for line in (out / "stops.jsonl").read_text().splitlines()]
    assert [s["rule"] for s in stops] == ["below_threshold"]
    assert stops[0]["run_id"] == spec.resolve_run("control").run_id
    # A decision all the same: the stopped control's values are evidence, and the stop is said.
    # One seed a side: chosen, not adopted (training noise is not measured).
    assert (v.kind, v.run) == ("inconclusive", "learns"), v.text
    assert v.answer.startswith("Not yet: 'learns' improves accuracy over the control by")
    assert "training noise is not measured" in v.answer
    assert f"'control' stopped by below_threshold ({stops[0]['stop_id']})" in v.text
    assert "below the floor 0.8" in v.text
    # Its model got predictions and scores, and reloads in a fresh process like any other.
    rdir = out / "runs" / spec.resolve_run("control").run_id
    assert (rdir / "predictions.csv").is_file() and (rdir / "scores-val.csv").is_file()
    report = verify_output(out, reload=True)
    assert report.verified, report.problems
    assert sorted(report.reloaded_runs) == sorted(
        spec.resolve_run(r).run_id for r in spec.run_names()
    )
    # The flow stops the campaign only for a stop that leaves no evidence.
    recorded = STOP_RULES[stops[0]["rule"]](stops[0]["run_id"], stops[0]["reason"])
    assert not stops_the_campaign(recorded)
    assert stops_the_campaign(NonFiniteLoss("control-0123456789", "loss is nan"))
