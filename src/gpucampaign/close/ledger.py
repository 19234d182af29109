"""The expense ledger of a campaign: expenses declared after the start, kept apart from the rental.

``ledger.jsonl`` in the output folder is append-only. The manifest records the size and hash
the ledger had when the folder was sealed; an expense added later appends to it, and the check
of the folder accepts that growth as long as the sealed part is unchanged. The budget reads the
spec's expenses and the ledger together; no tax or transfer cost is ever added to either.
"""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import re
import stat
import unicodedata
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gpucampaign.close.budget import with_expenses
from gpucampaign.config import SpecError, load_spec
from gpucampaign.core.errors import ArgumentError, FolderError
from gpucampaign.core.files import jsonl_line, sha256_bytes, utc_now
from gpucampaign.folder.layout import LEDGER_FILE, SPEC_COPY, OutputFolder

_REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/#-]{0,79}$")
#: The most bytes a ledger may hold (about 50,000 expenses): a larger one is refused unread.
MAX_LEDGER_BYTES = 16 * 2**20


def _unprintable(c: str) -> bool:
    """A control character (C0, DEL, C1: terminal escapes), a line or paragraph separator, or
    a direction override: nothing a receipt's one line needs, and what a terminal obeys."""
    return (
        unicodedata.category(c) in ("Cc", "Zl", "Zp")
        or "\u202a" <= c <= "\u202e"
        or ("\u2066" <= c <= "\u2069")
    )


class LedgerExpense(BaseModel):
    """One expense really incurred, as declared by a person after the campaign started."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    usd: float = Field(gt=0, strict=True, description="Amount paid, in USD, as on the receipt.")
    what: str = Field(min_length=1, max_length=200, description="What was paid for.")
    order_ref: str | None = Field(default=None, description="The provider's order reference.")
    time: str = Field(default_factory=utc_now, description="When it was recorded (UTC).")

    @field_validator("usd")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v) or v > 1e9:
            raise ValueError("must be a finite amount below one billion USD")
        return round(v, 2)

    @field_validator("what")
    @classmethod
    def _one_line(cls, v: str) -> str:
        v = v.strip()
        if not v or any(_unprintable(c) for c in v):
            raise ValueError("must be one line of printable text")
        return v

    @field_validator("order_ref")
    @classmethod
    def _ref(cls, v: str | None) -> str | None:
        if v is not None and not _REF.fullmatch(v):
            raise ValueError("use letters, digits and . _ : / # - (at most 80 characters)")
        return v

    def as_expense(self) -> dict[str, Any]:
        """The shape the budget close takes: ``{name, usd, note}``."""
        note = f"order {self.order_ref}; " if self.order_ref else ""
        return {"name": self.what, "usd": self.usd, "note": f"{note}recorded {self.time}"}


def add_expense(
    root: str | Path, *, usd: float, what: str, order_ref: str | None = None
) -> LedgerExpense:
    """Append one expense to the ledger of the campaign folder ``root``.

    Raises:
        SpecError: the folder is not a campaign's output folder, or an argument is invalid
            (the message names the option and the fix).
    """
    folder = Path(root)
    if not (folder / SPEC_COPY).is_file():
        raise FolderError(
            f"'{folder}' is not a campaign's output folder (no spec.yaml): give the folder "
            "that `campaign run` wrote.",
            field="OUT",
        )
    try:
        entry = LedgerExpense(usd=usd, what=what, order_ref=order_ref)
    except ValidationError as exc:
        err = exc.errors()[0]
        option = {"usd": "--usd", "what": "--what", "order_ref": "--order-ref"}[str(err["loc"][0])]
        raise ArgumentError(f"option '{option}': {err['msg']}.", field=option) from None
    _append_locked(OutputFolder(folder).path(LEDGER_FILE), jsonl_line(entry.model_dump()))
    return entry


def _append_locked(path: Path, line: str) -> None:
    """Append one line under the ledger's own short lock, fsynced.

    The ledger is append-only and only ``campaign expense`` writes it, so an expense needs no
    lock on the whole folder: it goes in while a campaign runs (whose close reads the ledger
    then) or after the seal (which accepts a ledger that only grew). The lock orders two
    expenses added at once; a link planted as the ledger is not followed.
    """
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        why = "not a regular file" if exc.errno == errno.ENXIO else exc.strerror  # a FIFO
        raise FolderError(f"cannot append to '{path}': {why}.", field="OUT") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO with a reader, a device
            raise FolderError(f"cannot append to '{path}': not a regular file.", field="OUT")
        fcntl.flock(fd, fcntl.LOCK_EX)
        data = line.encode("utf-8")
        while data:
            data = data[os.write(fd, data) :]
        os.fsync(fd)
    finally:
        os.close(fd)  # releases the lock


class LedgerError(SpecError):
    """A ledger line that is not an expense ``campaign expense`` writes (a number that is not
    finite, a field it never writes, a torn line before the last)."""


def read_ledger(root: str | Path) -> list[LedgerExpense]:
    """Every expense of the ledger, in the order recorded (empty when there is none).

    Raises:
        LedgerError: a line is not an expense (or the ledger is larger than ``MAX_LEDGER_BYTES``).
    """
    path = OutputFolder(root).path(LEDGER_FILE)
    data = read_ledger_bytes(path)
    return [] if data is None else parse_ledger(data, where=str(path))


def read_ledger_bytes(path: str | Path) -> bytes | None:
    """The bytes of the ledger at ``path`` (None when there is none), read without following
    a link and without blocking, and only from a regular file: a FIFO or a device planted as
    the ledger is refused, never waited on.

    Raises:
        LedgerError: It is not a regular file, or is larger than ``MAX_LEDGER_BYTES``.
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise LedgerError(f"cannot read '{path}': {exc.strerror}.", field=LEDGER_FILE) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise LedgerError(
                f"'{path}' is not a regular file: not a ledger that `campaign expense` wrote.",
                field=LEDGER_FILE,
            )
        chunks, size = [], 0
        while size <= MAX_LEDGER_BYTES and (chunk := os.read(fd, 1 << 20)):
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not an amount")


