"""A renter's own project folder: a recipe file of theirs (``seqreg.py``, the regression of
``specs.REGRESS_RECIPE``), its corpus and ``campaign.yaml``, nothing of the checkout."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import torch
import yaml

from gpucampaign.core.files import sha256_file
from tests.helpers.specs import REGRESS_RECIPE

RECIPE_MODULE = "seqreg"


def _step(name: str, resource: str | None, hours: float, after: list[str], **more: Any) -> dict:
    kind = {"kind": "machine", "resource": resource} if resource else {"kind": "human"}
    return {"name": name, **kind, "hours": hours, **({"after": after} if after else {}), **more}


CALENDAR = [
    _step("audit", "cpu", 0.05, [], phase="audit"),
    _step("pilot", "gpu", 0.1, ["audit"], phase="pilot"),
    _step("decide", None, 0.25, ["pilot"], phase="decide"),
    _step("train-control", "gpu", 0.25, ["decide"], run="control"),
    _step("train-wide", "gpu", 0.25, ["train-control"], run="wide"),
    _step("restart-check", "gpu", 0.1, ["train-control"], phase="restart"),
    _step("predictions", "cpu", 0.1, ["train-control"], phase="predict"),
    _step("close", "cpu", 0.05, ["predictions", "restart-check"], phase="close"),
]


def write_regress_project(folder: Path, *, gpus: int = 1, gpu: str = "b200") -> Path:
    """``folder/{seqreg.py, points.txt, campaign.yaml}``: the control (``gpus`` processes, on
    the CPU) and one variant on one lot of ``gpu``; the spec's path."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{RECIPE_MODULE}.py").write_text(textwrap.dedent(REGRESS_RECIPE), encoding="utf-8")
    g = torch.Generator().manual_seed(0)
    X = torch.rand(96, 2, generator=g)
    y = 2 * X[:, 0] - X[:, 1] + 0.05 * torch.randn(96, generator=g)
    rows = [f"{a:.6f} {b:.6f} {c:.6f}" for (a, b), c in zip(X.tolist(), y.tolist(), strict=True)]
    (folder / "points.txt").write_text("\n".join(rows) + "\n", encoding="utf-8")
    spec = {
        "name": "seqreg",
        "packages": [{"gpu": gpu, "days": 3, "price_usd": 900}],
        "corpus": {"path": "points.txt", "sha256": sha256_file(folder / "points.txt")},
        "control": {
            "recipe": f"{RECIPE_MODULE}:Regress",
            "args": {"width": 4},
            "batch_size": 8,
            "epochs": 2,
            "lr": 0.05,
            "threads": 1,
            "gpus": gpus,
            "device": "cpu",
        },
        "variants": [{"name": "wide", "changes": {"args": {"width": 8}}}],
        "decision_rule": {
            "metric": "mse",
            "direction": "minimize",
            "threshold": 10.0,
            "select_split": "val",
        },
        "pilot": {"steps": 3},
        "calendar": CALENDAR,
    }
    path = folder / "campaign.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return path
