"""The paired bootstrap's resampling, shared by the verdict (``close/bootstrap.py``) and the
futility stop during training (``engine/futility.py``): both decide by the same interval (for one
seed a side, ``close/bootstrap.py``'s draws are these draws, call for call).

Seeded with numpy's PCG64, so the same per-example differences give the same interval on
every machine.
"""

from __future__ import annotations

import numpy as np

BOOT_SAMPLES = 2000
BOOT_SEED = 0
RESAMPLE_CHUNK = 250  # resamples per batch: keeps the index matrix small on large splits


def mean_interval(
    diff: np.ndarray, *, samples: int = BOOT_SAMPLES, seed: int = BOOT_SEED
) -> tuple[float, float]:
    """The 2.5% and 97.5% percentiles of the mean of ``diff`` over bootstrap resamples of its
    rows (one per-example difference a row: the pairing is already in it).

    Args:
        diff: per-example differences, a 1-D array of at least one finite value.
        samples: bootstrap resamples.
        seed: the resampling seed.
    """
    n = len(diff)
    rng = np.random.default_rng(seed)
    draws: list[float] = []
    for start in range(0, samples, RESAMPLE_CHUNK):
        idx = rng.integers(0, n, size=(min(RESAMPLE_CHUNK, samples - start), n))
        draws += diff[idx].mean(axis=1).tolist()
    low, high = np.percentile(np.asarray(draws), [2.5, 97.5])
    return float(low), float(high)
