"""The futility stop: a variant that cannot win stops at an evaluation; the control never does.

The decision is checked on made-up per-example scores (a clear winner, a clear loser, one whose
interval still reaches the min gain, both directions, the verdict's interval); the stop on
real tiny runs of the digits corpus: a variant with a two-unit hidden layer cannot win against
the control's 128 units.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.calibration import control_curve, futility_stops, slow_starter
from gpucampaign.close.bootstrap import paired_mean_gain
from gpucampaign.close.scores import Scores
from gpucampaign.core.stoprules import EVIDENCE_RULES, Futile
from gpucampaign.engine.futility import (
    EvalScores,
    cannot_win,
    control_moved,
    control_scores_at,
    futility_check,
    look_costs,
    read_eval_scores,
    write_eval_scores,
)
from gpucampaign.folder.layout import RESULT_FILE
from gpucampaign.folder.metrics import read_metrics
from tests.helpers import digits_file, make_spec, run, run_dir  # noqa: F401 - a fixture

N = 200
IDS = tuple(f"r{i:03d}" for i in range(N))


def control_record(values: np.ndarray, *, step: int = 10, metric: str = "accuracy") -> EvalScores:
    return EvalScores(
        step=step, planned=40, metric=metric, split="val", ids=IDS, values=np.asarray(values)
    )


def correct(rate: float, *, seed: int) -> np.ndarray:
    """Per-example correctness (0/1) with exactly ``rate`` of the examples right."""
    rng = np.random.default_rng(seed)
    out = np.zeros(N)
    out[rng.permutation(N)[: round(rate * N)]] = 1.0
    return out


# --- the decision -----------------------------------------------------------------------------
def test_the_clear_loser_is_futile_the_clear_winner_is_not() -> None:
    control = control_record(correct(0.80, seed=1))
    loser = futility_check(
        control, ids=IDS, values=correct(0.30, seed=2), step=10, direction="maximize", min_gain=0.01
    )
    winner = futility_check(
        control, ids=IDS, values=correct(0.97, seed=3), step=10, direction="maximize", min_gain=0.01
    )
    assert loser is not None and winner is not None
    assert loser.futile and loser.ci95[1] < 0.01 and loser.gain == pytest.approx(-0.5)
    assert not winner.futile and winner.ci95[0] > 0.01
    assert "cannot win: at step 10" in loser.reason() and "below the min gain 0.01" in (
        loser.reason()
    )


def test_a_variant_whose_interval_still_reaches_the_min_gain_goes_on() -> None:
    # The same correctness but on 6 examples: its gain (+0.01) is below the min gain 0.02, yet
    # the interval's optimistic end reaches it, so it might still win: not stopped.
    base = correct(0.80, seed=1)
    better = base.copy()
    wrong = np.flatnonzero(base == 0)[:4]
    better[wrong] = 1.0
    right = np.flatnonzero(base == 1)[:2]
    better[right] = 0.0
    check = futility_check(
        control_record(base), ids=IDS, values=better, step=10, direction="maximize", min_gain=0.02
    )
    assert check is not None
    assert check.gain == pytest.approx(0.01) and check.gain < 0.02 <= check.ci95[1]
    assert not check.futile


def test_minimize_signs_the_gain_so_that_lower_is_better() -> None:
    rng = np.random.default_rng(0)
    loss = rng.uniform(0.2, 0.4, size=N)
    worse = futility_check(
        control_record(loss, metric="mse"),
        ids=IDS,
        values=loss + 0.5,
        step=10,
        direction="minimize",
        min_gain=0.0,
    )
    better = futility_check(
        control_record(loss, metric="mse"),
        ids=IDS,
        values=loss - 0.1,
        step=10,
        direction="minimize",
        min_gain=0.0,
    )
    assert worse is not None and better is not None
    assert worse.futile and worse.gain == pytest.approx(-0.5) and worse.ci95[1] < 0
    assert not better.futile and better.gain == pytest.approx(0.1)


def test_a_tie_never_stops_though_the_verdict_would_not_adopt_it() -> None:
    # A copy of the control (an untrained network predicting one class, like the control's):
    # the interval [0, 0] says nothing of what the variant will reach, so it is never futile;
    # numerically equal values (a gpus: 1 twin, 4.5e-09 apart) are a tie too.
    base = correct(0.8, seed=1)
    same = futility_check(
        control_record(base), ids=IDS, values=base, step=10, direction="maximize", min_gain=0.0
    )
    assert same is not None and same.ci95 == (0.0, 0.0) and same.tie and not same.futile
    assert same.numbers()["tie"] is True
    rng = np.random.default_rng(0)
    mse = rng.uniform(0.2, 0.4, size=N)
    twin = futility_check(
        control_record(mse, metric="mse"),
        ids=IDS,
        values=mse + 4.5e-9,
        step=10,
        direction="minimize",
        min_gain=0.0,
    )
    assert twin is not None and twin.tie and not twin.futile and twin.ci95[1] <= 0
    assert cannot_win(optimistic=0.005, min_gain=0.01)
    assert cannot_win(optimistic=0.0, min_gain=0.0)
    assert not cannot_win(optimistic=0.01, min_gain=0.01)


def test_the_interval_is_the_verdicts_paired_bootstrap() -> None:
    control, variant = correct(0.8, seed=1), correct(0.75, seed=4)
    check = futility_check(
        control_record(control),
        ids=IDS,
        values=variant,
        step=10,
        direction="maximize",
        min_gain=0.0,
    )
    gain = paired_mean_gain(
        [Scores(IDS, {"accuracy": tuple(control)})],
        [Scores(IDS, {"accuracy": tuple(variant)})],
        metric="accuracy",
    )
    assert check is not None and gain is not None
    assert (check.gain, check.ci95, check.n) == (gain.gain, gain.ci95, gain.n)


def test_examples_are_paired_by_id_in_any_order() -> None:
    control = correct(0.8, seed=1)
    order = np.random.default_rng(5).permutation(N)
    check = futility_check(
        control_record(control),
        ids=[IDS[i] for i in order],
        values=control[order],
        step=10,
        direction="maximize",
        min_gain=0.0,
    )
    assert check is not None and check.gain == 0.0 and check.n == N


def test_the_control_record_at_the_same_step_only(tmp_path: Path) -> None:
    for step in (10, 20):
        write_eval_scores(tmp_path, control_record(correct(0.5, seed=step), step=step))
    back = read_eval_scores(tmp_path / "evals" / "scores-000000020.npz")
    assert back.step == 20 and back.ids == IDS and back.metric == "accuracy"
    assert control_scores_at(tmp_path, step=10)[0].step == 10  # type: ignore[union-attr]
    # Still training (no result.json): nothing to compare step 30 with yet.
    got, why = control_scores_at(tmp_path, step=30)
    assert got is None and "no evaluation at step 30 yet" in why
    # Its training ended before step 30: a 20-step model is never set against a 30-step one.
    (tmp_path / RESULT_FILE).write_text("{}")
    got, why = control_scores_at(tmp_path, step=30)
    assert got is None and "only at unequal steps" in why
    got, why = control_scores_at(tmp_path, step=15)
    assert got is None and "only at unequal steps" in why


def test_no_check_until_the_control_moved_from_its_first_evaluation(tmp_path: Path) -> None:
    one_class = correct(0.1, seed=0)
    for step in (10, 20):
        write_eval_scores(tmp_path, control_record(one_class, step=step))
    write_eval_scores(tmp_path, control_record(correct(0.6, seed=3), step=30))
    first, at20, at30 = (read_eval_scores(p) for p in sorted((tmp_path / "evals").iterdir()))
    assert control_moved(tmp_path, first) == (False, control_moved(tmp_path, first)[1])
    moved, why = control_moved(tmp_path, at20)
    assert not moved and "has not moved beyond chance from its first record (step 10" in why
    assert control_moved(tmp_path, at30) == (True, "")


def test_a_control_that_moved_by_chance_only_decides_nothing(tmp_path: Path) -> None:
    """Both models still at chance: a control whose per-example changes from its untrained
    record straddle 0 (a few examples flipped each way) has not moved; a real move has."""
    chance = correct(0.5, seed=0)
    write_eval_scores(tmp_path, control_record(chance, step=10))
    flipped = chance.copy()
    flipped[np.flatnonzero(chance == 0)[:6]] = 1.0  # six right more, three wrong more
    flipped[np.flatnonzero(chance == 1)[:3]] = 0.0
    write_eval_scores(tmp_path, control_record(flipped, step=20))
    at20 = read_eval_scores(
        tmp_path / "evals" / sorted(p.name for p in (tmp_path / "evals").iterdir())[1]
    )
    moved, why = control_moved(tmp_path, at20)
    assert not moved and "beyond chance" in why
    learned = np.maximum(chance, correct(0.5, seed=9))  # ~75% right: a real move
    write_eval_scores(tmp_path, control_record(learned, step=30))
    at30 = read_eval_scores(
        tmp_path / "evals" / sorted(p.name for p in (tmp_path / "evals").iterdir())[2]
    )
    assert control_moved(tmp_path, at30) == (True, "")


def test_an_early_look_needs_stronger_evidence_than_a_late_one() -> None:
    """O'Brien-Fleming's boundary: at step 10 of 160 the optimistic end is read 4x wider than
    the final interval, so a variant trailing by an interval that the finished run would call
    futile is not stopped yet; at step 150 of 160 it is."""
    right = correct(0.80, seed=1)
    control = control_record(right)
    trailing = right.copy()
    trailing[np.flatnonzero(right == 1)[:24]] = 0.0  # 12 points behind, example by example
    args = {"ids": IDS, "values": trailing, "direction": "maximize", "min_gain": 0.0}
    final = futility_check(control, step=10, **args)
    early = futility_check(control, step=10, planned=160, **args)
    late = futility_check(control, step=150, planned=160, **args)
    assert final is not None and early is not None and late is not None
    assert final.ci95[1] < 0 and final.futile  # the finished run's reading
    assert early.boundary == 4.0 and not early.futile and early.reach is not None
    assert early.reach > 0
    assert late.futile and 1 < late.boundary < 1.04
    assert "O'Brien-Fleming" in late.reason() and "99% interval read 1.0328x wide" in late.reason()


def test_a_futile_stop_is_evidence_and_pickles_with_its_numbers() -> None:
    import pickle

    stop = Futile("v-1", "cannot win", step=10, numbers={"gain": -0.5})
    again = pickle.loads(pickle.dumps(stop))
    assert (again.rule, again.step, again.stop_id, again.numbers) == (
        "futile",
        10,
        stop.stop_id,
        {"gain": -0.5},
    )
    assert again.to_record()["numbers"] == {"gain": -0.5}
    assert Futile.rule in EVIDENCE_RULES  # the campaign goes on to its verdict


def test_the_looks_cost_is_timed_through_the_whole_check_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``look_costs`` (the pilot's probe of futility's looks for the re-forecast): a record
    written, and a variant's look that reads two records and reaches the comparison (not the
    early exit of a control that has not moved), in a temporary folder removed after."""
    import gpucampaign.engine.futility as futility

    compared: list[int] = []
    real = futility.futility_check

    def counted(*args: Any, **kwargs: Any) -> Any:
        compared.append(kwargs["step"])
        return real(*args, **kwargs)

    monkeypatch.setattr(futility, "futility_check", counted)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    record_s, check_s = look_costs(
        ids=list(IDS),
        values=list(correct(0.7, seed=1)),
        step=20,
        planned=400,
        metric="accuracy",
        split="val",
        direction="maximize",
        min_gain=0.01,
    )
    assert record_s > 0 and check_s > 0
    assert compared == [20, 20]  # the whole look, at the pilot's step (twice: the second kept)
    assert list(tmp_path.iterdir()) == []


