"""The closing report: built as data (``report.json``), rendered as ``report.md`` and a
self-contained ``report.html``; ``campaign report`` renders ``report.json`` again at read time with
the verdict ``campaign verify`` recomputes (``verify.verdict.readable_report``).
"""

from __future__ import annotations

import base64
import html
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpucampaign.close.bootstrap import DOMINATES
from gpucampaign.close.budget import render_budget_md
from gpucampaign.close.error_analysis import render_error_analysis_md
from gpucampaign.close.futility import render_futility_md
from gpucampaign.close.goodput import goodput_line, render_attribution_md
from gpucampaign.close.verdict import Verdict
from gpucampaign.close.verdict_words import seeds_text
from gpucampaign.config import read_mapping_file
from gpucampaign.core.errors import FolderError
from gpucampaign.core.files import json_bytes
from gpucampaign.core.text import say_hours, say_number, strip_controls
from gpucampaign.folder.layout import (
    ESTIMATES_FILE,
    REPORT_HTML,
    REPORT_JSON,
    REPORT_MD,
    OutputFolder,
)
from gpucampaign.folder.records import DecisionRecord, StopRecord
from gpucampaign.restartcheck.compare import resume_text

REPORT_FORMAT = "gpucampaign.report/1"
SUMMARY_KEYS = (
    "verdict",
    "rental_usd",
    "other_expenses_usd",
    "spent_usd",
    "accepted_deliveries",
    "rental_per_accepted_usd",
    "undefined_reason",
)
_FIGURE_TITLES = {
    "calendar": "Calendar: planned, then actual on its own scale",
    "attribution": "The lots' time by cause, one bar per machine",
    "curves": "Loss and metric curves by split, with the threshold and the control's final value",
    "confusion": "Confusion matrix of the verdict's run on the report split",
}


