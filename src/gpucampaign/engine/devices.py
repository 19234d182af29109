"""The torch pieces every run builds the same way: seeds, device, precision, optimizer, schedule."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from gpucampaign.checkpoint.state import GLOBAL_RNG_LOCK, capture_rng, restore_rng
from gpucampaign.config import RunConfig, SpecError

_rng_owner: RngSlot | None = None  # whose states the global generators hold now


class RngSlot:
    """One run's claim on the process's global generators (python, numpy, torch, cuda).

    Runs on the lanes of one process (threads) would otherwise draw from, reseed, and
    checkpoint each other's states: a run's checkpoint must hold the states its own steps
    left, or its restart does not reproduce it. While a run holds its slot, no other run
    of the process touches the generators; when another run takes them, the states the
    previous run left are kept in its slot and given back when it takes them again. With one
    run in the process nothing is copied: only an uncontended lock is taken.
    """

    def __init__(self) -> None:
        self.saved: dict[str, Any] | None = None
        # The lock every slot takes (built-in ``with``: no Python frame), and whether the
        # global generators hold this slot's states; both read under the lock, ``owned`` set
        # only there (``take``). The loop enters ``lock`` at every step and calls ``take`` only
        # when another run took the generators meanwhile.
        self.lock = GLOBAL_RNG_LOCK
        self.owned = False

    def held(self) -> RngSlot:
        """The global generators hold this run's states inside the block (``with
        slot.held():``). A class's ``__enter__`` rather than a generator."""
        return self

    def take(self) -> None:
        """Give the global generators this slot's states, the previous owner's kept in its
        slot; called with ``lock`` held, when ``owned`` is False."""
        global _rng_owner
        previous = _rng_owner
        if previous is not None and previous is not self:
            previous.saved = capture_rng()
            previous.owned = False
        if self.saved is not None:
            restore_rng(self.saved)
        _rng_owner = self
        self.owned = True

    def __enter__(self) -> None:
        GLOBAL_RNG_LOCK.acquire()
        if not self.owned:
            try:
                self.take()
            except BaseException:
                GLOBAL_RNG_LOCK.release()
                raise

    # The lock's own ``__exit__`` (a built-in: not bound to the slot, no Python frame): it
    # releases the lock, whatever the block raised, and lets it propagate.
    __exit__ = GLOBAL_RNG_LOCK.__exit__


AMP_DTYPES: dict[str, torch.dtype | None] = {
    "fp32": None,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def pick_device(requested: str = "auto", *, lane: int = 0) -> torch.device:
    """The run config's ``device``: ``auto`` is CUDA when present, else CPU.

    ``auto`` and ``cuda`` without an index take the GPU of the plan's lane (``lane`` modulo
    the devices present), so two lanes never share device 0; ``cuda:N`` is taken as given.
    On CUDA, cuDNN is made deterministic (no benchmark autotuning).

    Raises:
        SpecError: A CUDA device is asked for and is not there.
    """
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(requested)
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = device.index if device.index is not None else lane % max(1, count)
        if index >= count:
            raise SpecError(
                f"device '{requested}' is not available here ({count} CUDA "
                "device(s)); use 'auto' or 'cpu'.",
                field="device",
            )
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        device = torch.device("cuda", index)
    return device


def device_settings(device: torch.device) -> dict[str, Any]:
    """What a run records about its device: name and the determinism settings in force."""
    info: dict[str, Any] = {"device": str(device), "device_type": device.type}
    if device.type == "cuda":
        info.update(
            device_name=torch.cuda.get_device_name(device),
            cudnn_deterministic=torch.backends.cudnn.deterministic,
            cudnn_benchmark=torch.backends.cudnn.benchmark,
        )
    return info


def check_precision(precision: str, device: torch.device) -> None:
    """Refuse a precision this device's autocast cannot run.

    Raises:
        SpecError: Autocast fails, or does not compute in the precision's dtype.
    """
    dtype = AMP_DTYPES[precision]
    if dtype is None:
        return
    try:
        ones = torch.ones(2, 2, device=device)
        with torch.autocast(device.type, dtype=dtype):
            out = torch.nn.functional.linear(ones, ones)
        ok = out.dtype == dtype
    except (RuntimeError, TypeError) as exc:
        raise SpecError(
            f"precision '{precision}' is not supported by autocast on {device.type} ({exc}); "
            "use 'fp32' or 'bf16' there.",
            field="precision",
        ) from None
    if not ok:
        raise SpecError(
            f"precision '{precision}': autocast on {device.type} does not compute in {dtype}; "
            "use 'fp32' or 'bf16' there.",
            field="precision",
        )


def build_optimizer(config: RunConfig, params: Any) -> torch.optim.Optimizer:
    """adam / adamw / sgd (momentum 0.9)."""
    if config.optimizer == "adam":
        return torch.optim.Adam(params, lr=config.lr, weight_decay=config.weight_decay)
    if config.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    return torch.optim.SGD(params, lr=config.lr, momentum=0.9, weight_decay=config.weight_decay)


def build_scheduler(
    config: RunConfig, optimizer: torch.optim.Optimizer, *, planned_steps: int
) -> Any:
    """Per-step schedule: none, cosine to 0 over the planned steps, or step (x0.1 every third)."""
    if config.scheduler == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=planned_steps)
    if config.scheduler == "step":
        step_size = max(1, planned_steps // 3)
        return torch.optim.lr_scheduler.StepLR(optimizer, step_size=step_size, gamma=0.1)
    return None
