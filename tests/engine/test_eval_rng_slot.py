"""An evaluation draws from its own run's generators, never from another lane's."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from gpucampaign.engine import devices, outcome
from gpucampaign.engine.devices import RngSlot


def test_the_final_evaluation_holds_its_runs_rng_slot(monkeypatch) -> None:
    """A run's final evaluation (outside the loop's steps) takes its own RNG slot: a
    DataLoader's iterator draws a base seed from torch's global generator, and a run training
    in another lane of the process checkpoints that generator (its restart check failed on
    ``rng.torch`` when a finished lane's final evaluation drew from it)."""
    other, mine = RngSlot(), RngSlot()
    torch.manual_seed(1)
    with other.held():  # the other lane trains: the globals hold its states
        pass
    other_state = torch.get_rng_state()
    seen: dict[str, Any] = {}

    def fake_split(recipe: Any, model: Any, dataset: Any, **kw: Any) -> dict[str, float]:
        seen["owner_is_mine"] = devices._rng_owner is mine
        torch.utils.data.DataLoader(list(range(4))).__iter__()  # draws a base seed
        return {"accuracy": 1.0}

    monkeypatch.setattr(outcome, "evaluate_split", fake_split)
    r = SimpleNamespace(
        dist=SimpleNamespace(is_main=True),
        split={"val": [1, 2, 3]}.get,
        spec=SimpleNamespace(decision_rule=None),
        recipe=None,
        state=SimpleNamespace(model=None, global_step=5, epoch=0),
        config=None,
        device=torch.device("cpu"),
        eval_times=[],
        mlog=SimpleNamespace(write=lambda row: None),
        rng=mine,
    )
    assert outcome.evaluate(r, "val", final=True) == {"accuracy": 1.0}  # type: ignore[arg-type]
    assert seen["owner_is_mine"]
    with other.held():  # the other lane takes its generators back: untouched by that draw
        assert torch.equal(torch.get_rng_state(), other_state)
