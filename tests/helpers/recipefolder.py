"""A user's recipe campaign on an image folder or an ``.npy`` corpus, trained by the engine and
closed and sealed by the production close (no Prefect): the folder ``RELOAD.md`` describes."""

from __future__ import annotations

import textwrap
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from gpucampaign.config import load_spec
from gpucampaign.data.corpus import load_spec_corpus
from gpucampaign.data.pins import input_sha256
from gpucampaign.folder.layout import OutputFolder
from gpucampaign.plan import calendar
from tests.helpers.closing import close_and_seal, train_every_run

# Two classes of 8x8 grey PNG images, one folder per class; the file stem is the example's ID.
IMAGE_RECIPE = """
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from gpucampaign import Recipe

CLASSES = ("dark", "light")


class Images(Dataset):
    def __init__(self, files):
        self.files = files
        self.ids = [p.stem for p in files]

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        p = self.files[i]
        x = np.asarray(Image.open(p), dtype=np.float32).reshape(-1) / 255.0
        y = CLASSES.index(p.parent.name) if p.parent.name in CLASSES else -1
        return torch.from_numpy(x), torch.tensor(y)


class Pictures(Recipe):
    metric = "accuracy"

    def datasets(self, ctx):
        files = sorted(ctx.corpus.path.rglob("*.png"), key=lambda p: p.stem)
        parts = {"train": [], "val": [], "test": []}
        for n, p in enumerate(files):
            parts[("train", "train", "train", "val", "test")[n % 5]].append(p)
        return {k: Images(v) for k, v in parts.items()}

    def model(self, ctx):
        return torch.nn.Linear(64, 2)

    def loss(self, model, batch):
        x, y = batch
        return torch.nn.functional.cross_entropy(model(x), y)

    def evaluate(self, model, batches):
        right, n = 0, 0
        for x, y in batches:
            right += int((model(x).argmax(1) == y).sum())
            n += len(y)
        return {"accuracy": right / n}

    def predict(self, model, batch):
        x, y = batch
        prob = torch.softmax(model(x), dim=1)
        conf, pred = prob.max(dim=1)
        return [
            {"label": int(a), "prediction": int(b), "confidence": float(c)}
            for a, b, c in zip(y.tolist(), pred.tolist(), conf.tolist())
        ]
"""

# A regression on an .npy array of rows (x1, x2, y); no ids: positions in each split.
NPY_RECIPE = """
import numpy as np
import torch
from torch.utils.data import TensorDataset

from gpucampaign import Recipe


class Points(Recipe):
    metric = "mse"

    def datasets(self, ctx):
        t = torch.from_numpy(np.load(ctx.corpus.path)).float()
        X, y = t[:, :2], t[:, 2:]
        n = len(t)
        a, b = n // 2, 3 * n // 4
        return {"train": TensorDataset(X[:a], y[:a]), "val": TensorDataset(X[a:b], y[a:b]),
                "test": TensorDataset(X[b:], y[b:])}

    def model(self, ctx):
        return torch.nn.Linear(2, 1)

    def loss(self, model, batch):
        x, y = batch
        return torch.nn.functional.mse_loss(model(x), y)

    def evaluate(self, model, batches):
        se, n = 0.0, 0
        for x, y in batches:
            se += float(((model(x) - y) ** 2).sum())
            n += len(y)
        return {"mse": se / n}

    def predict(self, model, batch):
        x, y = batch
        return [{"label": float(a), "prediction": float(b)}
                for a, b in zip(y[:, 0].tolist(), model(x)[:, 0].tolist())]
"""


def write_images(folder: Path, *, n: int = 32, seed: int = 0) -> Path:
    """``n`` 8x8 PNG images under ``folder/dark`` and ``folder/light``; the folder."""
    from PIL import Image

    rng = np.random.RandomState(seed)
    for i in range(n):
        cls = ("dark", "light")[i % 2]
        base = 60 if cls == "dark" else 190
        pixels = np.clip(rng.normal(base, 40, size=(8, 8)), 0, 255).astype(np.uint8)
        (folder / cls).mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels, mode="L").save(folder / cls / f"img{i:03d}.png")
    return folder


def write_points(path: Path, *, n: int = 48, seed: int = 0) -> Path:
    """An ``.npy`` array of ``n`` rows (x1, x2, 2*x1 - x2 + noise); the file."""
    rng = np.random.RandomState(seed)
    X = rng.rand(n, 2)
    y = 2 * X[:, 0] - X[:, 1] + 0.05 * rng.randn(n)
    np.save(path, np.column_stack([X, y]).astype(np.float32))
    return path


KINDS: dict[str, dict[str, Any]] = {
    "images": {
        "recipe": IMAGE_RECIPE,
        "cls": "Pictures",
        "corpus": "data/images",
        "rule": {"metric": "accuracy", "direction": "maximize", "threshold": 0.0},
    },
    "npy": {
        "recipe": NPY_RECIPE,
        "cls": "Points",
        "corpus": "points.npy",
        "rule": {"metric": "mse", "direction": "minimize", "threshold": 100.0},
    },
}


def write_recipe_project(base: Path, kind: str) -> Path:
    """The user's project under ``base``: the recipe file, the corpus and ``campaign.yaml``
    (a control and one seed of it: two runs); the spec's path."""
    info = KINDS[kind]
    base.mkdir(parents=True, exist_ok=True)
    module = f"user_{kind}_{uuid.uuid4().hex[:8]}"
    (base / f"{module}.py").write_text(textwrap.dedent(info["recipe"]), encoding="utf-8")
    corpus = base / info["corpus"]
    corpus.parent.mkdir(parents=True, exist_ok=True)
    if kind == "images":
        write_images(corpus)
    else:
        write_points(corpus)
    spec = {
        "name": f"byo-{kind}",
        "packages": [{"gpu": "rtx4090", "days": 3}],
        "calendar": [{"name": "prep", "kind": "human", "hours": 1}],
        "corpus": {"path": info["corpus"], "sha256": input_sha256(corpus)},
        "control": {
            "recipe": f"{module}:{info['cls']}",
            "batch_size": 4,
            "epochs": 1,
            "lr": 0.1,
            "threads": 1,
        },
        "variants": [{"name": "fast", "changes": {"lr": 0.2}}],
        "decision_rule": {**info["rule"], "select_split": "val"},
        "pilot": {"steps": 2},
    }
    path = base / "campaign.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return path


def build_recipe_folder(base: Path, kind: str) -> dict[str, Any]:
    """A sealed output folder ``base/out`` of the recipe campaign of ``kind`` (``images`` or
    ``npy``) written under ``base/src``: ``{out, src, spec, run_ids}``."""
    spec_file = write_recipe_project(base / "src", kind)
    spec = load_spec(spec_file)
    out = base / "out"
    folder = OutputFolder(out)
    folder.copy_in(spec_file, "spec.yaml")
    folder.write_plan_once(calendar.plan(spec).to_dict())
    corpus = load_spec_corpus(spec, base_dir=spec_file.parent)
    trained = train_every_run(spec, folder=folder, corpus=corpus)
    close_and_seal(
        spec,
        out=out,
        base_dir=spec_file.parent,
        corpus=corpus,
        trained=trained,
        campaign_id=f"byo-{kind}-0001",
    )
    return {
        "out": out,
        "src": spec_file.parent,
        "spec": spec,
        "run_ids": {r: spec.resolve_run(r).run_id for r in spec.run_names()},
    }
