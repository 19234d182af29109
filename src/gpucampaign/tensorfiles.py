"""Files of tensors, written fast and hashed: a checkpoint's bytes.

``write_hashed`` hashes while it writes and fsyncs; ``safetensors_buffers`` lays out a
safetensors file from the tensors' own memory; ``serialize_state`` is ``torch.save`` into
memory without its CRC pass (every file is sha256-hashed anyway).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

_CHUNK = 16 * 1024 * 1024


def _write_all(f: Any, chunk: memoryview) -> None:
    while chunk:
        n = f.write(chunk)
        chunk = chunk[n:]


def write_hashed(
    path: Path, data: bytes | bytearray | memoryview | Iterable[Any]
) -> tuple[str, int]:
    """Write one buffer (or several, back to back) to ``path`` with fsync; return (sha256, size).

    The hash runs in a second thread over the same in-memory buffers while they are written
    and fsynced: sha256 runs at about disk speed, and most of a write's real I/O happens in
    the fsync, so the two overlap instead of adding up (a second hashing pass measured 30-40%
    of a save). The buffers must stay unchanged until the call returns.
    """
    views = [memoryview(b).cast("B") for b in
             ([data] if isinstance(data, bytes | bytearray | memoryview) else data)]

    def digest() -> str:
        h = hashlib.sha256()
        for mv in views:
            for off in range(0, len(mv), _CHUNK):
                h.update(mv[off : off + _CHUNK])
        return h.hexdigest()

    with ThreadPoolExecutor(max_workers=1) as pool:
        hashing = pool.submit(digest)
        with open(path, "wb", buffering=0) as f:
            for mv in views:
                for off in range(0, len(mv), _CHUNK):
                    _write_all(f, mv[off : off + _CHUNK])
            os.fsync(f.fileno())
        return hashing.result(), sum(len(mv) for mv in views)


def read_hashed(path: Path) -> tuple[bytes, str]:
    """The content of ``path`` and its sha256 (one read; the two files load in parallel)."""
    data = path.read_bytes()
    return data, hashlib.sha256(data).hexdigest()


def serialize_state(train_state: dict[str, Any]) -> memoryview:
    """``torch.save`` into memory, without its CRC32 pass (every file is sha256-hashed anyway)."""
    buf = io.BytesIO()
    previous = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(False)
    try:
        torch.save(train_state, buf)
    finally:
        torch.serialization.set_crc32_options(previous)
    return buf.getbuffer()


_ST_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL",
}


def safetensors_buffers(
    model_state: dict[str, torch.Tensor], *, metadata: dict[str, str]
) -> list[Any]:
    """The bytes of a safetensors file as buffers: header, then each tensor's own memory.

    Writing the tensors' memory directly (instead of ``safetensors.torch.save``, which builds
    the whole file in memory first) makes the save about as fast as a raw write. The layout
    is the documented one: u64 little-endian header size, JSON header padded with spaces to
    8 bytes, tensors back to back; ``safetensors`` itself loads and validates it.
    """
    assert sys.byteorder == "little", "safetensors stores little-endian data"
    header: dict[str, Any] = {"__metadata__": metadata}
    arrays, offset = [], 0
    for name in sorted(model_state):
        t = model_state[name].detach().to("cpu").contiguous()
        if t.dtype not in _ST_DTYPES:
            raise TypeError(f"tensor '{name}': dtype {t.dtype} cannot be checkpointed")
        raw = t.reshape(-1).view(torch.uint8).numpy() if t.numel() else np.zeros(0, dtype=np.uint8)
        header[name] = {"dtype": _ST_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + raw.nbytes]}
        offset += raw.nbytes
        arrays.append(raw)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    return [len(head).to_bytes(8, "little"), head, *arrays]
