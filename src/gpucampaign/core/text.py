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


def say_exact(x: float) -> str:
    """A number as the spec wrote it: the shortest text that reads back as the same float
    (``0.95``, ``0.0002``, ``3.5``)."""
    short = f"{x:g}"
    return short if float(short) == x else repr(x)


def say_number(
    x: float, *, against: float | None = None, digits: int = 4, signed: bool = False
) -> str:
    """``x`` to ``digits`` significant digits, more when fewer would hide how it compares
    with ``against`` (a threshold, a minimum gain): the printed numbers compare as the true
    ones do, so ``0.000241`` is never shown as ``0.0002`` beside a threshold of ``0.0002``.
    """
    sign = "+" if signed else ""
    for d in range(digits, 18):
        text = f"{x:{sign}.{d}g}"
        if against is None or _cmp(float(text), against) == _cmp(x, against):
            return text
    return f"{x:{sign}.17g}"


def _cmp(a: float, b: float) -> int:
    return (a > b) - (a < b)
