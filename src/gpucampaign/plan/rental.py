"""The rental deadline: when the committed lots end, and whether the files get back in time.

A lot may carry ``starts_at`` (UTC); it ends ``days`` later. The calendar's hour 0 is the
earliest start, and the rental ends when the last dated lot ends: after that the machine
and its disk are handed back. Pure functions; no Prefect.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from gpucampaign.config import CampaignSpec

RETRIEVAL_WORDS: tuple[str, ...] = ("retriev", "download", "collect", "get back")


def iso(t: datetime) -> str:
    """``2026-03-02T09:00:00Z``: an aware time in UTC, to the second."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Rental:
    """The dated lots of a spec: when the first starts and when the last ends."""

    starts_at: datetime
    ends_at: datetime
    lots: tuple[dict[str, object], ...]

    def hours_left(self, now: datetime) -> float:
        """Hours from ``now`` until the rental ends (negative once it has ended)."""
        return (self.ends_at - now).total_seconds() / 3600.0

    def to_dict(self) -> dict[str, object]:
        """``{"starts_at", "ends_at", "lots"}`` with ISO times."""
        return {
            "starts_at": iso(self.starts_at),
            "ends_at": iso(self.ends_at),
            "lots": [dict(lot) for lot in self.lots],
        }


def rental_of(spec: CampaignSpec) -> Rental | None:
    """The rental of the spec's dated lots, or ``None`` when no lot carries ``starts_at``."""
    lots = []
    for i, p in enumerate(spec.packages):
        if p.starts_at is None or p.ends_at is None:
            continue
        lots.append(
            {
                "package": i,
                "gpu": p.gpu,
                "starts_at": iso(p.starts_at),
                "ends_at": iso(p.ends_at),
                "order_ref": p.order_ref,
            }
        )
    starts = [p.starts_at for p in spec.packages if p.starts_at is not None]
    ends = [p.ends_at for p in spec.packages if p.ends_at is not None]
    if not lots:
        return None
    return Rental(starts_at=min(starts), ends_at=max(ends), lots=tuple(lots))


def deadline_warnings(
    rental: Rental | None, *, retrieval: dict[str, float], undated: int = 0
) -> list[str]:
    """Warnings when the files cannot be back before the rental ends.

    Args:
        rental: The spec's rental (no warning without one).
        retrieval: End hour (from the calendar's hour 0) of each retrieval step.
        undated: How many lots carry no ``starts_at`` while others do.
    """
    if rental is None:
        return []
    warnings = []
    if undated:
        warnings.append(
            f"{undated} lot(s) have no starts_at: the rental's end "
            f"{iso(rental.ends_at)} is computed from the dated lots only."
        )
    for name, end_hours in sorted(retrieval.items()):
        done = rental.starts_at + timedelta(hours=end_hours)
        if done > rental.ends_at:
            late = (done - rental.ends_at).total_seconds() / 3600.0
            warnings.append(
                f"retrieval step '{name}' ends at {iso(done)}, {late:.4g} h after the rental "
                f"ends ({iso(rental.ends_at)}): the files would be lost with the machine; "
                "shorten the calendar, start earlier or rent longer."
            )
    return warnings
