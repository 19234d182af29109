"""Seeds as evidence: with replicates the paired bootstrap resamples the seeds, then the
examples, and says whether the seeds or the examples dominate the gain's variance.

The synthetic cases build per-example scores whose spread is known: a per-seed shift of the
variant (run-to-run noise) against a per-example difference (which examples the split holds).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpucampaign.close.bootstrap import DOMINATES, paired_gain, paired_mean_gain, to_resolve
from gpucampaign.close.error_analysis import Predictions
from gpucampaign.close.scores import Scores
from gpucampaign.close.verdict import RunEvidence, decide_verdict
from gpucampaign.config import DecisionRule
from tests.close.test_evidence import LEARNS, campaign, write_table

SEEDS = (0, 1, 2)


def _side(
    rng: np.random.Generator,
    *,
    base: np.ndarray,
    shifts: list[float],
    noise: float,
    seeds: tuple[int, ...] = SEEDS,
) -> list[Scores]:
    """One run's replicates: ``base`` per example, plus the seed's shift, plus a little noise
    of its own per example."""
    ids = tuple(f"e{i:04d}" for i in range(len(base)))
    return [
        Scores(ids, {"mse": tuple(base + shift + rng.normal(scale=noise, size=len(base)))}, seed=s)
        for s, shift in zip(seeds, shifts, strict=True)
    ]


def seeds_dominate(seed: int = 0) -> tuple[list[Scores], list[Scores]]:
    """The variant's three seeds land far apart (gains -0.2, +0.1, +0.4); the examples agree."""
    rng = np.random.default_rng(seed)
    base = rng.normal(size=300)
    control = _side(rng, base=base, shifts=[0.0, 0.0, 0.0], noise=0.01)
    variant = _side(rng, base=base, shifts=[-0.2, 0.1, 0.4], noise=0.01)
    return control, variant


def examples_dominate(seed: int = 0) -> tuple[list[Scores], list[Scores]]:
    """Every seed of the variant gains +0.1 on average, but example by example the gain
    spreads widely (the same examples for every seed); the seeds agree."""
    rng = np.random.default_rng(seed)
    base = rng.normal(size=300)
    per_example = rng.normal(scale=1.0, size=300)
    control = _side(rng, base=base, shifts=[0.0] * 3, noise=0.02)
    variant = _side(rng, base=base + per_example - per_example.mean(), shifts=[0.1] * 3, noise=0.02)
    return control, variant


def test_when_the_seeds_spread_the_seeds_dominate_and_the_interval_widens():
    control, variant = seeds_dominate()
    g = paired_mean_gain(control, variant, metric="mse")
    assert g is not None and g.dominates == "seeds" and g.paired_seeds
    assert (g.control_seeds, g.variant_seeds, g.replicates, g.n) == (SEEDS, SEEDS, 3, 300)
    assert g.seed_var is not None and g.example_var is not None
    assert g.seed_var > 100 * g.example_var
    assert g.gain == pytest.approx(0.1, abs=0.01)
    # One seed alone (or each seed alone) has a narrow interval around its own gain: the
    # interval over the seeds is wider than any of them, and covers them all.
    width = g.ci95[1] - g.ci95[0]
    for k in range(3):
        one = paired_mean_gain([control[k]], [variant[k]], metric="mse")
        assert one is not None and one.dominates is None and "seeds" not in one.to_dict()
        assert width > 10 * (one.ci95[1] - one.ci95[0])
    assert g.ci95[0] < -0.1 and g.ci95[1] > 0.3
    d = g.to_dict()
    assert d["dominates"] == "seeds" and d["seed_share"] > 0.99
    assert d["seeds"] == {"control": [0, 1, 2], "variant": [0, 1, 2], "paired": True}
    # More examples cannot narrow a width that comes from the seeds; more seeds can.
    need = to_resolve(g, min_gain=0.05)
    assert need["dominates"] == "seeds" and need["more_examples"] is None
    assert need["more_seeds"] is not None and need["more_seeds"] > 3


def test_when_the_examples_spread_the_examples_dominate():
    control, variant = examples_dominate()
    g = paired_mean_gain(control, variant, metric="mse")
    assert g is not None and g.dominates == "examples"
    assert g.seed_var is not None and g.example_var is not None
    assert g.example_var > 100 * g.seed_var
    need = to_resolve(g, min_gain=0.2)
    assert need["dominates"] == "examples" and need["more_seeds"] is None
    # The examples' share shrinks as one over their number; the seeds' share stays.
    target = (g.seed_var + g.example_var) / need["factor"]
    expected = 300 * g.example_var / (target - g.seed_var) - 300
    assert need["more_examples"] == pytest.approx(expected, abs=2) and expected > 0
    # The seeds agree, so the interval over them is about the one of a single seed: the
    # examples are one draw shared by the seeds, not one per seed (which would narrow it).
    one = paired_mean_gain(control[:1], variant[:1], metric="mse")
    assert one is not None
    assert (g.ci95[1] - g.ci95[0]) == pytest.approx(one.ci95[1] - one.ci95[0], rel=0.1)


