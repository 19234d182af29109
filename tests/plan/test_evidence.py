"""`campaign plan` states the evidence the decision rule needs: the seeds of each compared run,
the GPU time they take (forecast, then re-forecast from the pilot), whether they fit the lot,
and the smallest gain the campaign can detect at that budget."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpucampaign.cli import app
from gpucampaign.config import parse_spec
from gpucampaign.plan import calendar
from gpucampaign.plan.evidence import PROPOSED_SEEDS, detectable_gain_sd

DIGITS = Path(__file__).resolve().parents[2] / "examples" / "digits" / "campaign.yaml"
# The demo's GPU hours a seed: control, lr-high and bf16 0.25 h, short 0.1 h.
ONE_SEED_EXTRA = (PROPOSED_SEEDS - 1) * (0.25 + 0.25 + 0.25 + 0.1)


def _digits(**changes: Any) -> Any:
    data = yaml.safe_load(DIGITS.read_text())
    for run, seeds in changes.get("seeds", {}).items():
        if run == "control":
            data["control"]["seeds"] = seeds
        else:
            next(v for v in data["variants"] if v["name"] == run)["seeds"] = seeds
    return parse_spec(data)


def test_a_one_seed_campaign_is_told_it_cannot_adopt_and_what_seeds_cost():
    ev = calendar.plan(_digits()).evidence
    assert ev is not None
    assert {n: r["seeds"] for n, r in ev["runs"].items()} == {
        "control": 1,
        "lr-high": 1,
        "bf16": 1,
        "short": 1,
    }
    assert ev["runs"]["short"]["hours"] == 0.1
    assert (ev["measured"], ev["proposed"]) == (False, 3)
    assert ev["extra_gpu_hours"] == pytest.approx(ONE_SEED_EXTRA)
    assert ev["fits"] and ev["spare_gpu_hours"] == pytest.approx(72 - 1.05)
    # Three variants judged together (Holm): the first test is at 2.5% / 3.
    assert ev["detectable_gain_sd"] == detectable_gain_sd(3, variants=3) == 8.016


def test_the_re_forecast_after_the_pilot_restates_the_seeds_time_and_whether_they_fit():
    # The pilot measured the control at 30 h (the plan said 0.25 h): its two more seeds take
    # 60 h, which no longer fits the lot's spare GPU hours.
    ev = calendar.plan(_digits(), hours_override={"train-control": 30.0}).evidence
    assert ev is not None and ev["runs"]["control"]["hours"] == 30.0
    assert ev["extra_gpu_hours"] == pytest.approx(ONE_SEED_EXTRA - 0.5 + 60)
    assert not ev["fits"]


def test_seeds_on_every_compared_run_measure_training_noise():
    seeds = {r: [0, 1, 2, 3, 4] for r in ("control", "lr-high", "bf16", "short")}
    ev = calendar.plan(_digits(seeds=seeds)).evidence
    assert ev is not None and ev["measured"] and ev["seeds"] == 5 and "proposed" not in ev
    assert ev["detectable_gain_sd"] == 3.241
    # One run left with one seed is enough to leave the noise unmeasured.
    del seeds["short"]
    ev = calendar.plan(_digits(seeds=seeds)).evidence
    assert ev is not None and not ev["measured"]
    assert ev["extra_gpu_hours"] == pytest.approx((PROPOSED_SEEDS - 1) * 0.1)


def test_campaign_plan_prints_the_evidence_lines():
    result = CliRunner().invoke(app, ["plan", str(DIGITS)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "evidence: seeds per compared run: control 1 seed(s) (0.25 GPU h a seed)" in text
    assert "one seed a side cannot measure training noise, so the verdict cannot adopt" in text
    assert "with 3 seeds: 1.7 more GPU h, which fits the 70.95 spare GPU h of the lot" in text
    assert "about 8.016 x the seed-to-seed standard deviation of the metric" in text


def test_the_detectable_gain_has_exactly_80_percent_power_by_scipys_noncentral_t() -> None:
    """The figure is the verdict's test's: a one-sided t at 2.5% / variants over k - 1
    degrees of freedom, solved on the noncentral t (the normal approximation, the quantiles'
    sum, gives 76.6% power at 3 seeds)."""
    from scipy.stats import nct, t

    for seeds in (2, 3, 4, 5, 8, 13, 30, 60):
        for variants in (1, 3):
            dof = seeds - 1
            crit = t.ppf(1 - 0.025 / variants, dof)
            d = detectable_gain_sd(seeds, variants=variants)
            assert d is not None
            power = nct.sf(crit, dof, d / (2 / seeds) ** 0.5)
            assert 0.80 <= power < 0.80 + 2e-3, (seeds, variants, power)
    assert detectable_gain_sd(1) is None


@pytest.mark.process
def test_a_plan_imports_no_scipy() -> None:
    """The plan comes before the first training step of `campaign run`: its evidence needs no
    scipy import (0.08 s in series there)."""
    import subprocess
    import sys

    code = (
        "import sys; from gpucampaign.plan import calendar; from gpucampaign.config import "
        f"load_spec; calendar.plan(load_spec({str(DIGITS)!r})); "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'scipy', 'sklearn'}))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout
