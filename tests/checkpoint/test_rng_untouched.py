"""A model built outside a run's training leaves the global generators where they were."""

from __future__ import annotations

import random

import numpy as np
import torch

from gpucampaign.checkpoint.state import rng_untouched


def test_draws_inside_the_block_do_not_move_the_global_generators() -> None:
    """A reload drawing initial weights while another lane trains in this process must not
    move the states that lane checkpoints (its restart check would not reproduce them)."""
    torch.manual_seed(7)
    random.seed(7)
    np.random.seed(7)
    before = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())
    with rng_untouched():
        torch.nn.Linear(64, 64)  # initial weights: draws from torch's generator
        random.random()
        np.random.rand(3)
    assert torch.equal(torch.get_rng_state(), before[0])
    assert random.getstate() == before[1]
    assert np.array_equal(np.random.get_state()[1], before[2])
    # What was drawn inside is drawn again after: the block's draws were not lost to it.
    expected = torch.rand(4)
    torch.set_rng_state(before[0])
    assert torch.equal(torch.rand(4), expected)
