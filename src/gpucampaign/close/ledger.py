"""The expense ledger of a campaign: expenses declared after the start, kept apart from the rental.

``ledger.jsonl`` in the output folder is append-only. The manifest records the size and hash
the ledger had when the folder was sealed; an expense added later appends to it, and the check
of the folder accepts that growth as long as the sealed part is unchanged. The budget reads the
spec's expenses and the ledger together; no tax or transfer cost is ever added to either.
"""

from __future__ import annotations

import fcntl
import math
import os
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gpucampaign.core.files import jsonl_line, read_jsonl, sha256_bytes, utc_now
from gpucampaign.folder.layout import LEDGER_FILE, SPEC_COPY, OutputFolder
from gpucampaign.spec import SpecError

LEDGER = LEDGER_FILE
_REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/#-]{0,79}$")


class LedgerExpense(BaseModel):
    """One expense really incurred, as declared by a person after the campaign started."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    usd: float = Field(gt=0, description="Amount paid, in USD, as on the receipt.")
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
        if not v or any(ord(c) < 32 for c in v):
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
        raise SpecError(
            f"'{folder}' is not a campaign's output folder (no spec.yaml): give the folder "
            "that `campaign run` wrote.",
            field="OUT",
        )
    try:
        entry = LedgerExpense(usd=usd, what=what, order_ref=order_ref)
    except ValidationError as exc:
        err = exc.errors()[0]
        option = {"usd": "--usd", "what": "--what", "order_ref": "--order-ref"}[str(err["loc"][0])]
        raise SpecError(f"option '{option}': {err['msg']}.", field=option) from None
    _append_locked(OutputFolder(folder).path(LEDGER), jsonl_line(entry.model_dump()))
    return entry


def _append_locked(path: Path, line: str) -> None:
    """Append one line under the ledger's own short lock, fsynced.

    The ledger is append-only and only ``campaign expense`` writes it, so an expense needs no
    lock on the whole folder: it goes in while a campaign runs (whose close reads the ledger
    then) or after the seal (which accepts a ledger that only grew). The lock orders two
    expenses added at once; a link planted as the ledger is not followed.
    """
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        raise SpecError(f"cannot append to '{path}': {exc.strerror}.", field="OUT") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        data = line.encode("utf-8")
        while data:
            data = data[os.write(fd, data) :]
        os.fsync(fd)
    finally:
        os.close(fd)  # releases the lock


def read_ledger(root: str | Path) -> list[LedgerExpense]:
    """Every expense of the ledger, in the order recorded (empty when there is none)."""
    return [LedgerExpense(**row) for row in read_jsonl(OutputFolder(root).path(LEDGER))]


def budget_with_ledger(root: str | Path, budget: dict[str, Any]) -> dict[str, Any]:
    """A closed budget recomputed with the spec's expenses and every expense of the ledger.

    Args:
        root: The campaign's output folder (its ``spec.yaml`` and ``ledger.jsonl``).
        budget: The budget as closed (``report.json``'s ``budget``).
    """
    from gpucampaign.close.budget import with_expenses
    from gpucampaign.spec import load_spec

    spec = load_spec(OutputFolder(root).path(SPEC_COPY), recipe_folder=False)
    return with_expenses(budget, [*spec.expenses, *(e.as_expense() for e in read_ledger(root))])


def sealed_prefix_intact(data: bytes, *, size: int, sha256: str) -> bool:
    """Whether the ledger's first ``size`` bytes are the ones sealed in the manifest."""
    return len(data) >= size and sha256_bytes(data[:size]) == sha256