def build_report(
    *,
    campaign_id: str,
    name: str,
    question: str,
    verdict: Verdict,
    budget: Mapping[str, Any],
    forecast: Mapping[str, Any],
    runs: Sequence[Mapping[str, Any]],
    stops: Sequence[StopRecord] = (),
    decisions: Sequence[DecisionRecord] = (),
    figures: Mapping[str, str] | None = None,
    futility: Mapping[str, Any] | None = None,
    changed_inputs: Sequence[str] = (),
    attribution: Mapping[str, Any] | None = None,
    rounds: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The closing report as data (``report.json``); ``render_report_md`` turns it into text.

    Args:
        campaign_id: the campaign's ID.
        name: the campaign's name.
        question: the decision the campaign had to reach.
        verdict: ``decide_verdict``'s result.
        budget: ``close_budget``'s result.
        forecast: ``forecast_vs_actual``'s result.
        runs: one entry per run of the spec: ``{run_id, run, tier, status, metric, stop_id?,
            analysis?}`` where ``analysis`` is ``error_analysis.error_analysis``'s result.
        stops: ``stops.jsonl`` records.
        decisions: ``decisions.jsonl`` records.
        figures: ``{calendar|curves|confusion: relative PNG path}`` inside the output folder.
        futility: ``futility.futility_savings``'s result: the GPU time the futility stops saved.
        changed_inputs: one line per input that changed during the campaign
            (``inputs.closing_inputs``).
        attribution: ``attribution.attribute_window``'s result: the lots' time by cause, its
            price in the same shares, the goodput.
        rounds: ``rounds.jsonl``'s lines with their words (``text``): the rounds of seeds
            bought (or declined) beyond the plan, with their price.

    Returns:
        A JSON-ready dict whose top level holds the ``SUMMARY_KEYS`` (``campaign report --json``).
    """
    return {
        "format": REPORT_FORMAT,
        "campaign_id": campaign_id,
        "campaign": name,
        "question": question,
        "verdict": verdict.to_dict(),
        **{k: budget[k] for k in SUMMARY_KEYS[1:]},
        "budget": dict(budget),
        "runs": [dict(r) for r in runs],
        "forecast_vs_actual": dict(forecast),
        "stops": [s.to_dict() for s in stops],
        "decisions": [d.to_dict() for d in decisions],
        "figures": dict(figures or {}),
        "futility": dict(futility or {"runs": [], "saved_s": None}),
        "changed_inputs": list(changed_inputs),
        "attribution": dict(attribution) if attribution else None,
        "goodput": (attribution or {}).get("goodput"),
        **({"rounds": [dict(r) for r in rounds]} if rounds else {}),
    }


def with_budget(report: Mapping[str, Any], budget: Mapping[str, Any]) -> dict[str, Any]:
    """The report with another budget (recomputed with expenses recorded after the close)."""
    return {**report, **{k: budget[k] for k in SUMMARY_KEYS[1:]}, "budget": dict(budget)}


def report_summary(report: Mapping[str, Any]) -> dict[str, Any]:
    """The keys ``campaign report --json`` promises, read from a report."""
    return {"campaign_id": report.get("campaign_id"), **{k: report.get(k) for k in SUMMARY_KEYS}}


def _cell(x: Any) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")


def _hours(x: float | None) -> str:
    return say_hours(x, missing="not observed")


def answer_paragraph(report: Mapping[str, Any]) -> str:
    """The report's opening: the spec's question, then the one sentence that answers it (yes,
    no or not yet, the chosen run, its gain and interval on the report split, the threshold,
    the kind), then what it cost."""
    v = report["verdict"]
    question = report.get("question") or "(the spec states no question)"
    answer = v.get("answer") or f"Verdict: {v['kind']}."
    lines = [f"**Question:** {question}", "", f"**Answer:** {answer}"]
    spent = report.get("spent_usd")
    observed = ((report.get("forecast_vs_actual") or {}).get("totals") or {}).get(
        "observed_wall_hours"
    )
    cost = [] if spent is None else [f"{spent:.2f} USD spent"]
    if observed is not None:
        cost.append(f"{say_hours(observed)} of observed busy time")
    if cost:
        lines += ["", "Cost: " + ", ".join(cost) + "."]
    if report.get("attribution"):
        lines += ["", goodput_line(report["attribution"])]
    return "\n".join(lines)


def _seeds_md(verdict: Mapping[str, Any]) -> list[str]:
    """Per variant with replicates: the seeds and examples its interval rests on, which of the
    two dominates the gain's variance, and so which more evidence to buy; per variant of one
    seed a side, that training noise is not measured."""
    rep = verdict.get("report_split")
    out = []
    for name, row in (verdict.get("variants") or {}).items():
        entry = (row or {}).get(rep) or {}
        if not entry.get("seeds"):
            if entry.get("training_noise") == "not measured":
                out.append(
                    f"- '{name}' against the control on {rep}: one seed a side; training noise "
                    "is not measured (the interval covers the examples only), so the verdict "
                    "never adopts on it (for more evidence: add seeds, `seeds:` in the spec)."
                )
            continue
        dom, share = entry.get("dominates"), entry.get("seed_share")
        if dom is None:
            source = "one seed a side: the seeds' share of the variance is not measured"
        else:
            part = "" if share is None else f"{say_number(100 * share, digits=2)}% of the "
            more = "add seeds (`seeds:` in the spec)" if dom == "seeds" else f"more {rep} examples"
            source = (
                f"{part}gain's variance comes from the seeds, so {DOMINATES[dom]} "
                f"(for more evidence: {more})"
            )
        out.append(f"- '{name}' against the control on {rep}: {seeds_text(entry)}; {source}.")
    return ["**Seeds as evidence**", "", *out, ""] if out else []


def _changed_inputs_md(report: Mapping[str, Any]) -> list[str]:
    """The inputs that changed during the campaign (nothing when none did)."""
    changed = report.get("changed_inputs") or []
    if not changed:
        return []
    return ["## Inputs changed during the campaign", "", *[f"- {line}" for line in changed], ""]


def _runs_md(report: Mapping[str, Any]) -> list[str]:
    out = [
        "## Runs",
        "",
        "| run | run ID | tier | status | reached | metric | note |",
        "|---|---|---|---|---:|---:|---|",
    ]
    stops_by_id = {s.get("stop_id"): s for s in report.get("stops", [])}
    threshold = (report["verdict"].get("numbers") or {}).get("threshold")
    for r in report["runs"]:
        metric = "" if r.get("metric") is None else say_number(r["metric"], against=threshold)
        note = ""
        if r.get("stop_id"):
            s = stops_by_id.get(r["stop_id"], {})
            note = f"{r['stop_id']}: {s.get('rule', '')} {s.get('reason', '')}".strip()
        step = r.get("reached_step")
        reached = "" if "reached_step" not in r else ("no step" if step is None else f"step {step}")
        out.append(
            f"| {_cell(r['run'])} | `{r['run_id']}` | {r.get('tier', '')} | "
            f"{r.get('status', '')} | {reached} | {metric} | {_cell(note)} |"
        )
    return out


def _scaling_md(report: Mapping[str, Any]) -> list[str]:
    """Data-parallel runs (``gpus`` > 1): their step time against a one-GPU run's, when both
    ran (the same global batch when the runs differ only in ``gpus``)."""
    timed = [r for r in report["runs"] if isinstance(r.get("step_s"), int | float)]
    wide = [r for r in timed if (r.get("gpus") or 1) > 1]
    if not wide:
        return []
    ones = [r for r in timed if (r.get("gpus") or 1) == 1]
    base = next((r for r in ones if r["run"] == "control"), ones[0] if ones else None)
    out = [
        "",
        "## Data-parallel scaling",
        "",
        "| run | gpus | median step | throughput vs one GPU |",
        "|---|---:|---:|---|",
    ]
    for r in [*wide, *([base] if base else [])]:
        ratio = (
            f"{base['step_s'] / r['step_s']:.2f}x `{base['run']}`"
            if base is not None and r is not base and r["step_s"] > 0
            else ("reference" if r is base else "no one-GPU run measured")
        )
        out.append(
            f"| {_cell(r['run'])} | {r.get('gpus') or 1} | {1000 * r['step_s']:.1f} ms | {ratio} |"
        )
    return out


def _forecast_md(fva: Mapping[str, Any]) -> list[str]:
    out = [
        "## Forecast vs actual",
        "",
        "Allotted hours come from `plan.json`, untouched since the start; observed hours only "
        "from `timeline.jsonl` (a step without a recorded interval is *not observed*, never "
        "estimated). Each forecast has its p10-p90 range (`plan.ranges`: uncalibrated, a factor "
        "of two either way; `campaign plan --calibrate-from` learns it from earlier campaigns).",
        "",
        "| step | allotted (p10-p90) | re-forecast (p10-p90) | observed | in range | deviation "
        "| explanation |",
        "|---|---:|---:|---:|---|---:|---|",
    ]
    for s in fva["steps"]:
        dev = say_hours(s["deviation_hours"], signed=True)
        allotted = say_hours(s["allotted_hours"]) + _range(s.get("allotted_range_hours"))
        refo = say_hours(s["reforecast_hours"])
        if s["reforecast_hours"] is not None:
            refo += _range(s.get("range_hours"))
        inside = {True: "yes", False: "no", None: ""}[s.get("in_range")]
        out.append(
            f"| {_cell(s['step'])} | {allotted} | {refo} | {_hours(s['observed_hours'])} | "
            f"{inside} | {dev} | {_cell(s['explanation'])} |"
        )
    totals = fva.get("totals", {})
    if totals:
        parts = [
            f"{label} {say_hours(totals[k])}"
            for k, label in (
                ("allotted_span_hours", "planned span"),
                ("reforecast_span_hours", "re-forecast span"),
                ("window_hours", "window"),
            )
            if totals.get(k) is not None
        ]
        if totals.get("observed_wall_hours") is not None:
            parts.append(f"observed busy time {say_hours(totals['observed_wall_hours'])}")
        out += ["", "Totals: " + "; ".join(parts) + "."]
    if fva.get("unplanned_timeline_steps"):
        out += [
            "",
            "Timeline intervals outside the plan's steps: "
            + ", ".join(fva["unplanned_timeline_steps"])
            + ".",
        ]
    out.append("")
    return out


def _range(r: Sequence[float] | None) -> str:
    """`` (lo-hi)``: a forecast's p10-p90 range (nothing for a report closed before ranges)."""
    return "" if not r else f" ({say_hours(r[0])}-{say_hours(r[1])})"


def _interruptions_md(fva: Mapping[str, Any]) -> list[str]:
    """Each loss (machine, when, steps lost, time until training resumed), the relaunches, the
    stops before a lot's end, and what the losses cost as a share of the window (nothing when
    none)."""
    info = fva.get("interruptions") or {}
    cut = info.get("segments") or []
    ends = info.get("lot_ends") or []
    if not cut and not ends:
        return []
    out = ["## Interruptions", ""]
    resumes = info.get("resumes") or {}
    out += [f"- {run} resumed {n} time{'s' if n != 1 else ''}" for run, n in resumes.items()]
    out += [
        f"- {run}: inference restarted from its last good model (resume: inference), "
        "learning not resumed"
        for run in info.get("inference_restarts") or {}
    ]
    if cut:
        out += [
            f"- lost work: {info.get('lost_steps', 0)} step(s) trained after the last checkpoint, "
            f"{_hours(info.get('lost_hours'))} h; until training resumed: "
            f"{_hours(info.get('down_hours'))} h; relaunched on another machine: "
            f"{info.get('relaunches', 0)}"
        ]
    if info.get("share_of_window") is not None:
        out.append(
            f"- what the losses cost: {_hours(info.get('cost_hours'))} h of the "
            f"{_hours(info.get('window_hours'))} h window ({100 * info['share_of_window']:.2f}%): "
            "work trained again plus the time until training resumed"
        )
    if ends:
        out.append(
            f"- stopped before a lot's end (saved, nothing lost): {len(ends)} time(s); "
            "resumed after " + ", ".join(_secs(e.get("until_resumed_seconds")) for e in ends)
        )
    out += [
        "",
        "| phase | run | machine | cut at | last checkpoint | steps lost | work lost | "
        "until resumed | resumed on | outcome |",
        "|---|---|---|---|---:|---:|---:|---:|---|---|",
    ]
    for c in [*cut, *ends]:
        # A run that went on on another lot's machine names both lots (the hand-over).
        moved = c.get("resumed_lot") is not None and c.get("lot") not in (None, c["resumed_lot"])
        machine, resumed = c.get("host") or "?", c.get("resumed_host") or "not resumed"
        if moved:
            machine, resumed = f"lot {c['lot']} ({machine})", f"lot {c['resumed_lot']} ({resumed})"
        out.append(
            f"| {c['phase']} | {_cell(c.get('run') or '')} | {_cell(machine)} | "
            f"{c.get('end') or ''} | {_cell(c.get('checkpoint_step') or '')} | "
            f"{_cell(c.get('lost_steps') or 0)} | {_secs(c.get('lost_seconds'))} | "
            f"{_secs(c.get('until_resumed_seconds'))} | "
            f"{_cell(resumed)} | {_cell(c.get('outcome') or '')} |"
        )
    out.append("")
    return out


def _secs(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds:.1f} s"


def _resume_md(report: Mapping[str, Any]) -> list[str]:
    """Which restart applies to each run after an interruption (its config's ``resume``)."""
    runs = [r for r in report.get("runs", []) if r.get("resume")]
    if not runs:
        return []
    out = ["## Restart after an interruption", ""]
    for r in runs:
        out.append(f"- {r['run']} (`{r['run_id']}`): {resume_text(r['resume'])}")
        cut = r.get("interrupted")
        if cut:
            out.append(
                f"  - here: interrupted at step {cut['reached_step']} of {cut['planned_steps']} "
                f"({cut['reason']}); inference restarted from the checkpoint of step "
                f"{cut['checkpoint_step']} ({cut['lost_steps']} step(s) lost); its metric is "
                "evidence at that step, not an accepted delivery"
            )
    out.append("")
    return out


def _decisions_and_stops_md(report: Mapping[str, Any]) -> list[str]:
    out = ["## Decisions taken", ""]
    decisions = report.get("decisions") or []
    for rec in decisions:
        d = rec["decision"]
        reasons = "; ".join(d.get("reasons", []) or [])
        dropped = f" (dropped: {', '.join(d['dropped_runs'])})" if d.get("dropped_runs") else ""
        action, by = d.get("action", "?"), d.get("by", "?")
        out.append(f"- {rec['point']}: **{action}** by {by}{dropped}: {reasons}")
    if not decisions:
        out.append("- none recorded")
    out += ["", "## Stops", ""]
    out += [
        f"- `{s.get('stop_id')}` {s.get('rule')} on {s.get('run') or s.get('run_id')}"
        f"{'' if s.get('step') is None else ' at step ' + str(s['step'])}: {s.get('reason')}"
        for s in report.get("stops", [])
    ] or ["- none"]
    out.append("")
    return out


def _rounds_md(report: Mapping[str, Any]) -> list[str]:
    """The rounds of seeds bought beyond the plan (each a share of the lot), or declined."""
    rounds = report.get("rounds") or []
    if not rounds:
        return []
    out = ["", "### Rounds of seeds beyond the plan", ""]
    for r in rounds:
        state = "bought" if r.get("bought") else "declined"
        out.append(f"- {r.get('text')}: {state} by {r.get('by')}; it was asked by: {r.get('why')}")
    hours = sum(r.get("gpu_hours") or 0.0 for r in rounds if r.get("bought"))
    share = sum(r.get("lot_share") or 0.0 for r in rounds if r.get("bought"))
    out += [
        "",
        f"The rounds bought were priced at {_hours(hours)} of GPU time, from the runs measured "
        f"before them ({100 * share:.2g}% of the lot); their runs are in the runs table and the "
        "timeline.",
        "",
    ]
    return out


def _estimates_md(fva: Mapping[str, Any]) -> list[str]:
    est = fva.get("estimates") or {}
    if not est.get("measured"):
        return []
    out = [
        "## Estimates for next time",
        "",
        "Measured here and kept in `estimates.json` (`campaign plan --calibrate-from` reads it):",
        "",
        "| measure | seconds | samples |",
        "|---|---:|---:|",
    ]
    for k, val in est["measured"].items():
        shown = "not observed" if val is None else f"{val:.6g}"
        out.append(f"| {k} | {shown} | {est.get('samples', {}).get(k, 0)} |")
    out.append("")
    return out


def render_report_md(report: Mapping[str, Any]) -> str:
    """``report.md``: verdict, runs, budget, forecast vs actual, decisions, stops, analysis,
    estimates, figures."""
    v = report["verdict"]
    out = [f"# Closing report: {report['campaign']}", "", answer_paragraph(report), ""]
    out += [f"Campaign ID: `{report['campaign_id']}`", "", "## Verdict", "", v["text"], ""]
    out += _seeds_md(v)
    out += _changed_inputs_md(report)
    out += _runs_md(report)
    out += _scaling_md(report)
    out += ["", "## Budget", "", render_budget_md(report["budget"], result="the answer above")]
    out += _rounds_md(report)
    out += render_futility_md(report.get("futility"))
    out += render_attribution_md(report.get("attribution"))
    out += _forecast_md(report["forecast_vs_actual"])
    out += _interruptions_md(report["forecast_vs_actual"])
    out += _resume_md(report)
    out += _decisions_and_stops_md(report)
    analysed = [r for r in report["runs"] if r.get("analysis")]
    if analysed:
        out += ["## Error analysis", ""]
        for r in analysed:
            out.append(
                render_error_analysis_md(r["analysis"], title=f"{r['run']} (`{r['run_id']}`)")
            )
    out += _estimates_md(report["forecast_vs_actual"])
    figures = report.get("figures") or {}
    if figures:
        out += ["## Figures", ""]
        for key, rel in figures.items():
            out += [f"![{_FIGURE_TITLES.get(key, key)}]({rel})", ""]
    out += [
        "## Files",
        "",
        "`manifest.json` lists every file with its size and sha256; `RELOAD.md` gives the "
        "commands to reload a model and predict; `campaign verify .` checks this folder.",
        "",
    ]
    return "\n".join(out)


_IMG_SRC = re.compile(r'(<img\s[^>]*?src=")([^"]+)(")')
_HTML_STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:72rem;margin:2rem auto;padding:0 1rem;"
    "line-height:1.45}table{border-collapse:collapse;margin:1rem 0}td,th{border:1px solid #ccc;"
    "padding:.25rem .5rem;vertical-align:top}img{max-width:100%}code{background:#f4f4f4;"
    "padding:0 .2rem}"
)


