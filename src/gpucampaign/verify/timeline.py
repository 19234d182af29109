"""``timeline.jsonl`` cross-checked with the folder's other records (``verify``).

The timeline is where the report's hours come from (busy, lost, down), and a fresh folder on
another host starts from the store's copy of it, so a timeline that is not this campaign's
could be sealed with the folder and verify. Its rows must agree with what the folder records
elsewhere: each falls inside the campaign's window, from ``campaign.json``'s start to the
manifest's ``created_at`` (the close), give or take ``SKEW_S`` for the clocks of several hosts;
a segment's ``seconds`` and lost time fit between its own start and end; and a training
segment names a run of this campaign's manifest (by name, the row's ``run``). A row of another
campaign (another run, or days before this one started) or a forged one (months of downtime
in a campaign of minutes) is named, with its row, as ``timeline_inconsistent``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from gpucampaign.folder.layout import CAMPAIGN_FILE, RUNS_DIR, TIMELINE
from gpucampaign.verify.context import Problem, VerifyContext

#: The clocks of the hosts a campaign ran on may disagree by this much (seconds).
SKEW_S = 3600.0
#: The phases whose segments train a run (their ``note`` is the run's ID).
TRAINING_PHASES = ("pilot", "train")


def _time(value: Any) -> datetime | None:
    """An ISO time (``2026-12-06T13:01:16.473+00:00``) or ``campaign.json``'s compact one
    (``20261206T130116Z``); None when it is neither."""
    if not isinstance(value, str) or not value:
        return None
    for parse in (datetime.fromisoformat, lambda v: datetime.strptime(v, "%Y%m%dT%H%M%SZ")):
        try:
            t = parse(value)
        except ValueError:
            continue
        return t if t.tzinfo else t.replace(tzinfo=UTC)
    return None


def _window(ctx: VerifyContext) -> tuple[datetime | None, datetime | None]:
    """The campaign's start (``campaign.json``) and its close (the manifest's ``created_at``),
    each widened by ``SKEW_S``; None where the folder does not say."""
    docs, _ = ctx.json_docs(CAMPAIGN_FILE) if CAMPAIGN_FILE in ctx.present else ([], None)
    first = docs[0] if docs and isinstance(docs[0], Mapping) else {}
    start, close = _time(first.get("started_at")), _time((ctx.manifest or {}).get("created_at"))
    skew = timedelta(seconds=SKEW_S)
    return (start - skew if start else None), (close + skew if close else None)


def _row_problem(
    row: Mapping[str, Any], *, window: tuple[datetime | None, datetime | None], runs: set[str]
) -> str | None:
    """What is wrong with one line of the timeline; None when it agrees with the folder."""
    start, end = _time(row.get("start")), _time(row.get("end"))
    if start is None or (row.get("end") is not None and end is None):
        return "its start or end is not a time"
    lo, hi = window
    for name, t in (("start", start), ("end", end)):
        if t is not None and ((lo is not None and t < lo) or (hi is not None and t > hi)):
            return f"its {name} {t.isoformat()} is outside the campaign (started and closed " + (
                f"{lo + timedelta(seconds=SKEW_S) if lo else '?'} to "
                f"{hi - timedelta(seconds=SKEW_S) if hi else '?'})"
            )
    span = (end - start).total_seconds() if end is not None else None
    if span is not None and span < 0:
        return "it ends before it starts"
    for key in ("seconds", "lost_seconds"):
        value = row.get(key)
        if value is not None and not isinstance(value, int | float):
            return f"its {key} is not a number"
        if isinstance(value, int | float) and (
            value < 0 or (span is not None and value > span + SKEW_S)
        ):
            return f"its {key} {value:g} do not fit between its start and end ({span:g} s)"
    if row.get("phase") in TRAINING_PHASES and row.get("run") and row.get("run") not in runs:
        return f"it trains run {row.get('run')!r}, which is not a run of this campaign"
    return None


def check_timeline(ctx: VerifyContext) -> list[Problem]:
    """Each line of ``timeline.jsonl`` inside the campaign's window, its durations within its
    own start and end, and its training runs this campaign's (see the module's docstring)."""
    if ctx.manifest is None or TIMELINE not in ctx.present:
        return []
    rows, _ = ctx.json_docs(TIMELINE)  # a line that is not JSON: check_json names it
    # The runs by name (a row's ``run``): the manifest's, and those with a folder in runs/
    # (``<name>-<hash>``; one dropped from the manifest is check_expected_runs' to name).
    runs = {str(info.get("run")) for info in ctx.runs.values()}
    folders = {rel.split("/")[1] for rel in ctx.present if rel.startswith(f"{RUNS_DIR}/")}
    runs |= {rid.rpartition("-")[0] for rid in folders}
    window = _window(ctx)
    problems = []
    for n, row in enumerate(rows, start=1):
        if not isinstance(row, Mapping):
            why: str | None = "it is not an object"
        else:
            why = _row_problem(row, window=window, runs=runs)
        if why is not None:
            detail = f"row {n} is not this campaign's record: {why}"
            problems.append(Problem("timeline_inconsistent", TIMELINE, detail))
    return problems[:5]  # the first few: one forged row is enough to say so
