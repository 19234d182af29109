"""Futility never judges a model that has not learned yet: a user's BatchNorm CNN whose every
run predicts one class at its first evaluations (its output starts far on class 0) ties the
control there, exactly, per example. No variant is stopped at the first evaluation or on a
tie, and the verdict with futility on is the verdict with it off: the variants win.

Images of 8x8 pixels in 4 classes (a bright square in the class's quadrant, with noise), 256
to train, 32 a batch: 8 steps an epoch, evaluated at each epoch's end.
"""

from __future__ import annotations

import json
import re
import textwrap
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from gpucampaign.config import load_spec
from gpucampaign.core.files import sha256_file
from gpucampaign.data.corpus import load_spec_corpus
from gpucampaign.folder.layout import OutputFolder
from gpucampaign.folder.metrics import read_metrics
from gpucampaign.plan import calendar
from tests.helpers.closing import close_and_seal, train_every_run

BN_CNN = """
import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset
from gpucampaign import Recipe


class Net(Recipe):
    metric = "accuracy"

    def datasets(self, ctx):
        z = np.load(ctx.corpus.path)
        X = torch.from_numpy(z[:, :-1]).float().reshape(-1, 1, 8, 8)
        y = torch.from_numpy(z[:, -1]).long()
        out = {}
        for name, rows in (("train", slice(0, 256)), ("val", slice(256, 384)),
                           ("test", slice(384, 512))):
            out[name] = TensorDataset(X[rows], y[rows])
            out[name].ids = [f"{name}{i}" for i in range(len(out[name]))]
        return out

    def model(self, ctx):
        head = nn.Linear(8, 4)
        with torch.no_grad():  # far on class 0 at the start: one class predicted at first
            head.bias.copy_(torch.tensor([float(ctx.args.get("start", 6.0)), 0.0, 0.0, 0.0]))
        return nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
            nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(32, 8), nn.BatchNorm1d(8),
            nn.ReLU(), head,
        )

    def loss(self, model, batch):
        x, y = batch
        return nn.functional.cross_entropy(model(x), y)

    def evaluate(self, model, batches):
        right, n = 0, 0
        for x, y in batches:
            right += int((model(x).argmax(1) == y).sum())
            n += len(y)
        return {"accuracy": right / n}

    def score(self, model, batch):
        x, y = batch
        return {"accuracy": (model(x).argmax(1) == y).float()}
"""


