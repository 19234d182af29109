"""Why a checkpoint is refused: :class:`CheckpointInvalid` and its kinds, and the checks of
what a load reads (each payload file against its meta, the weights against the model, the
train state against ``REQUIRED_STATE``)."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import torch

from gpucampaign.checkpoint.tensorfiles import load_safetensors_buffer
from gpucampaign.checkpoint.trainstate import REQUIRED_STATE
from gpucampaign.core.files import CHECKSUMS, checksum_bytes, map_checked
from gpucampaign.folder.layout import CHECKPOINT_STATE, WEIGHTS_FILE
from gpucampaign.storage import ContentMismatch, NotFound, Store

#: What was wrong with a refused checkpoint (``CheckpointInvalid.kind``).
MISSING, SHA256_MISMATCH, INVALID = "missing object", "sha256 mismatch", "invalid"
CHECKSUM_MISMATCH = "checksum mismatch"  # a payload file against its meta (crc32c or sha256)


class CheckpointInvalid(Exception):
    """One checkpoint cannot be used; ``reason`` says why (the caller falls back).

    ``kind`` is ``MISSING`` (``obj`` names the missing object), ``CHECKSUM_MISMATCH`` (a file
    against its meta; ``algorithm`` names the checksum), ``SHA256_MISMATCH`` (``obj``,
    with the ``expected`` and ``actual`` sha256) or ``INVALID`` (anything else).
    """

    def __init__(
        self,
        key: str,
        reason: str,
        kind: str = INVALID,
        obj: str | None = None,
        expected: str | None = None,
        actual: str | None = None,
        algorithm: str = "sha256",
    ) -> None:
        super().__init__(key, reason, kind, obj, expected, actual, algorithm)
        self.key = key
        self.reason = reason
        self.kind = kind
        self.obj = obj
        self.expected = expected
        self.actual = actual
        self.algorithm = algorithm

    def __str__(self) -> str:
        return f"checkpoint {self.key} refused: {self.reason}"


def deserialize(
    key: str, blobs: dict[str, Any], *, state_path: Path | None = None
) -> tuple[dict[str, torch.Tensor], Any]:
    """The model state (safetensors, as views of the read buffer or mapping) and the train
    state (``weights_only`` unpickling; with ``state_path``, its tensors map that file)."""
    try:
        blob = blobs[WEIGHTS_FILE]
        model_state = load_safetensors_buffer(bytearray(blob) if isinstance(blob, bytes) else blob)
    except (ValueError, KeyError, TypeError, RuntimeError, OverflowError) as exc:
        raise CheckpointInvalid(key, f"{WEIGHTS_FILE} is not valid safetensors ({exc})") from None
    try:
        if state_path is not None:
            # The file was just checked through a mapping of it: its pages are in the page
            # cache, and a mapped load makes the tensors views of them instead of copies.
            train_state = torch.load(state_path, map_location="cpu", weights_only=True, mmap=True)
        else:
            blob = blobs[CHECKPOINT_STATE]
            train_state = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    except Exception as exc:  # UnpicklingError for payloads, RuntimeError for bad zips
        first_line = str(exc).splitlines()[0][:200]
        raise CheckpointInvalid(
            key, f"{CHECKPOINT_STATE} refused by torch.load(weights_only=True): {first_line}"
        ) from None
    return model_state, train_state


def check_tensors(
    key: str, model_state: dict[str, torch.Tensor], *, expected: dict[str, tuple[int, ...]] | None
) -> None:
    """Refuse weights that are not the model's: a tensor lacking, added or of another shape."""
    if expected is None:
        return
    lacking = sorted(set(expected) - set(model_state))
    extra = sorted(set(model_state) - set(expected))
    if lacking or extra:
        raise CheckpointInvalid(
            key, f"{WEIGHTS_FILE} lacks tensors {lacking[:5]} / has unknown {extra[:5]}"
        )
    for name, shape in expected.items():
        if tuple(model_state[name].shape) != tuple(shape):
            raise CheckpointInvalid(
                key,
                f"{WEIGHTS_FILE}: tensor '{name}' has shape {list(model_state[name].shape)}, "
                f"the model's is {list(shape)}",
            )


def check_state(key: str, train_state: Any, *, step: int) -> None:
    """Refuse a train state that lacks a component of ``REQUIRED_STATE`` or another step's."""
    if not isinstance(train_state, dict):
        raise CheckpointInvalid(key, f"{CHECKPOINT_STATE} does not hold a mapping")
    for comp, subkeys in REQUIRED_STATE.items():
        if comp not in train_state:
            raise CheckpointInvalid(key, f"component '{comp}' is missing from {CHECKPOINT_STATE}")
        sub = train_state[comp]
        gone = [s for s in subkeys if not isinstance(sub, dict) or s not in sub]
        if gone:
            raise CheckpointInvalid(key, f"component '{comp}' lacks {gone}")
    if train_state["counters"]["global_step"] != step:
        raise CheckpointInvalid(key, f"state says step {train_state['counters']['global_step']}")


def fetch_checked(
    store: Store, key: str, name: str, *, want: dict[str, Any]
) -> tuple[Any, tuple[int, ...] | None]:
    """Payload file ``name`` of checkpoint ``key``, checked for size and checksum against its
    entry ``want`` in the meta: a buffer, or a private mapping of the file in a local store
    (then with the identity of the file that was checked)."""
    kind = next((k for k in CHECKSUMS if k in want), None)
    if kind is None:
        raise CheckpointInvalid(key, f"meta gives {name} no checksum")
    path = store.local_path(f"{key}/{name}")
    data: Any
    try:
        if path is None:
            # A remote store checks its download against its own sha256.
            data, sha256 = store.read_hashed(f"{key}/{name}")
            digest = sha256 if kind == "sha256" else checksum_bytes(data, kind=kind)
            stat = None
        else:
            size = path.stat().st_size
            if size != want.get("bytes"):
                raise CheckpointInvalid(
                    key, f"{name} has {size} bytes, meta says {want.get('bytes')} (truncated?)"
                )
            data, digest, st = map_checked(path, kind=kind)
            stat = file_identity(st)
    except (NotFound, FileNotFoundError):
        obj = f"{key}/{name}"
        raise CheckpointInvalid(key, f"component {name} is missing", MISSING, obj) from None
    except ContentMismatch as exc:  # the store's own record of the object's hash
        want_sha = str(want.get("sha256", exc.expected))
        raise CheckpointInvalid(
            key,
            f"{name} fails its sha256 (altered): sha256 {exc.actual}, the store's "
            f"record says {exc.expected}",
            SHA256_MISMATCH,
            f"{key}/{name}",
            want_sha,
            exc.actual,
        ) from None
    except (OSError, ValueError) as exc:
        raise CheckpointInvalid(key, f"{name} cannot be read ({exc})") from None
    if len(data) != want.get("bytes"):
        raise CheckpointInvalid(
            key, f"{name} has {len(data)} bytes, meta says {want.get('bytes')} (truncated?)"
        )
    if digest != want[kind]:
        raise CheckpointInvalid(
            key,
            f"{name} fails its {kind} (altered or corrupted): {kind} {digest}, "
            f"meta.json says {want[kind]}",
            CHECKSUM_MISMATCH,
            f"{key}/{name}",
            str(want[kind]),
            str(digest),
            algorithm=kind,
        )
    return data, stat


def file_identity(st: os.stat_result) -> tuple[int, ...]:
    """What tells a file from its replacement: device, inode, size, mtime."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
