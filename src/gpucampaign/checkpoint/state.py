"""What a checkpoint holds besides the weights, taken without stalling the training loop: the
RNG states in a ``weights_only``-loadable form, a host copy of a state tree, and one save at a
time in a background thread.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, cast

import numpy as np
import torch

log = logging.getLogger(__name__)


# --- RNG states ----------------------------------------------------------------------------
def capture_rng() -> dict[str, Any]:
    """python, numpy, torch and cuda RNG states in a ``weights_only``-loadable form.

    numpy's state holds an ndarray, which ``weights_only`` refuses: it is kept as
    ``[name, int64 tensor of the key, pos, has_gauss, cached_gaussian]``. python's 625 words
    are kept as one int64 tensor too, ``[version, words, gauss]``: as a tuple of ints, each
    was a Python call of the snapshot and of the background save's pickler (a thousand or so
    a save, holding the interpreter's lock while the loop trains). ``restore_rng`` takes both.
    """
    version, words, gauss = random.getstate()
    # legacy=True, the default, gives this tuple; numpy's stub picks the dict overload.
    legacy = cast(tuple[str, np.ndarray, int, int, float], np.random.get_state())
    name, key, pos, has_gauss, cached = legacy
    cuda_ready = torch.cuda.is_available() and torch.cuda.is_initialized()
    cuda = torch.cuda.get_rng_state_all() if cuda_ready else []
    return {
        "python": [version, torch.tensor(words, dtype=torch.int64), gauss],
        "numpy": [
            str(name),
            torch.from_numpy(key.astype(np.int64)),
            int(pos),
            int(has_gauss),
            float(cached),
        ],
        "torch": torch.get_rng_state(),
        "cuda": list(cuda),
    }


def restore_rng(state: dict[str, Any]) -> None:
    """Set the global generators back to ``capture_rng``'s result."""
    version, internal, gauss = state["python"]
    words = internal.tolist() if isinstance(internal, torch.Tensor) else internal  # or a tuple
    random.setstate((version, tuple(words), gauss))
    name, key, pos, has_gauss, cached = state["numpy"]
    np.random.set_state(
        (name, key.numpy().astype(np.uint32), int(pos), int(has_gauss), float(cached))
    )
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# --- snapshots and saves in the background --------------------------------------------------
# Runs in threads of one process (GPU lock with 2+ slots) share the global generators:
# seeding and drawing initial weights must not interleave with another run's steps.
GLOBAL_RNG_LOCK = threading.RLock()


@contextmanager
def rng_untouched() -> Iterator[None]:
    """The global generators (python, numpy, torch, cuda) as they were before the block: a
    model built outside a run's training (a reload, predictions) draws its initial weights
    without moving the states a run training in another thread of this process checkpoints."""
    with GLOBAL_RNG_LOCK:
        states = capture_rng()
        try:
            yield
        finally:
            restore_rng(states)


def snapshot(obj: Any) -> Any:
    """A copy of a state tree whose tensors are copied to host memory (pinned from a GPU).

    What the training loop stalls for: after it returns, the model and optimizer may move on
    while the copy is written.
    """
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        if t.device.type == "cpu":
            return t.clone()
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=torch.cuda.is_available())
        return host.copy_(t, non_blocking=True)
    if isinstance(obj, dict):
        return {k: snapshot(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        items = [snapshot(v) for v in obj]
        return items if isinstance(obj, list) else tuple(items)
    return obj  # numbers, strings, None: immutable


class BackgroundSaves:
    """Runs one save at a time in a background thread; never two in flight."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        # Its thread started now, idle until the first save: started by that save, it would
        # run the save at once and hold the interpreter while the loop waits to go on (5 ms,
        # the switch interval, measured here), a stall no other save of the call has.
        self._pool.submit(int).result()
        self._pending: Any = None
        # Set by the save's thread when it ends: the loop asks ``finished`` at every step,
        # and a future's ``done()`` takes its lock.
        self._ended: Any = None

    @property
    def in_flight(self) -> bool:
        """True while a submitted save has not been collected by ``wait``."""
        return self._pending is not None

    @property
    def finished(self) -> bool:
        """True when a submitted save has ended and waits to be collected."""
        return self._pending is not None and self._ended is self._pending

    def submit(self, save: Any) -> None:
        """Start ``save()`` in the background; the previous one must have been collected."""
        assert self._pending is None, "a save is still in flight: wait() first"
        self._pending = self._pool.submit(save)
        self._pending.add_done_callback(self._end)

    def _end(self, future: Any) -> None:
        self._ended = future  # one reference store: atomic, no lock

    def wait(self) -> Any:
        """The in-flight save's result (None when there is none); re-raises its error."""
        pending, self._pending = self._pending, None
        return None if pending is None else pending.result()

    def close(self) -> None:
        """Let the in-flight save finish, then stop the thread (its result is dropped)."""
        try:
            self.wait()
        except Exception as exc:  # the caller is already failing; the save did not commit
            log.warning("the last background save failed: %s", exc)
        self._pool.shutdown(wait=True)
