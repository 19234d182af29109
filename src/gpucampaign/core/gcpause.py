"""Building many objects at once without the garbage collector's pauses."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def without_gc_pauses() -> Iterator[None]:
    """Turn the automatic garbage collector off while a bulk of objects is built, and back on
    after (as it was: nested uses leave it to the outermost).

    Each full collection walks every object alive, and building a 100,000-step calendar
    triggered several: validating and planning it took 1.85 s with them and 1.10 s without
    (measured), and the growth from 10k to 100k steps was 21x instead of about 10x. Nothing is
    lost: garbage made meanwhile is reclaimed by the first collection after.
    """
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
