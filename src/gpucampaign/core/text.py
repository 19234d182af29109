"""How text is said to a person (reports, the decision point, the CLI): durations, and text
from elsewhere made safe to show (no terminal escapes, no password of a URL)."""

from __future__ import annotations

import re
import unicodedata


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


# The password of a URL's user part (``scheme://user:password@host``).
_URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^/@\s:]*):[^/@\s]*@")
# Terminal escapes: CSI (colours, cursor moves), OSC (titles, links), and the two-byte ones.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-_]")


def redact_secrets(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***`` (the user is kept)."""
    return _URL_PASSWORD.sub(r"\1:***@", text)


def strip_ansi(text: str) -> str:
    """``text`` without terminal escapes (colours, cursor moves, titles)."""
    return _ANSI.sub("", text)


def strip_controls(text: str) -> str:
    """A document's text without terminal escapes and control characters (new lines and
    tabs kept), and without the password of any URL in it."""
    text = strip_ansi(text)
    text = "".join(c for c in text if c in "\n\t" or unicodedata.category(c) != "Cc")
    return redact_secrets(text)


def printable(text: str) -> str:
    """Third-party text made safe for a report: terminal escapes removed, every other control
    character (tabs and new lines included) turned into a space, secrets in URLs redacted."""
    text = strip_ansi(text)
    text = "".join(" " if unicodedata.category(c) == "Cc" else c for c in text)
    return redact_secrets(text)


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
