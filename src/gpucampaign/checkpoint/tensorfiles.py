"""Files of tensors, written fast and hashed: a checkpoint's bytes.

``write_hashed`` checksums while it writes and fsyncs; ``safetensors_buffers`` lays out a
safetensors file from the tensors' own memory; ``save_state`` streams ``torch.save`` into a
file, checksummed as it goes, without torch's own CRC pass (``serialize_state``: the same
into memory).
"""

from __future__ import annotations

import io
import json
import math
import mmap
import os
import sys
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpucampaign.core.files import new_checksum

_CHUNK = 16 * 1024 * 1024
#: ``save_state``'s write buffer: the small records of a training state go out together.
_STATE_BUFFER = 1024 * 1024


def _write_all(f: Any, chunk: memoryview) -> None:
    while chunk:
        n = f.write(chunk)
        chunk = chunk[n:]


def write_hashed(
    path: Path, data: bytes | bytearray | memoryview | Iterable[Any], *, kind: str = "sha256"
) -> tuple[str, int]:
    """Write one buffer (or several, back to back) to ``path`` with fsync; return
    (checksum, size), the checksum of ``kind`` (``crc32c`` or ``sha256``) taken while writing.

    CRC32C runs in hardware at many times disk speed, inline before each chunk is written.
    sha256 runs at about disk speed, so it goes to a second thread over the same in-memory
    buffers while they are written and fsynced: most of a write's real I/O happens in the
    fsync, so the two overlap instead of adding up. The buffers must stay unchanged until the
    call returns.
    """
    chunks: Iterable[Any] = [data] if isinstance(data, bytes | bytearray | memoryview) else data
    views = [memoryview(b).cast("B") for b in chunks]
    h = new_checksum(kind)
    inline = kind != "sha256"

    def digest() -> str:
        for mv in views:
            for off in range(0, len(mv), _CHUNK):
                h.update(mv[off : off + _CHUNK])
        return str(h.hexdigest())

    with ThreadPoolExecutor(max_workers=1) as pool:
        hashing = None if inline else pool.submit(digest)
        with open(path, "wb", buffering=0) as f:
            for mv in views:
                for off in range(0, len(mv), _CHUNK):
                    if inline:
                        h.update(mv[off : off + _CHUNK])
                    _write_all(f, mv[off : off + _CHUNK])
            os.fsync(f.fileno())
        result = str(h.hexdigest()) if hashing is None else hashing.result()
        return result, sum(len(mv) for mv in views)


def serialize_state(train_state: dict[str, Any]) -> memoryview:
    """``torch.save`` into memory, without its CRC32 pass (every file is checksummed anyway)."""
    buf = io.BytesIO()
    with _no_torch_crc32():
        torch.save(train_state, buf)
    return buf.getbuffer()


class _no_torch_crc32:
    def __enter__(self) -> None:
        self.previous = torch.serialization.get_crc32_options()
        torch.serialization.set_crc32_options(False)

    def __exit__(self, *exc: object) -> None:
        torch.serialization.set_crc32_options(self.previous)


class _ChecksummedFile:
    """A write-only file that checksums what goes through it: ``torch.save`` writes each
    record into it as a view of the tensor's memory, so nothing is copied on the way."""

    def __init__(self, f: Any, h: Any) -> None:
        self.f, self.h, self.size = f, h, 0
        self.error: OSError | None = None  # the first failed write (torch's writer hides it)

    def write(self, data: Any) -> int:
        mv = memoryview(data).cast("B")
        try:
            for off in range(0, len(mv), _CHUNK):
                self.h.update(mv[off : off + _CHUNK])
                _write_all(self.f, mv[off : off + _CHUNK])
        except OSError as exc:
            self.error = self.error or exc
            raise
        self.size += len(mv)
        return len(mv)

    def flush(self) -> None:
        pass


def save_state(path: Path, train_state: dict[str, Any], *, kind: str) -> tuple[str, int]:
    """``torch.save`` straight into ``path`` with fsync, checksummed (``kind``) as it is
    written and without torch's own CRC32 pass; return (checksum, size).

    Streaming the records to the file saves building the whole file in memory first (a
    growing buffer that is copied as it grows, then written). The file is the one
    ``torch.save(train_state, path)`` would write, loadable with ``weights_only=True``.
    """
    h = new_checksum(kind)
    # Buffered: torch's writer hands over each record's header and name apart (99 small
    # writes for the demo's Adam state), each unbuffered one a system call that gives the GIL
    # up and takes it back beside the training thread's steps (``checkpoint.state`` saves in
    # a thread). Measured here: the demo's state in 1.1 ms against 1.8 ms, a 9 MB one in
    # 20 ms against 24 ms. A record larger than the buffer goes straight through.
    with open(path, "wb", buffering=_STATE_BUFFER) as f:
        out = _ChecksummedFile(f, h)
        try:
            with _no_torch_crc32():
                torch.save(train_state, out)  # type: ignore[arg-type]  # write() is all it uses
        except RuntimeError as exc:
            # torch's zip writer may turn a failed write (a full disk) into its own error
            # ("unexpected pos ..."): the write's OSError is the cause to report.
            if out.error is not None:
                raise out.error from exc
            raise
        f.flush()
        os.fsync(f.fileno())
    return str(h.hexdigest()), out.size