def parse_ledger(data: bytes, *, where: str) -> list[LedgerExpense]:
    """The expenses of a ledger's bytes; a torn last line (no new line: a writer killed
    mid-append) is left out, any other line that is not an expense is a ``LedgerError``."""
    if len(data) > MAX_LEDGER_BYTES:
        raise LedgerError(
            f"'{where}' is larger than {MAX_LEDGER_BYTES} bytes: not a ledger that "
            "`campaign expense` wrote; restore it from the mirror.",
            field=LEDGER_FILE,
        )
    *complete, _torn = data.split(b"\n")
    entries = []
    for number, raw in enumerate(complete, start=1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
            if not isinstance(row, dict):
                raise ValueError("not a JSON object")
            entries.append(LedgerExpense(**row))
        except (ValueError, TypeError, RecursionError) as exc:  # ValidationError is a ValueError
            reason = (
                "; ".join(str(e["msg"]) for e in exc.errors())
                if isinstance(exc, ValidationError)
                else str(exc)
            )
            raise LedgerError(
                f"'{where}' line {number} is not an expense ({reason[:200]}): the ledger was "
                "edited by hand; restore it from the mirror or remove that line.",
                field=LEDGER_FILE,
            ) from None
    return entries


def budget_with_ledger(root: str | Path, budget: dict[str, Any]) -> dict[str, Any]:
    """A closed budget recomputed with the spec's expenses and every expense of the ledger.

    Args:
        root: The campaign's output folder (its ``spec.yaml`` and ``ledger.jsonl``).
        budget: The budget as closed (``report.json``'s ``budget``).
    """
    spec = load_spec(OutputFolder(root).path(SPEC_COPY), recipe_folder=False)
    return with_expenses(budget, [*spec.expenses, *(e.as_expense() for e in read_ledger(root))])


def sealed_prefix_intact(data: bytes, *, size: int, sha256: str) -> bool:
    """Whether the ledger's first ``size`` bytes are the ones sealed in the manifest."""
    return len(data) >= size and sha256_bytes(data[:size]) == sha256
