"""Small campaign specs for the tests that need a calendar but train nothing."""

from __future__ import annotations

from typing import Any

from gpucampaign.spec import CampaignSpec, parse_spec


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