#: Synthetic campaigns for the coverage test: the rate's standard error is 0.0063 at 95%.
COVERAGE_CASES = 1200


def test_the_hierarchical_interval_covers_the_true_gain():
    # Five seeds whose gains scatter around +0.1, examples that scatter around each seed's
    # gain: over 1200 synthetic campaigns (fixed generator seeds, not random) the "95%"
    # interval covers +0.1 in 95% of them, within about three standard errors on both sides
    # (too narrow, e.g. a variance divided twice, falls below; too wide rises above).
    covered, widths = 0, []
    for case in range(COVERAGE_CASES):
        rng = np.random.default_rng(1000 + case)
        base = rng.normal(size=200)
        per_example = rng.normal(scale=0.5, size=200)
        seeds = (0, 1, 2, 3, 4)
        control = _side(rng, base=base, shifts=[0.0] * 5, noise=0.05, seeds=seeds)
        shifts = list(0.1 + rng.normal(scale=0.03, size=5))
        variant = _side(rng, base=base + per_example, shifts=shifts, noise=0.05, seeds=seeds)
        g = paired_mean_gain(control, variant, metric="mse")
        assert g is not None
        covered += g.ci95[0] <= 0.1 <= g.ci95[1]
        widths.append(g.ci95[1] - g.ci95[0])
    # ... without being trivially wide: the gain's standard error is about 0.037 here.
    assert float(np.median(widths)) < 0.2
    rate = covered / COVERAGE_CASES
    assert 0.93 <= rate <= 0.97, rate


def test_the_interval_pairs_seeds_by_seed_not_by_order():
    control, variant = seeds_dominate()
    a = paired_mean_gain(control, variant, metric="mse")
    # The seeds pair by seed, not by the order they come in.
    shuffled = paired_mean_gain(control[::-1], variant[1:] + variant[:1], metric="mse")
    assert shuffled is not None and a is not None
    assert shuffled.gain == a.gain and shuffled.seed_var == a.seed_var and shuffled.ci95 == a.ci95


def test_sides_with_other_seeds_are_resampled_apart():
    control, variant = seeds_dominate()
    g = paired_mean_gain(control, variant[:1], metric="mse")
    assert g is not None and not g.paired_seeds and g.replicates == 1
    assert (g.control_seeds, g.variant_seeds) == (SEEDS, (0,))
    # The control's seeds agree, so the seeds' share is small, and measured on its side only.
    assert g.dominates == "examples"
    other = [Scores(s.ids, s.values, seed=s.seed + 10) for s in variant]  # type: ignore[operator]
    h = paired_mean_gain(control, other, metric="mse")
    assert h is not None and not h.paired_seeds and h.dominates == "seeds"


def test_predictions_of_several_seeds_give_a_hierarchical_interval_on_accuracy_and_f1():
    rng = np.random.default_rng(0)
    n = 200
    labels = rng.integers(0, 2, size=n)

    def preds(acc: float, seed: int) -> Predictions:
        right = rng.random(n) < acc
        return Predictions(
            tuple(f"r{i}" for i in range(n)),
            tuple(int(y) for y in labels),
            tuple(int(y if r else 1 - y) for y, r in zip(labels, right, strict=True)),
            (0.9,) * n,
            seed=seed,
        )

    control = [preds(0.7, s) for s in SEEDS]
    variant = [preds(a, s) for a, s in zip((0.6, 0.8, 0.95), SEEDS, strict=True)]
    for metric in ("accuracy", "macro_f1"):
        g = paired_gain(control, variant, metric=metric, samples=300)
        assert g is not None and g.paired_seeds and g.dominates == "seeds", metric
        assert g.ci95[0] <= g.gain <= g.ci95[1]


def test_the_verdict_names_the_seeds_and_proposes_the_dominant_evidence():
    rule = DecisionRule(metric="mse", direction="minimize", threshold=5.0, min_gain=0.05)
    control, variant = seeds_dominate()
    # minimize: the variant must score lower; flip the synthetic gains' sign.
    variant = [
        Scores(s.ids, {"mse": tuple(-np.asarray(s.values["mse"]))}, seed=s.seed) for s in variant
    ]
    control = [
        Scores(s.ids, {"mse": tuple(-np.asarray(s.values["mse"]))}, seed=s.seed) for s in control
    ]

    def ev(reps: list[Scores]) -> RunEvidence:
        value = float(np.mean([s.mean("mse") for s in reps]))
        return RunEvidence(
            values={"val": value, "test": value},
            scores={"val": tuple(reps), "test": tuple(reps)},
            train_s=2.0,
        )

    v = decide_verdict(rule, control=ev(control), variants={"wide": ev(variant)})
    assert v.kind == "inconclusive", v.text
    entry = v.variants["wide"]["test"]
    assert entry["dominates"] == "seeds" and entry["seeds"]["control"] == [0, 1, 2]
    assert "over 3 seeds (0, 1, 2) x 300 examples, seeds dominate]" in v.text
    assert "Seeds dominate: more seeds narrow it more than more examples" in v.text
    assert "more test examples alone cannot settle it" in v.text
    assert v.resolve is not None and v.resolve["more_examples"] is None
    assert v.resolve["more_seeds"] > 0 and v.resolve["gpu_hours"] == pytest.approx(
        v.resolve["more_seeds"] * 4.0 / 3600
    )
    assert f"{DOMINATES['seeds']}; {v.resolve['more_seeds']} more seed(s)" in v.answer
    assert "95% CI [" in v.answer and "over 3 seeds (0, 1, 2) x 300 examples" in v.answer


