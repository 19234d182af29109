"""A model built outside a run's training leaves the global generators where they were."""

from __future__ import annotations

import io
import random

import numpy as np
import torch

from gpucampaign.checkpoint.state import capture_rng, restore_rng, rng_untouched


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


def test_pythons_state_is_one_tensor_and_an_older_checkpoints_tuple_still_restores() -> None:
    """python's 625 words are kept as one int64 tensor, not 625 ints (each int was a Python
    call of the snapshot and of the background save's pickler, while the loop trains); a
    checkpoint written before, its state a tuple, restores the same generator."""
    random.seed(11)
    random.gauss(0, 1)  # a cached gaussian in the state too
    before = random.getstate()
    state = capture_rng()
    version, words, gauss = state["python"]
    assert isinstance(words, torch.Tensor) and words.dtype == torch.int64
    assert words.shape == (625,) and (version, gauss) == (before[0], before[2])
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    expected = [random.random() for _ in range(3)]
    restore_rng(torch.load(buf, weights_only=True))
    assert random.getstate() == before and [random.random() for _ in range(3)] == expected
    restore_rng({**state, "python": before})  # the older form: random.getstate() itself
    assert random.getstate() == before
