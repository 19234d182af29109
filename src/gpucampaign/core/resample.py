"""The bootstrap's constants: the verdict's paired bootstrap of macro F1's examples
(``close/bootstrap.py``; every other interval is in closed form, ``core/gain_interval.py``).

Seeded with numpy's PCG64, so the same predictions give the same interval on every machine.
"""

from __future__ import annotations

BOOT_SAMPLES = 2000
BOOT_SEED = 0
RESAMPLE_CHUNK = 250  # resamples per batch: keeps the index matrix small on large splits
