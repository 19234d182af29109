"""Per-example scores give any recipe's verdict its interval: a user's regression on a
``.npy`` file, written in the test's folder, trained for real and closed by the production
close; without ``score`` the verdict says what is missing and never adopts on a point
estimate."""

from __future__ import annotations

import textwrap
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from gpucampaign.close.bootstrap import paired_mean_gain
from gpucampaign.close.scores import Scores, read_scores
from gpucampaign.config import load_spec
from gpucampaign.core.files import sha256_file
from gpucampaign.data.corpus import load_spec_corpus
from gpucampaign.folder.layout import OutputFolder, run_relpath, scores_file
from gpucampaign.plan import calendar
from tests.helpers import close_and_seal, train_every_run

# y = 2 x0 - x1 + noise, read from a .npy file of rows (x0, x1, y): the user's code, not src/.
REGRESSION = """
import numpy as np
import torch
from torch.utils.data import TensorDataset
from gpucampaign import Recipe


class Regress(Recipe):
    metric = "mse"

    def datasets(self, ctx):
        t = torch.from_numpy(np.load(ctx.corpus.path)).float()
        X, y = t[:, :2], t[:, 2:]
        out = {}
        for name, rows in (("train", slice(0, 120)), ("val", slice(120, 180)),
                           ("test", slice(180, 240))):
            out[name] = TensorDataset(X[rows], y[rows])
            out[name].ids = [f"{name}{i}" for i in range(len(out[name]))]
        return out

    def model(self, ctx):
        width = int(ctx.args.get("width", 4))
        return torch.nn.Sequential(torch.nn.Linear(2, width), torch.nn.Tanh(),
                                   torch.nn.Linear(width, 1))

    def loss(self, model, batch):
        x, y = batch
        return torch.nn.functional.mse_loss(model(x), y)

    def evaluate(self, model, batches):
        se, n = 0.0, 0
        for x, y in batches:
            se += float(((model(x) - y) ** 2).sum())
            n += len(y)
        return {"mse": se / n, "loss": se / n}
"""

SCORE = """
    def score(self, model, batch):
        x, y = batch
        se = ((model(x) - y) ** 2).mean(dim=1)
        return {"mse": se, "loss": se}
"""


def regression_campaign(
    base: Path, *, metric: str = "mse", score: bool = True, min_gain: float = 0.01
) -> dict[str, Any]:
    """Write the recipe, a .npy corpus and a spec (a control that learns nothing, a variant
    that learns), train both for real, close and seal the folder."""
    module = f"user_regress_{uuid.uuid4().hex[:8]}"
    body = REGRESSION + (SCORE if score else "")
    (base / f"{module}.py").write_text(textwrap.dedent(body), encoding="utf-8")
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(240, 2))
    y = 2 * X[:, 0] - X[:, 1] + 0.05 * rng.normal(size=240)
    np.save(base / "points.npy", np.column_stack([X, y]))
    spec_data = {
        "name": "regression",
        "question": f"Does training with lr 0.05 lower the {metric} of the control?",
        "packages": [{"gpu": "rtx4090", "days": 3}],
        "corpus": {"path": "points.npy", "sha256": sha256_file(base / "points.npy")},
        "control": {
            "recipe": f"{module}:Regress",
            "args": {"width": 4},
            "batch_size": 16,
            "epochs": 3,
            "lr": 1e-9,
            "threads": 1,
        },
        "variants": [{"name": "learns", "changes": {"lr": 0.05}}],
        "decision_rule": {
            "metric": metric,
            "direction": "minimize",
            "threshold": 10.0,
            "min_gain": min_gain,
        },
        "stop_rules": {"require_restart": False},
        "calendar": [
            {"name": "control", "kind": "machine", "resource": "gpu", "hours": 2, "run": "control"},
            {"name": "learns", "kind": "machine", "resource": "gpu", "hours": 1, "run": "learns"},
        ],
    }
    (base / "campaign.yaml").write_text(yaml.safe_dump(spec_data, sort_keys=False))
    spec = load_spec(base / "campaign.yaml")
    out = base / "out"
    folder = OutputFolder(out)
    folder.copy_in(base / "campaign.yaml", "spec.yaml")
    folder.write_plan_once(calendar.plan(spec).to_dict())
    corpus = load_spec_corpus(spec, base_dir=base)
    train_every_run(spec, folder=folder, corpus=corpus)
    closed, report = close_and_seal(
        spec,
        out=out,
        base_dir=base,
        corpus=corpus,
        trained=spec.run_names(),
        campaign_id="regression-0001",
    )
    return {"out": out, "spec": spec, "verdict": closed.verdict, "report": report}


