"""Small campaign specs for the tests that need a calendar but train nothing."""

from __future__ import annotations

from typing import Any

from gpucampaign.config import CampaignSpec, parse_spec


def one_lot_spec(*steps: dict[str, Any]) -> CampaignSpec:
    """A campaign ``x`` on one 3-day rtx4090 lot whose calendar holds these steps, each a
    one-hour GPU machine step unless it says otherwise; the control is a tiny MLP."""
    return parse_spec(
        {
            "name": "x",
            "packages": [{"gpu": "rtx4090", "days": 3}],
            "calendar": [
                {"kind": "machine", "resource": "gpu", "hours": 1, **step} for step in steps
            ],
            "control": {
                "recipe": "mlp",
                "hidden": [16],
                "batch_size": 128,
                "epochs": 2,
                "lr": 0.01,
            },
        }
    )


#: The training step of the control alone.
TRAIN_CONTROL = {"name": "train-control", "run": "control"}


# A linear regression read from a text file of "x1 x2 y" lines: the user's code, not src/.
REGRESS_RECIPE = """
import torch
from torch.utils.data import TensorDataset
from gpucampaign import Recipe


class Regress(Recipe):
    metric = "mse"

    def datasets(self, ctx):
        rows = [list(map(float, line.split())) for line in ctx.corpus.path.read_text().split("\\n")
                if line.strip()]
        t = torch.tensor(rows)
        X, y = t[:, :2], t[:, 2:]
        n = len(t)
        return {"train": TensorDataset(X[: n // 2], y[: n // 2]),
                "val": TensorDataset(X[n // 2 : 3 * n // 4], y[n // 2 : 3 * n // 4]),
                "test": TensorDataset(X[3 * n // 4 :], y[3 * n // 4 :])}

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
        return {"mse": se / n}
"""
