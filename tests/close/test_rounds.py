"""The rounds of seeds beyond the plan, without a flow: the spec a folder's rounds make, the
error each look may spend, and what a round buys (``close.looks``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpucampaign.cli.scaffold import init_campaign
from gpucampaign.close.looks import look_alpha, looks_taken, seeds_to_buy
from gpucampaign.close.verdict import RunEvidence, decide_verdict
from gpucampaign.config import DecisionRule, load_spec
from gpucampaign.core.errors import SpecError
from gpucampaign.folder.records import RoundRecord, append_round, spec_with_rounds
from tests.close.test_seeds import seeds_dominate

RULE = DecisionRule(metric="mse", direction="minimize", threshold=10.0, min_gain=0.0)


def test_the_first_look_spends_2_5_percent_and_the_later_ones_halve_it_summing_to_5():
    assert look_alpha(0) == 0.025
    assert (look_alpha(1), look_alpha(2), look_alpha(3)) == (0.0125, 0.00625, 0.003125)
    assert sum(look_alpha(j) for j in range(60)) == pytest.approx(0.05)


def _verdict(look: int, *, shift: float):
    """A variant whose three seeds all gain ``shift`` in mse (lower is better) over 300
    examples, the seeds' spread that of ``seeds_dominate``."""
    control, variant = seeds_dominate()
    moved = [
        type(s)(s.ids, {"mse": tuple(x - shift - 0.1 for x in s.values["mse"])}, seed=s.seed)
        for s in variant
    ]
    ev = {"test": control, "val": control}
    return decide_verdict(
        RULE,
        control=RunEvidence(values={"val": 1.0, "test": 1.0}, scores=ev, train_s=1.0),
        variants={
            "v": RunEvidence(
                values={"val": 1.0 - shift, "test": 1.0 - shift},
                scores={"test": moved, "val": moved},
                train_s=1.0,
            )
        },
        look=look,
        alpha=look_alpha(look),
    )


def test_after_a_round_a_gain_that_clears_at_95_percent_but_not_at_its_looks_error_waits():
    # The seeds' t(2) interval: a shift that the 95% interval clears at the first look
    # (adopted there) but the 97.5% one after a round does not.
    first, later = _verdict(0, shift=0.9), _verdict(1, shift=0.9)
    assert first.kind == "adopt", first.text
    assert later.kind == "inconclusive" and "after round 1 of seeds" in later.answer
    assert later.numbers["family"] == {
        "variants": 1,
        "alpha": 0.0125,
        "adoptable": {"v": False},
        "look": 1,
    }
    assert seeds_to_buy(later, have=3) == 3  # as many again
    assert seeds_to_buy(first, have=3) is None  # settled
    assert _verdict(1, shift=2.0).kind == "adopt"


def test_the_folders_rounds_make_the_spec_its_runs_and_keep_the_run_ids(tmp_path: Path):
    spec = load_spec(init_campaign(tmp_path / "p"))
    out = tmp_path / "out"
    out.mkdir()
    assert spec_with_rounds(spec, out) is spec and looks_taken(out) == 0
    seeds = {"control": [0, 1, 2], "lr-high": [0, 1, 2]}
    runs = ["control.s1", "control.s2", "lr-high.s1", "lr-high.s2"]
    append_round(out, RoundRecord(1, seeds, runs, 1e-3, 1e-5, why="Not yet"))
    # A declined round adds nothing.
    more = {"control": [0, 1, 2, 3], "lr-high": [0, 1, 2, 3]}
    append_round(out, RoundRecord(2, more, ["control.s3"], 1e-3, 1e-5, "Not yet", bought=False))
    eff = spec_with_rounds(spec, out)
    assert looks_taken(out) == 1
    assert eff.run_names() == ["control", *runs[:2], "lr-high", *runs[2:], "bf16", "short"]
    for run, rid in spec.run_ids().items():
        assert eff.run_ids()[run] == rid
    assert spec_with_rounds(eff, out).run_names() == eff.run_names()  # idempotent
    assert eff.tier_of("control.s2") == "essential" and eff.tier_of("lr-high.s1") == "useful"


@pytest.mark.parametrize("rounds", [-1, 6, "two"])
def test_a_bad_bound_on_rounds_is_refused_naming_the_field(tmp_path: Path, rounds):
    path = init_campaign(tmp_path / "p")
    text = path.read_text().replace("  mode: auto", f"  mode: auto\n  rounds: {rounds}")
    path.write_text(text)
    with pytest.raises(SpecError, match="decision_point.rounds"):
        load_spec(path)


def test_the_advice_gives_the_exact_seeds_to_write_and_where_to_run_them():
    v = _verdict(0, shift=0.45)  # inconclusive: the seeds dominate, six more settle it
    assert v.kind == "inconclusive" and v.resolve["more_seeds"] == 6
    seeds = list(range(9))
    assert (
        f"write seeds: {seeds} on 'control' and seeds: {seeds} on 'v' in the spec and run it "
        "again into the same --out (the finished runs are reused, only the new seeds train)"
    ) in v.resolve["text"]


def test_the_bound_at_its_default_leaves_the_specs_hash_as_it_was(tmp_path: Path):
    """A spec, and a folder sealed, before the bound on rounds existed keep their sha256 (the
    manifest's ``spec_sha256``); another bound is another spec."""
    import hashlib

    from gpucampaign.config import parse_spec, spec_sha256
    from gpucampaign.config.parts import canonical_json

    spec = load_spec(init_campaign(tmp_path / "p"))
    body = spec.model_dump(mode="json", exclude={"tracking": True})
    body["decision_point"].pop("rounds")
    for lot in body["packages"]:
        lot.pop("work_queue", None)
    assert spec_sha256(spec) == hashlib.sha256(canonical_json(body).encode()).hexdigest()
    data = spec.model_dump(mode="json")
    data["decision_point"]["rounds"] = 1
    assert spec_sha256(parse_spec(data)) != spec_sha256(spec)
