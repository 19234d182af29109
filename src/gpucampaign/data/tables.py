"""Corpus files: write the bundled digits corpus, read a CSV or Parquet file as string columns.

What the columns mean (IDs, splits, labels, features) is checked by ``corpus``.
"""

from __future__ import annotations

import csv
import hashlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpucampaign.config import SpecError

DIGITS_FRACTIONS = {"test": 0.2, "val": 0.1}  # the rest is train


# --- the bundled corpus ------------------------------------------------------------------
def digits_split(labels: np.ndarray, *, seed: int = 0) -> np.ndarray:
    """A stratified train/val/test assignment, fixed by ``seed``.

    ``np.random.RandomState`` is used on purpose: its stream is frozen across numpy
    versions, so the file (and its pinned sha256) does not change with an upgrade.
    """
    rng = np.random.RandomState(seed)
    split = np.empty(len(labels), dtype=object)
    for cls in np.unique(labels):
        idx = np.flatnonzero(labels == cls)
        idx = idx[rng.permutation(len(idx))]
        n_test = int(round(len(idx) * DIGITS_FRACTIONS["test"]))
        n_val = int(round(len(idx) * DIGITS_FRACTIONS["val"]))
        split[idx[:n_test]] = "test"
        split[idx[n_test : n_test + n_val]] = "val"
        split[idx[n_test + n_val :]] = "train"
    return split


def write_digits_corpus(path: str | Path, *, seed: int = 0) -> str:
    """Write scikit-learn's bundled digits (no download) as a corpus CSV.

    Columns: ``id`` (``d0000``..), ``split`` (stratified, seeded), ``label``, ``f0``..``f63``
    (integer pixel values 0..16). The bytes depend only on ``seed``.

    Args:
        path: Destination CSV file (its folder is created).
        seed: Seed of the split.

    Returns:
        The sha256 of the written file, to pin in the spec.
    """
    # sklearn only to write the demo corpus: slow to import
    from sklearn.datasets import load_digits

    data = load_digits()
    X = data.data.astype(np.int64)
    y = data.target.astype(np.int64)
    split = digits_split(y, seed=seed)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["id", "split", "label", *[f"f{j}" for j in range(X.shape[1])]])
    for i in range(len(y)):
        writer.writerow([f"d{i:04d}", split[i], int(y[i]), *map(int, X[i])])
    raw = buf.getvalue().encode("utf-8")
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(raw)
    return hashlib.sha256(raw).hexdigest()


# --- reading -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Table:
    """A corpus file as columns of strings (no type guessing yet)."""

    columns: tuple[str, ...]
    data: dict[str, list[str]]

    @property
    def n_rows(self) -> int:
        return len(self.data[self.columns[0]]) if self.columns else 0


def read_table(path: str | Path, *, data: bytes | None = None) -> Table:
    """Read a CSV (any extension but .parquet) or a Parquet file into string columns.

    With ``data``, those bytes are parsed and ``path`` only names the file and its format:
    the caller has already read (and hashed) them, so nothing is read from disk again.
    """
    p = Path(path)
    if p.suffix.lower() in (".parquet", ".pq"):
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise SpecError(
                f"corpus '{p.name}' is Parquet but pyarrow is not installed: "
                "`pip install pyarrow`, or give a CSV file.",
                field="corpus.path",
            ) from None
        cols = pq.read_table(p if data is None else io.BytesIO(data)).to_pydict()
        return Table(
            tuple(cols),
            {k: ["" if v is None else str(v) for v in vals] for k, vals in cols.items()},
        )
    if data is not None:
        return _read_csv(io.StringIO(data.decode("utf-8"), newline=""), name=p.name)
    with open(p, newline="", encoding="utf-8") as f:
        return _read_csv(f, name=p.name)


def _read_csv(f: io.TextIOBase | Any, *, name: str) -> Table:
    reader = csv.reader(f)
    try:
        header = next(reader)
    except StopIteration:
        return Table((), {})
    header = [h.strip() for h in header]
    data: dict[str, list[str]] = {h: [] for h in header}
    if len(data) != len(header):
        dup = sorted({h for h in header if header.count(h) > 1})
        raise SpecError(f"corpus '{name}': duplicate column name(s) {dup}.", field="corpus.path")
    for lineno, row in enumerate(reader, start=2):
        if not row:
            continue
        if len(row) != len(header):
            raise SpecError(
                f"corpus '{name}' line {lineno}: {len(row)} fields, header has {len(header)}.",
                field="corpus.path",
            )
        for h, v in zip(header, row, strict=True):
            data[h].append(v.strip())
    return Table(tuple(header), data)