def test_a_pilot_times_a_record_and_a_check_and_writes_neither(
    tmp_path: Path,
    digits_file: tuple[Path, str],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The control's pilot of a campaign with a variant and futility on: its probe times the
    control's record and a variant's check, each with the scores (the re-forecast prices each
    role's looks at its own), each scores right after an evaluation as a call's look, and
    keeps no record of them: the only one is the untrained model's at step 0, the loop's
    own."""
    import gpucampaign.engine.outcome as outcome

    calls: list[str] = []
    evaluation, scores = outcome._timed_evaluation, outcome.score_split

    def evaluated(*args: Any, **kwargs: Any) -> Any:
        calls.append("evaluation")
        return evaluation(*args, **kwargs)

    def scored(*args: Any, **kwargs: Any) -> Any:
        calls.append("scores")
        return scores(*args, **kwargs)

    monkeypatch.setattr(outcome, "_timed_evaluation", evaluated)
    monkeypatch.setattr(outcome, "score_split", scored)
    spec = cannot_win_spec(tmp_path, digits_file)
    pilot = run(spec, tmp_path, stop_after_steps=5, probe_eval=True)
    # The pilot's steps held no evaluation: one timed, then the looks' probe: the cold scores,
    # then the kept ones right after an evaluation (main: the scores back to back, 0.85x a
    # call's, which follow its evaluations; 07ebba5: an evaluation before the cold ones too).
    assert calls == ["evaluation", "scores", "evaluation", "scores"]
    t = pilot.timings
    assert t["probe_record_s"] > 0 and t["probe_check_s"] > 0  # main: one price, the scores
    assert t["probe_looks_s"] >= max(t["probe_record_s"], t["probe_check_s"])
    kept = sorted(p.name for p in (run_dir(spec, tmp_path) / "evals").iterdir())
    assert kept == [f"scores-{0:09d}.npz"]
    off = cannot_win_spec(tmp_path / "off", digits_file, futility=False)
    unpriced = run(off, tmp_path / "off", stop_after_steps=5, probe_eval=True).timings
    assert unpriced["probe_record_s"] is None and unpriced["probe_check_s"] is None


# --- on real tiny runs ------------------------------------------------------------------------
def cannot_win_spec(base: Path, digits: tuple[Path, str], **stop_rules: bool):
    """A control of 40 steps (evaluated every 10) and a variant with a 2-unit hidden layer."""
    return make_spec(
        base,
        digits,
        control={"epochs": 4},
        variants=[{"name": "narrow", "tier": "useful", "changes": {"hidden": [2]}}],
        decision_rule={"metric": "accuracy", "threshold": 0.0, "min_gain": 0.01},
        **({"stop_rules": stop_rules} if stop_rules else {}),
    )


def futility_rows(path: Path) -> list[dict]:
    return [r for r in read_metrics(path / "metrics.jsonl") if r["kind"] == "futility"]


def test_a_variant_that_cannot_win_stops_early_with_its_model_kept(
    tmp_path: Path,
    digits_file: tuple[Path, str],  # noqa: F811
) -> None:
    spec = cannot_win_spec(tmp_path, digits_file)
    control = run(spec, tmp_path)
    assert control.completed and control.steps_done == 40
    kept = sorted(p.name for p in (run_dir(spec, tmp_path) / "evals").iterdir())
    # From step 0 (the untrained model: where its metric moves from) to its last step.
    assert kept == [f"scores-{s:09d}.npz" for s in (0, 10, 20, 30, 40)]

    with pytest.raises(Futile) as info:
        run(spec, tmp_path, name="narrow")
    stop = info.value
    # At the end of the grace (a quarter of 40 steps), the control having moved from its
    # untrained value: step 10 of 40, against the control at step 10; 30 steps never trained.
    assert stop.step == 10 and stop.run_id == spec.resolve_run("narrow").run_id
    n = stop.numbers
    assert (n["control_step"], n["planned_steps"], n["steps_saved"]) == (10, 40, 30)
    assert n["gain_ci95"][1] < n["min_gain"] == 0.01 and n["futile"] is True
    assert n["step_s"] > 0
    folder = run_dir(spec, tmp_path, name="narrow")
    result = json.loads((folder / RESULT_FILE).read_text())
    assert (result["completed"], result["steps_done"]) == (False, 10)
    assert result["stop"]["rule"] == "futile" and result["stop"]["numbers"] == n
    assert set(result["eval_metrics"]) == {"val", "test"}  # evaluated as evidence
    assert (folder / "model" / "model.safetensors").is_file()  # reloaded like any stopped run
    assert [r["futile"] for r in futility_rows(folder)] == [True]
    # A later call raises the same stop again: the run is finished.
    with pytest.raises(Futile) as again:
        run(spec, tmp_path, name="narrow")
    assert (again.value.stop_id, again.value.numbers) == (stop.stop_id, n)


def test_a_variants_looks_read_the_controls_first_record_once_a_call(
    tmp_path: Path,
    digits_file: tuple[Path, str],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each look reads the control's record at its own step (no listing of the folder when it
    is there) and the control's first record once a call, held after (main: both at every
    look, and the folder listed twice: a variant's looks ran 1.6x the pilot's probe of one,
    which sees a folder of two records)."""
    import gpucampaign.engine.futility as futility

    spec = make_spec(
        tmp_path,
        digits_file,
        control={"epochs": 4},
        variants=[{"name": "close", "tier": "useful", "changes": {"lr": 0.01}}],
        decision_rule={"metric": "accuracy", "threshold": 0.0, "min_gain": 0.01},
    )
    assert run(spec, tmp_path).completed
    read: list[str] = []
    listed: list[str] = []
    real_read, real_list = futility.read_eval_scores, futility._recorded_steps

    def counted_read(path: Path) -> Any:
        read.append(Path(path).name)
        return real_read(path)

    def counted_list(control_dir: Path) -> list[int]:
        listed.append(Path(control_dir).name)
        return real_list(control_dir)

    monkeypatch.setattr(futility, "read_eval_scores", counted_read)
    monkeypatch.setattr(futility, "_recorded_steps", counted_list)
    assert run(spec, tmp_path, name="close").completed
    looks = [r["step"] for r in futility_rows(run_dir(spec, tmp_path, name="close"))]
    assert looks == [10, 20, 30]  # after the grace, never at the last step
    assert read == [f"scores-{s:09d}.npz" for s in (0, 10, 20, 30)]
    assert listed == [run_dir(spec, tmp_path).name]  # once, to find the first record


def test_the_spec_switch_turns_futility_off(tmp_path: Path, digits_file: tuple[Path, str]) -> None:  # noqa: F811
    spec = cannot_win_spec(tmp_path, digits_file, futility=False)
    assert spec.stop_rules.futility is False
    assert run(spec, tmp_path).completed
    narrow = run(spec, tmp_path, name="narrow")
    assert narrow.completed and narrow.steps_done == 40
    rows = futility_rows(run_dir(spec, tmp_path, name="narrow"))
    assert rows == [{"kind": "futility", "step": 0, "off": rows[0]["off"]}]
    assert "stop_rules.futility: false" in rows[0]["off"]


def test_futility_is_on_by_default(tmp_path: Path, digits_file: tuple[Path, str]) -> None:  # noqa: F811
    assert cannot_win_spec(tmp_path, digits_file).stop_rules.futility is True


def test_the_control_is_never_stopped_as_futile(
    tmp_path: Path,
    digits_file: tuple[Path, str],  # noqa: F811
) -> None:
    # A control that learns nothing (lr 1e-7), with seed replicates, finds the records of a
    # far better control in its folder: it and its replicate still train every step.
    good = cannot_win_spec(tmp_path / "good", digits_file)
    run(good, tmp_path / "good")
    bad = make_spec(
        tmp_path / "bad",
        digits_file,
        control={"epochs": 4, "lr": 1e-7, "seeds": [0, 1]},
        variants=[{"name": "v", "tier": "useful", "changes": {"lr": 0.01}}],
        decision_rule={"metric": "accuracy", "threshold": 0.0, "min_gain": 0.01},
    )
    target = run_dir(bad, tmp_path / "bad")
    shutil.copytree(run_dir(good, tmp_path / "good") / "evals", target / "evals")
    for name in ("control", "control.s1"):
        res = run(bad, tmp_path / "bad", name=name)
        assert res.completed and res.steps_done == 40 and res.stop is None, name
        assert all(
            r.get("futile") is not True
            for r in futility_rows(run_dir(bad, tmp_path / "bad", name=name))
        )
    # The control kept its own scores (it records, never checks): its val accuracy at step 10.
    rows = read_metrics(target / "metrics.jsonl")
    at10 = next(r for r in rows if r["kind"] == "eval" and r["step"] == 10)
    record = read_eval_scores(target / "evals" / "scores-000000010.npz")
    assert record.values.mean() == pytest.approx(at10["accuracy"])


# --- a user's recipe: minimize, and without score() -------------------------------------------
def user_regression(base: Path, *, score: bool, not_learning: bool = False) -> tuple[Any, Any, Any]:
    """A user's regression recipe (mse, minimize) written in ``base``: the control learns
    (lr 0.05), the variant 'frozen' learns nothing (lr 1e-9); the not-learning rule is off
    unless asked. Returns (spec, folder, corpus)."""
    import textwrap
    import uuid

    import yaml

    from gpucampaign.config import load_spec
    from gpucampaign.core.files import sha256_file
    from gpucampaign.data.corpus import load_spec_corpus
    from gpucampaign.folder.layout import OutputFolder
    from tests.close.test_scores import REGRESSION, SCORE

    module = f"user_futile_{uuid.uuid4().hex[:8]}"
    (base / f"{module}.py").write_text(textwrap.dedent(REGRESSION + (SCORE if score else "")))
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(240, 2))
    np.save(base / "points.npy", np.column_stack([X, 2 * X[:, 0] - X[:, 1]]))
    data = {
        "name": "regression",
        "packages": [{"gpu": "rtx4090", "days": 3}],
        "corpus": {"path": "points.npy", "sha256": sha256_file(base / "points.npy")},
        "control": {
            "recipe": f"{module}:Regress",
            "batch_size": 16,
            "epochs": 3,  # 8 steps an epoch, evaluated at 8, 16 and 24
            "lr": 0.05,
            "threads": 1,
        },
        "variants": [{"name": "frozen", "changes": {"lr": 1e-9}}],
        "decision_rule": {"metric": "mse", "direction": "minimize", "threshold": 10.0},
        "stop_rules": {"require_restart": False, "not_learning": not_learning},
        "pilot": {"steps": 2},
        "calendar": [{"name": "prep", "kind": "human", "hours": 1}],
    }
    (base / "campaign.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    spec = load_spec(base / "campaign.yaml")
    return spec, OutputFolder(base / "out"), load_spec_corpus(spec, base_dir=base)


def test_a_minimized_metric_of_a_users_recipe_stops_the_variant_that_cannot_win(
    tmp_path: Path,
) -> None:
    from tests.helpers import train_every_run

    spec, folder, corpus = user_regression(tmp_path, score=True)
    train_every_run(spec, folder=folder, corpus=corpus)
    stops = folder.read_jsonl("stops.jsonl")
    assert [(s["rule"], s["run_id"]) for s in stops] == [
        ("futile", spec.resolve_run("frozen").run_id)
    ]
    n = stops[0]["numbers"]
    assert (n["metric"], n["direction"], n["step"], n["steps_saved"]) == ("mse", "minimize", 8, 16)
    assert n["gain"] < 0 and n["gain_ci95"][1] < 0  # signed: the frozen variant is worse


def test_a_recipe_without_score_is_never_stopped_as_futile_and_says_why(tmp_path: Path) -> None:
    from tests.helpers import train_every_run

    spec, folder, corpus = user_regression(tmp_path, score=False)
    train_every_run(spec, folder=folder, corpus=corpus)
    assert folder.read_jsonl("stops.jsonl") == []
    for name in ("control", "frozen"):
        rows = futility_rows(folder.run(spec.resolve_run(name).run_id).path)
        assert len(rows) == 1 and "defines no score()" in rows[0]["off"], name
    assert not (folder.run(spec.resolve_run("control").run_id).path / "evals").exists()


# --- the check's own guards, each alone (a mutation of one is caught here) ------------------
def _check_at(
    tmp_path: Path, digits: tuple[Path, str], *, step: int, control: dict[int, np.ndarray]
) -> tuple[Any, list[dict]]:
    """A variant's check at ``step`` of 40 (pilot 5 steps, grace a quarter: step 10), its
    per-example accuracy far below the control's records (``{step: values}``): what it
    returns and the rows it recorded. The run is a stand-in with what the check reads."""
    from types import SimpleNamespace

    from gpucampaign.engine.futility import Futility

    spec = cannot_win_spec(tmp_path, digits)
    control_dir = tmp_path / "control"
    for at, values in control.items():
        write_eval_scores(control_dir, control_record(values, step=at))
    rows: list[dict] = []
    r: Any = SimpleNamespace(
        step=step,
        planned=40,
        spec=spec,
        record=rows.append,
        scores=lambda split: (list(IDS), {"accuracy": list(correct(0.05, seed=9))}),
        run_folder=SimpleNamespace(of_run=lambda rid: SimpleNamespace(path=control_dir)),
        config=SimpleNamespace(recipe="mlp"),
    )
    return Futility(r, role="check").check(), rows


def test_no_check_within_the_grace_even_against_a_clear_loser(
    tmp_path: Path,
    digits_file: tuple[Path, str],  # noqa: F811
) -> None:
    spec = cannot_win_spec(tmp_path, digits_file)
    graces = [spec.stop_rules.grace_step(planned=p) for p in (1, 4, 40, 41, 100)]
    assert graces == [1, 1, 10, 11, 25]
    moved = {0: correct(0.1, seed=0), 8: correct(0.8, seed=1)}
    got, rows = _check_at(tmp_path, digits_file, step=8, control=moved)
    why = "within the grace: no check before step 10 of 40"
    assert got is None and rows == [{"kind": "futility", "step": 8, "skipped": why}]


def test_no_check_while_the_control_has_not_moved_against_a_clear_loser(
    tmp_path: Path,
    digits_file: tuple[Path, str],  # noqa: F811
) -> None:
    """The control's scores at step 20 equal its untrained ones: the variant, far below them
    (no tie), is still not checked; nothing compared says anything yet."""
    still = correct(0.8, seed=1)
    got, rows = _check_at(tmp_path, digits_file, step=20, control={0: still, 20: still})
    assert got is None and len(rows) == 1 and "has not moved" in rows[0]["skipped"]


def test_a_small_real_difference_is_not_a_tie() -> None:
    """Ties are numerical equality (to 1e-6 relative): 1% or 30% apart is a difference."""
    from gpucampaign.engine.futility import is_tie

    base = np.random.default_rng(0).uniform(0.2, 0.4, size=N)
    assert is_tie(base + 4.5e-9, base)
    assert not is_tie(base * 1.01, base) and not is_tie(base * 1.3, base)


def test_a_slow_starter_that_wins_is_rarely_dropped_and_a_variant_at_chance_stops_early() -> None:
    """A slow starter (a lower learning rate) trails the control by ~0.09 at a quarter of its
    steps and ends ahead (0.88 against 0.85): read at O'Brien-Fleming's boundary it is dropped
    in at most 5% of 200 simulated campaigns; read at the plain interval at every look, most
    campaigns would drop it. A variant that stays at chance is still stopped early: in every
    campaign by 35% of its steps, in most at the first look after the grace (25%)."""
    assert slow_starter(1.0) > control_curve(1.0) + 0.02  # the true best at the end
    spent = futility_stops(slow_starter)
    assert sum(s is not None for s in spent) <= 10, spent  # 5% of 200
    plain = futility_stops(slow_starter, plain=True)
    assert sum(s is not None for s in plain) >= 100
    chance = futility_stops(lambda share: 0.5)
    assert all(s is not None and s <= 0.35 for s in chance)  # by 35% of its steps
    assert sum(s == 0.25 for s in chance) >= 180  # most at the first look
