"""The records a person reads, rebuilt from the recomputed verdict and compared byte for byte.

``report.md`` and ``report.html`` are what a reader opens; ``campaign report`` prints a report
too. A check that only looks for the verdict's words somewhere in ``report.md`` passes a forged
headline added above the true one, and one that skips ``report.html`` passes any forged page.
So both files are rendered again by the close's own functions from ``report.json`` with its
verdict replaced by the one recomputed from the folder's raw records, and must equal the
files exactly: any other text, a comment or a changed headline included, is a finding.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpucampaign.close.report import render_records
from gpucampaign.folder.layout import REPORT_JSON


def rendered_records(
    report: Mapping[str, Any], *, verdict: Mapping[str, Any], root: str | Path
) -> dict[str, str]:
    """``{report.md, report.html}`` as the close writes them for ``report`` with ``verdict``
    in place of its own (``close.report.render_records``, figures embedded from ``root``)."""
    return render_records({**report, "verdict": dict(verdict)}, root=root)


def _first_difference(kept: str, expected: str) -> str:
    """Where ``kept`` departs from ``expected``: the line number and both lines, shortened."""
    a, b = kept.splitlines(), expected.splitlines()
    for n, (x, y) in enumerate(zip(a, b, strict=False), start=1):
        if x != y:
            return f"line {n} says {_cut(x)!r} where the recomputed verdict gives {_cut(y)!r}"
    if len(a) != len(b):
        return f"it has {len(a)} line(s) where the recomputed verdict gives {len(b)}"
    return "it differs in its line endings or trailing text"


def _cut(text: str, limit: int = 100) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def record_problems(
    *, report: Any, verdict: Mapping[str, Any], root: Path, texts: Mapping[str, str | None]
) -> list[tuple[str, str]]:
    """``(file, detail)`` for each of ``report.md``/``report.html`` (their kept ``texts``, None
    when absent) that is not what ``report`` with the recomputed ``verdict`` renders."""
    if not isinstance(report, Mapping) or not isinstance(report.get("campaign"), str):
        return [(REPORT_JSON, "it is not a closing report, so report.md cannot be rebuilt")]
    try:
        expected = rendered_records(report, verdict=verdict, root=root)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        why = f"{type(exc).__name__}: {exc}"
        return [(REPORT_JSON, f"report.md cannot be rebuilt from it ({why})")]
    found = []
    for rel, text in expected.items():
        kept = texts.get(rel)
        if kept is None:
            found.append((rel, "it is missing or unreadable; the close writes it"))
        elif kept != text:
            detail = "it is not the report the recomputed verdict renders: "
            found.append((rel, detail + _first_difference(kept, text)))
    return found