def images(n: int = 512, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 4
    rng.shuffle(y)
    X = rng.normal(0.0, 0.5, size=(n, 8, 8))
    for i, k in enumerate(y):
        r, c = divmod(int(k), 2)
        X[i, 4 * r : 4 * r + 4, 4 * c : 4 * c + 4] += 1.0
    return np.column_stack([X.reshape(n, 64), y]).astype(np.float32)


def bn_campaign(base: Path, *, futility: bool, control: dict | None = None, **more: Any):
    """Write the recipe, the corpus and the spec in ``base``; train every run for real, close
    and seal ``base/out``. Returns (spec, folder, closed)."""
    base.mkdir(parents=True, exist_ok=True)
    module = f"user_bncnn_{uuid.uuid4().hex[:8]}"
    (base / f"{module}.py").write_text(textwrap.dedent(BN_CNN), encoding="utf-8")
    np.save(base / "images.npy", images())
    data = {
        "name": "bn-cnn",
        "question": "Does a higher learning rate make the CNN more accurate?",
        "packages": [{"gpu": "rtx4090", "days": 3}],
        "corpus": {"path": "images.npy", "sha256": sha256_file(base / "images.npy")},
        "control": {
            "recipe": f"{module}:Net",
            "batch_size": 32,
            "epochs": 6,
            "lr": 0.008,
            "threads": 1,
            **(control or {}),
        },
        "variants": [
            {"name": "lr-high", "changes": {"lr": 0.018}},
            {"name": "lr-higher", "changes": {"lr": 0.03}},
        ],
        "decision_rule": {"metric": "accuracy", "threshold": 0.5, "min_gain": 0.0},
        "stop_rules": {"require_restart": False, "futility": futility},
        "pilot": {"steps": 2},
        "calendar": [
            {"name": "control", "kind": "machine", "resource": "gpu", "hours": 1, "run": "control"},
            {"name": "high", "kind": "machine", "resource": "gpu", "hours": 1, "run": "lr-high"},
            {
                "name": "higher",
                "kind": "machine",
                "resource": "gpu",
                "hours": 1,
                "run": "lr-higher",
            },
        ],
        **more,
    }
    (base / "campaign.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    spec = load_spec(base / "campaign.yaml")
    folder = OutputFolder(base / "out")
    folder.copy_in(base / "campaign.yaml", "spec.yaml")
    folder.write_plan_once(calendar.plan(spec).to_dict())
    corpus = load_spec_corpus(spec, base_dir=base)
    train_every_run(spec, folder=folder, corpus=corpus)
    closed, _ = close_and_seal(
        spec,
        out=folder.root,
        base_dir=base,
        corpus=corpus,
        trained=spec.run_names(),
        campaign_id="bn-cnn-0001",
    )
    return spec, folder, closed


def rows(folder: OutputFolder, spec, run: str, kind: str) -> list[dict]:
    path = folder.run(spec.resolve_run(run).run_id).path / "metrics.jsonl"
    return [r for r in read_metrics(path) if r["kind"] == kind]


def verdict_of(closed) -> dict:
    """The verdict, its stop IDs (fresh in each campaign) and the measured training times its
    advice prices seeds with (they differ from run to run) left out."""
    v = closed.verdict.to_dict()
    v.pop("text"), v.pop("answer")
    v["more_seeds"] = (v.pop("resolve") or {}).get("more_seeds")
    return json.loads(re.sub(r"stop-[0-9a-f]{12}", "stop-?", json.dumps(v)))


@pytest.mark.slow
def test_no_futile_stop_on_an_untrained_tie_and_the_verdict_is_the_one_without_futility(
    tmp_path: Path,
) -> None:
    spec, folder, closed = bn_campaign(tmp_path / "on", futility=True)
    val_y = images()[256:384, -1]

    # At the first evaluation (step 8) every run still predicts class 0: the same accuracy,
    # example by example (the control's record there is "is it class 0?").
    first = {
        run: next(r for r in rows(folder, spec, run, "eval") if r.get("split", "val") == "val")
        for run in spec.run_names()
    }
    assert {r["step"] for r in first.values()} == {8}
    assert {r["accuracy"] for r in first.values()} == {float(np.mean(val_y == 0))}
    control_dir = folder.run(spec.resolve_run("control").run_id).path
    at8 = np.load(control_dir / "evals" / "scores-000000008.npz")
    assert list(at8["values"]) == list((val_y == 0).astype(float))

    # No variant is stopped as futile: not at its first evaluation (the grace), nor on the
    # tie after it (the control has not moved from its untrained value).
    assert [s["rule"] for s in folder.read_jsonl("stops.jsonl")] == ["below_threshold"]
    for run in ("lr-high", "lr-higher"):
        checks = rows(folder, spec, run, "futility")
        assert checks[0]["step"] == 8 and "within the grace" in checks[0]["skipped"]
        assert not any(c.get("futile") for c in checks), checks
        res = json.loads(
            (folder.run(spec.resolve_run(run).run_id).path / "result.json").read_text()
        )
        assert res["completed"] and res["steps_done"] == 48

    # The variants win (one seed a side: inconclusive, it asks for seeds, not adopted), and the
    # verdict is the one reached with futility off.
    v = closed.verdict
    assert (v.kind, v.run) == ("inconclusive", "lr-higher"), v.text
    assert "training noise is not measured" in v.text
    assert "tie" not in closed.verdict.numbers  # chosen on accuracy, not on measured time
    _, off_folder, off = bn_campaign(tmp_path / "off", futility=False)
    assert not any(s["rule"] == "futile" for s in off_folder.read_jsonl("stops.jsonl"))
    assert verdict_of(closed) == verdict_of(off)
