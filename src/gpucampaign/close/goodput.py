"""The attribution of a campaign's lots read from its output folder (the close, ``campaign
status``, the live line) and said in words: the report's table, the goodput's sentence."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from gpucampaign.close.attribution import attribute_window, lot_windows
from gpucampaign.close.budget import resolve_packages
from gpucampaign.config import CampaignSpec, SpecError, load_spec
from gpucampaign.core import clock
from gpucampaign.core.text import say_hours
from gpucampaign.folder.layout import METRICS_FILE, SPEC_COPY, OutputFolder, run_path
from gpucampaign.folder.metrics import read_metrics
from gpucampaign.folder.records import (
    read_plan,
    read_result,
    read_stops,
    read_timeline,
    spec_with_rounds,
)


def folder_attribution(
    root: str | Path, spec: CampaignSpec, *, catalog: Any = None, now: datetime | None = None
) -> dict[str, Any] | None:
    """``attribute_window`` on an output folder's records (None before its plan is written).

    Args:
        root: the output folder.
        spec: its campaign (the lots, their prices and dates; the runs).
        catalog: the ``tariffs.Catalog`` to price lots without ``price_usd``.
        now: a live campaign's present (``campaign status``); None at the close.
    """
    plan = read_plan(root)
    if plan is None:
        return None
    try:
        packages = resolve_packages(spec.packages, catalog=catalog)
    except SpecError:
        if catalog is not None:
            raise
        # The live view has no catalog at hand: the time is attributed, the price left out.
        packages = [
            {"gpu": p.gpu, "days": p.days, "count": p.count, "price_usd": 0} for p in spec.packages
        ]
    for p, pkg in zip(packages, spec.packages, strict=True):
        p["starts_at"] = pkg.starts_at
    metrics, results = {}, {}
    spec = spec_with_rounds(spec, root)  # the runs of the rounds of seeds bought too
    for run in spec.run_names():
        run_id = spec.resolve_run(run).run_id
        path = run_path(root, run_id, METRICS_FILE)
        if path.is_file():
            metrics[run] = read_metrics(path)
        result = read_result(root, run_id)
        if result is not None:
            results[run] = result.to_dict()
    return attribute_window(
        lots=lot_windows(packages),
        plan=plan,
        timeline=read_timeline(root),
        metrics=metrics,
        results=results,
        stops=read_stops(root),
        now=now,
    )


def live_goodput(root: str | Path, *, now: datetime | None = None) -> dict[str, Any] | None:
    """The goodput of a campaign so far, read from its output folder (``campaign status``, the
    live line): ``{goodput, counted_s, elapsed_s, lost_by_cause, lost_shares, line}``, None
    before its plan is written.

    Args:
        root: the output folder.
        now: the present (the clock's by default).
    """
    spec = load_spec(OutputFolder(root).path(SPEC_COPY), recipe_folder=False)
    att = folder_attribution(root, spec, now=now or clock.now())
    if att is None:
        return None
    keys = ("goodput", "counted_s", "elapsed_s", "lost_by_cause", "lost_shares")
    return {**{k: att[k] for k in keys}, "line": goodput_line(att)}


def _usd(x: float) -> str:
    """A share of a price: cents, and what is below a cent said so, never shown as zero."""
    if x <= 0:
        return "0"
    return f"{x:.2f}" if x >= 0.005 else "< 0.01"


def goodput_line(att: Mapping[str, Any]) -> str:
    """One sentence: the goodput so far, and what the lost work is charged to."""
    g = att.get("goodput")
    if g is None:
        return "Goodput: no window has elapsed yet."
    lost = att.get("lost_shares") or {}
    said = ", ".join(f"{k} {100 * v:.3g}%" for k, v in lost.items() if v > 0)
    return (
        f"Goodput: {100 * g:.3g}% ({say_hours(att['counted_s'] / 3600.0)} of training that "
        f"counted toward a result, over the {say_hours(att['elapsed_s'] / 3600.0)} of the "
        "window elapsed so far"
        + (
            f"; {100 * att['goodput_of_worked']:.3g}% of the time the machines worked)"
            if att.get("goodput_of_worked") is not None
            else ")"
        )
        + (f"; lost work: {said} of it." if said else "; no training lost.")
    )


def render_attribution_md(att: Mapping[str, Any] | None) -> list[str]:
    """The report's section: each cause's time and share of the lots' windows, per machine
    and in all, its share of the lots' price, and the goodput (nothing when not computed)."""
    if not att or not att.get("machines"):
        return []
    machines = att["machines"]
    head = " | ".join(f"lot {m['lot']} ({', '.join(m['hosts']) or 'unused'})" for m in machines)
    out = [
        "## Where the lots' time went",
        "",
        "Every second of each machine's lot window, given to one cause (from the plan's "
        "calendar, `timeline.jsonl`, each run's `metrics.jsonl` and `result.json`), and the "
        "lots' price split in the same shares (a share of the price paid, not an hourly rate).",
        "",
        f"| cause | {head} | share of the windows | share of the price (USD) |",
        "|---|" + "---:|" * len(machines) + "---:|---:|",
    ]
    for k in att["causes"]:
        cells = " | ".join(_secs(m["seconds"][k]) for m in machines)
        out.append(f"| {k} | {cells} | {_pct(att['shares'][k])} | {_usd(att['usd'][k])} |")
    total = " | ".join(_secs(sum(m["seconds"].values())) for m in machines)
    out += [
        f"| **window** | {total} | {_pct(sum(att['shares'].values()))} | "
        f"{_usd(sum(att['usd'].values()))} |",
        "",
        goodput_line(att),
        "",
    ]
    return out


def _secs(s: float) -> str:
    return "0 s" if s <= 0 else say_hours(s / 3600.0)


def _pct(x: float) -> str:
    return "0%" if x <= 0 else f"{100 * x:.3g}%"