def render_report_html(report_md: str, *, root: str | Path, title: str = "Closing report") -> str:
    """A self-contained ``report.html``: the markdown rendered, figures embedded as data URIs."""
    # markdown_it only when the HTML report is written
    from markdown_it import MarkdownIt

    folder = OutputFolder(root)
    body = MarkdownIt("commonmark", {"html": False}).enable("table").render(report_md)

    def embed(m: Any) -> str:
        src = html.unescape(m.group(2))
        try:
            path = folder.path(src)
        except ValueError:
            return m.group(0)
        if not path.is_file() or path.suffix.lower() != ".png":
            return m.group(0)
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        return f"{m.group(1)}data:image/png;base64,{data}{m.group(3)}"

    body = _IMG_SRC.sub(embed, body)
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_HTML_STYLE}</style></head><body>\n"
        f"{body}</body></html>\n"
    )


def render_records(report: Mapping[str, Any], *, root: str | Path) -> dict[str, str]:
    """``{report.md: text, report.html: text}`` for ``report`` (as ``report.json`` keeps it),
    figures embedded from ``root``: what the close writes and what verify renders again."""
    # Text from elsewhere (a library's error in a stop reason) is shown, never interpreted.
    md = strip_controls(render_report_md(report))
    html_text = render_report_html(md, root=root, title=f"Closing report: {report['campaign']}")
    return {REPORT_MD: md, REPORT_HTML: html_text}


