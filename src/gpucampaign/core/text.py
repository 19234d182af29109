"""How durations are said to a person (reports, the decision point, the CLI)."""

from __future__ import annotations


def say_duration(hours: float | None, *, signed: bool = False, missing: str = "") -> str:
    """A duration with the precision it deserves: ``42 s``, ``12.5 min``, ``3.05 h``."""
    if hours is None:
        return missing
    sign = "+" if signed and hours >= 0 else ("-" if hours < 0 else "")
    h = abs(hours)
    if h * 3600 < 59.95:
        return f"{sign}{h * 3600:.3g} s"
    if h < 1:
        return f"{sign}{h * 60:.3g} min"
    return f"{sign}{h:.3g} h"