def test_a_campaign_with_seeds_reports_them_and_which_dominates(tmp_path: Path):
    sha = write_table(tmp_path / "corpus.csv", n={"train": 200, "val": 80, "test": 80})
    got = campaign(
        tmp_path,
        sha=sha,
        variants=[{"name": "wide", "changes": {"hidden": [16]}, "seeds": [0, 1, 2]}],
        rule={"threshold": 0.3, "min_gain": 0.05},
        control={**LEARNS, "seeds": [0, 1, 2]},
        stop_rules={"futility": False},  # every seed to its end: a futile seed has no gain
    )
    spec, v = got["spec"], got["verdict"]
    assert spec.run_names() == ["control", "control.s1", "control.s2", "wide", "wide.s1", "wide.s2"]
    entry = v.variants["wide"]["test"]
    assert entry["seeds"] == {"control": [0, 1, 2], "variant": [0, 1, 2], "paired": True}
    assert entry["replicates"] == 3 and entry["n"] == 80
    assert entry["dominates"] in ("seeds", "examples")
    assert entry["seed_var"] is not None and entry["example_var"] is not None
    low, high = entry["gain_ci95"]
    assert low <= entry["gain"] <= high
    assert "over 3 seeds (0, 1, 2) x 80 examples" in v.text
    md = (got["out"] / "report.md").read_text(encoding="utf-8")
    assert "**Seeds as evidence**" in md
    assert "'wide' against the control on test: 3 seeds (0, 1, 2) x 80 examples" in md
    assert DOMINATES[entry["dominates"]] in md


@pytest.mark.process  # the restart check resumes the run in new processes
def test_the_control_with_seeds_and_their_calendar_steps_checks_reports_and_verifies(
    tmp_path: Path,
):
    """``campaign plan`` asks for a calendar step per seed run ('control.s1'): the spec every
    dump carries (the restart check's child, the folder's copy) keeps the control's seeds."""
    import yaml

    from gpucampaign.config import parse_spec
    from gpucampaign.folder.layout import RESTART_FILE, OutputFolder
    from gpucampaign.restartcheck.earlysave import campaign_restart_check
    from gpucampaign.verify.checks import verify_output
    from tests.helpers import close_and_seal, start_folder, train_every_run

    sha = write_table(tmp_path / "corpus.csv", n={"train": 120, "val": 40, "test": 40})
    steps = [
        {"name": run, "kind": "machine", "resource": "gpu", "hours": 1, "run": run}
        for run in ("control", "control.s1", "wide")
    ]
    spec_data = {
        "name": "seeded",
        "question": "Does a wider layer beat the control?",
        "packages": [{"gpu": "rtx4090", "days": 3}],
        "corpus": {"path": "corpus.csv", "sha256": sha},
        "control": {**LEARNS, "epochs": 2, "seeds": [0, 1]},
        "variants": [{"name": "wide", "changes": {"hidden": [16]}, "seeds": [0, 1]}],
        "decision_rule": {"metric": "accuracy", "threshold": 0.3, "min_gain": 0.05},
        "stop_rules": {"futility": False},
        "calendar": steps,
    }
    (tmp_path / "campaign.yaml").write_text(yaml.safe_dump(spec_data, sort_keys=False))
    out = tmp_path / "out"
    spec, corpus, folder = start_folder(
        tmp_path / "campaign.yaml", corpus_file=tmp_path / "corpus.csv", out=out
    )
    # Every dump of the spec reads back as the same campaign, seed runs included.
    again = parse_spec(spec.model_dump(mode="json"))
    assert again.run_names() == spec.run_names() == ["control", "control.s1", "wide", "wide.s1"]
    trained = train_every_run(spec, folder=folder, corpus=corpus)
    resolved = spec.resolve_run("control.s1")  # its own child process reads the spec's dump
    report = campaign_restart_check(
        spec, run=resolved, base_dir=tmp_path, out=out, workdir=tmp_path / "work"
    )
    assert report.identical
    OutputFolder(out).write_json(
        RESTART_FILE, {**report.to_dict(), "run": "control.s1", "run_id": resolved.run_id}
    )
    closed, _ = close_and_seal(
        spec, out=out, base_dir=tmp_path, corpus=corpus, trained=trained, campaign_id="seeded-1"
    )
    entry = closed.verdict.variants["wide"]["test"]
    assert entry["seeds"] == {"control": [0, 1], "variant": [0, 1], "paired": True}
    md = (out / "report.md").read_text(encoding="utf-8")
    assert "Traceback" not in md and "2 seeds (0, 1)" in md
    verified = verify_output(out)
    assert verified.verified, verified.problems