def write_report(root: str | Path, report: Mapping[str, Any]) -> dict[str, Path]:
    """Write ``report.json``, ``report.md``, ``report.html`` and ``estimates.json``.

    ``campaign verify`` renders report.md and report.html again from report.json (the verdict
    recomputed) and compares them with these files.

    Returns:
        ``{json, md, html, estimates}`` paths.
    """
    folder = OutputFolder(root)
    # In its own order, and rendered from what report.json keeps: `campaign verify` renders the
    # same files from report.json (with the verdict it recomputes) and compares them.
    raw = json_bytes(report, sort_keys=False)
    texts = render_records(json.loads(raw), root=root)
    paths = {
        "json": folder.write_bytes(REPORT_JSON, raw),
        "md": folder.write_text(REPORT_MD, texts[REPORT_MD]),
        "html": folder.write_text(REPORT_HTML, texts[REPORT_HTML]),
    }
    est = (report.get("forecast_vs_actual") or {}).get("estimates") or {}
    paths["estimates"] = folder.write_json(
        ESTIMATES_FILE,
        {"campaign_id": report["campaign_id"], "campaign": report["campaign"], **est},
    )
    return paths


def read_report(out: str | Path) -> dict[str, Any]:
    """``report.json`` of a closed campaign.

    Raises:
        SpecError: the folder has no readable report (the campaign has not closed).
    """
    path = OutputFolder(out).path(REPORT_JSON)  # a link out of the folder is refused
    missing = (
        f"'{out}' has no {REPORT_JSON}: give the output folder of a closed campaign "
        "(the close phase writes it)"
    )
    not_report = "is not a report: it holds no JSON object"
    report = read_mapping_file(
        path, field="OUT", missing=missing, not_mapping=not_report, fmt="JSON"
    )
    if not isinstance(report.get("budget"), dict) or not isinstance(report.get("verdict"), dict):
        raise FolderError(
            f"'{path}' is not a closing report (no verdict or budget): rerun "
            "`campaign run` on the folder to close it again",
            field="OUT",
        )
    return report