@pytest.mark.parametrize("metric", ["mse", "loss"])
def test_a_user_recipe_with_score_gets_intervals_on_its_metric(tmp_path: Path, metric: str):
    got = regression_campaign(tmp_path, metric=metric)
    v, spec, out = got["verdict"], got["spec"], got["out"]
    # The interval clears the min gain, but over one seed a side: not adopted.
    assert (v.kind, v.run) == ("inconclusive", "learns"), v.text
    for split in ("val", "test"):
        entry = v.variants["learns"][split]
        low, high = entry["gain_ci95"]
        assert 0.01 < low <= entry["gain"] <= high and entry["n"] == 60
    assert "clears the min gain 0.01, but training noise is not measured" in v.text
    # The scores the interval resampled are in each run's folder, one row per example.
    for run in ("control", "learns"):
        scores = read_scores(out / run_relpath(spec.resolve_run(run).run_id, scores_file("test")))
        assert scores.ids[:2] == ("test0", "test1") and len(scores.ids) == 60
        assert set(scores.values) == {"loss", "mse"}
    # The value the verdict states is the mean of those very scores.
    assert v.variants["learns"]["test"]["value"] == scores.mean(metric)


def test_without_score_the_verdict_is_inconclusive_and_says_what_is_missing(tmp_path: Path):
    got = regression_campaign(tmp_path, score=False)
    v = got["verdict"]
    assert (v.kind, v.run) == ("inconclusive", "learns"), v.text
    assert v.variants["learns"]["test"]["gain_ci95"] is None
    assert v.variants["learns"]["test"]["gain"] > 0.01  # a large gain, but a point estimate
    assert "defines no score()" in v.text and "add to the recipe a score(model, batch)" in v.text
    assert v.resolve is not None and v.resolve["missing"] == "per-example scores"
    report = (got["out"] / "report.md").read_text()
    for text in (v.text, report):
        assert "lower end clears" not in text and "lower end" not in text
    assert not list(got["out"].glob("runs/*/scores-*.csv"))


def test_the_paired_mean_gain_resamples_the_per_example_differences():
    ids = tuple(f"r{i}" for i in range(100))
    rng = np.random.default_rng(1)
    base = rng.normal(size=100)
    control = Scores(ids, {"mse": tuple(base + 1.0)})
    variant = Scores(ids[::-1], {"mse": tuple((base + 0.5)[::-1])})  # another row order
    g = paired_mean_gain([control], [variant], metric="mse")
    assert g is not None and g.gain == pytest.approx(-0.5) and g.ci95 == (-0.5, -0.5)
    assert g.n == 100 and paired_mean_gain([control], [variant], metric="mae") is None
    noisy = Scores(ids, {"mse": tuple(base + 0.5 + rng.normal(scale=0.3, size=100))})
    h = paired_mean_gain([control], [noisy], metric="mse")
    assert h is not None and h.ci95[0] < h.gain < h.ci95[1] < 0


def test_a_builtin_recipe_gets_an_interval_on_loss(tmp_path: Path):
    from tests.close.test_evidence import LEARNS_NOTHING, campaign, write_table

    sha = write_table(tmp_path / "corpus.csv", n={"train": 200, "val": 80, "test": 80})
    got = campaign(
        tmp_path,
        sha=sha,
        variants=[{"name": "learns", "changes": {"lr": 0.05}}],
        rule={"metric": "loss", "direction": "minimize", "threshold": 5.0, "min_gain": 0.01},
        control=LEARNS_NOTHING,
    )
    v = got["verdict"]
    assert (v.kind, v.run) == ("inconclusive", "learns"), v.text  # one seed a side
    low, high = v.variants["learns"]["test"]["gain_ci95"]
    assert 0.01 < low <= v.variants["learns"]["test"]["gain"] <= high
    scores = read_scores(
        got["out"] / run_relpath(got["spec"].resolve_run("learns").run_id, scores_file("val"))
    )
    assert set(scores.values) == {"accuracy", "loss"} and scores.ids[0] == "val0000"
