"""Calibration of the verdict against training noise, on real tiny trainings.

Forty campaigns on the bundled digits (an MLP, 20 steps, seconds each), trained by the engine
and decided by the close's own functions (``analyse_runs``, ``run_evidence``,
``closing_verdict``): nothing is faked. Each compared run has the seeds the plan proposes
(``plan.evidence``), all fixed, so the rates are the same on every run of the test.

* A/A: the variant is the control with other seeds and nothing else, ``min_gain: 0``: any gain
  is training noise, so at most 1 of 20 may adopt (5%).
* A real effect (the variant's learning rate is 5x the control's, seeds paired): at least 16 of
  20 (80%) must adopt.

The measured rates are in docs/stop-rules-and-evidence.md, *Training noise: measured, or no
adoption*.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpucampaign.close.closing import analyse_runs
from gpucampaign.close.evidence import closing_verdict, run_evidence
from gpucampaign.config import CampaignSpec
from gpucampaign.folder.records import run_states
from gpucampaign.plan import plan
from tests.helpers.engine import corpus_of, digits_file, make_spec, run, run_dir  # noqa: F401

pytestmark = pytest.mark.slow

CAMPAIGNS = 20
RULE = {"metric": "accuracy", "threshold": 0.0, "min_gain": 0.0}
REAL_EFFECT = {"lr": 0.05}  # the control's is 0.01: 20 steps reach ~0.75 against ~0.93


def _proposed_seeds(base: Path, digits: tuple[Path, str]) -> int:
    """The seeds per compared run the plan proposes for a one-seed campaign of this recipe."""
    spec = make_spec(
        base / "plan",
        digits,
        variants=[{"name": "b", "changes": REAL_EFFECT}],
        decision_rule=RULE,
        calendar=[
            {"name": n, "kind": "machine", "resource": "gpu", "hours": 1, "run": n}
            for n in ("control", "b")
        ],
    )
    ev = plan(spec).evidence
    assert ev is not None and not ev["measured"] and ev["fits"]
    return int(ev["proposed"])


@pytest.fixture(scope="module")
def calibration(
    tmp_path_factory: pytest.TempPathFactory,
    digits_file: tuple[Path, str],  # noqa: F811
) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("calibration")
    k = _proposed_seeds(base, digits_file)
    aa, real = [], []
    for i in range(CAMPAIGNS):
        control = [2 * k * i + j + 1 for j in range(k)]
        other = [2 * k * i + k + j + 1 for j in range(k)]
        # One folder per campaign's control seeds: the real-effect campaign reuses the A/A
        # campaign's control runs (the same run IDs), as a campaign's resume would.
        where = base / f"c{i}"
        spec_control = {"seeds": control}
        twin = {"name": "twin", "seeds": other, "changes": {}}
        better = {"name": "better", "seeds": control, "changes": REAL_EFFECT}
        aa.append(_decide(where, digits_file, control=spec_control, variant=twin))
        real.append(_decide(where, digits_file, control=spec_control, variant=better))
    return {"seeds": k, "aa": aa, "real": real}


def _decide(
    base: Path, digits: tuple[Path, str], *, control: dict[str, Any], variant: dict[str, Any]
) -> Any:
    """Train every run of a two-run campaign in ``base`` (a run already trained there is
    reused), analyse them as the close does, and return the verdict."""
    spec: CampaignSpec = make_spec(
        base,
        digits,
        control=control,
        variants=[variant],
        decision_rule=RULE,
        stop_rules={"futility": False},
    )
    for name in spec.run_names():
        if not (run_dir(spec, base, name=name) / "result.json").is_file():
            run(spec, base, name=name)
    root = base / "out"
    analyse_runs(spec, root=root, corpus=corpus_of(base, spec), runs=spec.run_names())
    states = run_states(spec, root=root)
    evidence = run_evidence(spec, root=root, states=states)
    return closing_verdict(spec, evidence=evidence, stops=[], decision=None)


def test_a_reseeded_control_is_adopted_in_at_most_1_of_20_campaigns(calibration):
    aa = calibration["aa"]
    adopted = [v for v in aa if v.kind == "adopt"]
    print(f"A/A: {len(adopted)} of {len(aa)} adopt at {calibration['seeds']} seeds a side")
    assert len(adopted) <= 1, [v.answer for v in adopted]
    # Every interval rests on the seeds of both sides: training noise is measured.
    for v in aa:
        entry = v.variants["twin"]["test"]
        assert entry["training_noise"] == "measured" and entry["replicates"] == calibration["seeds"]


def test_a_real_effect_is_adopted_in_at_least_16_of_20_campaigns(calibration):
    real = calibration["real"]
    adopted = [v for v in real if (v.kind, v.run) == ("adopt", "better")]
    print(f"real effect: {len(adopted)} of {len(real)} adopt at {calibration['seeds']} seeds")
    assert len(adopted) >= 16, [v.answer for v in real if v not in adopted]
    assert all(v.variants["better"]["test"]["seeds"]["paired"] for v in real)