_ST_DTYPES: dict[torch.dtype, str] = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
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
        header[name] = {
            "dtype": _ST_DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + raw.nbytes],
        }
        offset += raw.nbytes
        arrays.append(raw)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    return [len(head).to_bytes(8, "little"), head, *arrays]


_ST_TORCH = {name: dtype for dtype, name in _ST_DTYPES.items()}


#: The largest header a checkpoint's safetensors file may have (a few hundred bytes per
#: tensor: a million tensors fit); a bigger one is refused before it is parsed.
MAX_HEADER_BYTES = 16 * 1024 * 1024


def _is_int(x: Any) -> bool:
    return type(x) is int  # not a bool, not a float such as 1e999 (inf)


def _tensor_layout(
    name: str, info: Any, *, data_bytes: int
) -> tuple[torch.dtype, list[int], int, int]:
    """``(dtype, shape, begin, end)`` of one header entry, every field checked for bounds."""
    if not isinstance(info, dict):
        raise ValueError(f"tensor '{name}': its entry is not a mapping")
    dtype = _ST_TORCH.get(info.get("dtype"))  # type: ignore[arg-type]
    if dtype is None:
        raise ValueError(f"tensor '{name}': unknown dtype {info.get('dtype')!r}")
    shape, offsets = info.get("shape"), info.get("data_offsets")
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise ValueError(f"tensor '{name}': shape {shape!r} is not a list of sizes")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(_is_int(x) and 0 <= x <= data_bytes for x in offsets)
        or offsets[0] > offsets[1]
    ):
        raise ValueError(
            f"tensor '{name}': data_offsets {str(offsets)[:80]} are not two whole numbers "
            f"within the {data_bytes} bytes of data"
        )
    itemsize = torch.empty(0, dtype=dtype).element_size()
    if offsets[1] - offsets[0] != math.prod(shape) * itemsize:
        raise ValueError(f"tensor '{name}': byte range {offsets[0]}..{offsets[1]} does not fit")
    return dtype, shape, offsets[0], offsets[1]


def load_safetensors_buffer(buf: bytearray | mmap.mmap) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file held in ``buf`` (a buffer or a writable mapping of the
    file), as views of its memory (no copy).

    Checks what ``safetensors`` checks, with every number bounded before it is used: a header
    of at most ``MAX_HEADER_BYTES`` inside the buffer, a mapping of tensors with known dtypes,
    shapes of whole sizes, ``data_offsets`` of two whole numbers inside the data area, each
    range matching its shape, and ranges that tile the data area exactly; at least one tensor.

    Raises:
        ValueError: The buffer is not a valid safetensors file (the reason names the tensor).
    """
    if len(buf) < 8:
        raise ValueError("shorter than a safetensors header")
    n = int.from_bytes(buf[:8], "little")
    if n > MAX_HEADER_BYTES:
        raise ValueError(f"header of {n} bytes is over the limit of {MAX_HEADER_BYTES}")
    if n > len(buf) - 8:
        raise ValueError("header size beyond the end of the file")
    try:
        header = json.loads(bytes(buf[8 : 8 + n]))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(f"header is not JSON ({str(exc)[:200]})") from None
    if not isinstance(header, dict):
        raise ValueError("header is not a mapping")
    header.pop("__metadata__", None)
    if not header:
        raise ValueError("the header names no tensor")
    start = 8 + n
    layout = {
        name: _tensor_layout(name, info, data_bytes=len(buf) - start)
        for name, info in header.items()
    }
    end_expected, out = 0, {}
    for name, (dtype, shape, begin, end) in sorted(layout.items(), key=lambda kv: kv[1][2:]):
        if begin != end_expected:
            raise ValueError(f"tensor '{name}': byte range {begin}..{end} does not fit")
        end_expected = end
        numel = math.prod(shape)
        out[name] = (
            torch.frombuffer(buf, dtype=dtype, offset=start + begin, count=numel).reshape(shape)
            if numel
            else torch.empty(shape, dtype=dtype)
        )
    if start + end_expected != len(buf):
        raise ValueError("the tensors do not cover the data area")
    return out
