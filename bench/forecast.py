"""How true the re-forecast after the pilot comes, and how often its p10-p90 range holds.

Runs N real tiny campaigns of different sizes, one after the other, with ``campaign run``
(the demo spec ``examples/digits/campaign.yaml``, its runs trained on the CPU; each campaign
gets its own control epochs and batch size, so the training steps range from about a hundred
to a few thousand; the stop rules that end a run early and the restart check are off, so each
training step runs to its planned end and its time is the step's whole time). From each
closed campaign's ``report.json`` it reads every training step's re-forecast and observed
time, and records:

- the absolute error of the re-forecast, |observed - re-forecast| / observed (median, p90);
- the same error split in two, from the campaign's ``pilot.json`` and each run's
  ``metrics.jsonl`` (``plan.reforecast.call_parts``, the parts the re-forecast summed): the
  steps (their forecast against the sum of the step times the training call recorded) and
  what surrounds them (the rest of the observed time: the loop's own cost and start,
  evaluations, saves, the time outside the loop and outside ``train_run``);
- the error the model before this round (main at f91a08a) makes on the same records
  (``previous_forecast``): the same steps and actuals, so the load's drift is the same;
- the share of observed times inside the range the campaign recorded (the uncalibrated
  default, ``plan.ranges.DEFAULT_SPREAD``);
- the share inside the range calibrated leave-one-out: each campaign's range from the other
  campaigns' errors (``plan.ranges.spread_of``: what ``campaign plan --calibrate-from``
  does with several earlier campaigns).

Usage: python bench/forecast.py [--campaigns 10] [--work DIR] [--reuse]
[--write bench/results/forecast.md] (``--reuse``: measure the closed campaigns already in
DIR again, with the load they were run at, kept in DIR/load.txt)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml

from gpucampaign.plan.ranges import DEFAULT_SPREAD, observed_ratios, spread_of
from gpucampaign.plan.reforecast import call_parts, pool_pilots

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "examples" / "digits" / "campaign.yaml"
#: (control epochs, batch size) of each campaign, in order: sizes that differ.
SIZES = [
    (4, 64),
    (6, 32),
    (8, 128),
    (10, 64),
    (12, 32),
    (3, 16),
    (16, 64),
    (5, 128),
    (20, 64),
    (7, 32),
    (14, 128),
    (9, 16),
]


def write_spec(folder: Path, *, epochs: int, batch: int) -> Path:
    """The demo spec with its control's epochs and batch size changed (variants follow)."""
    spec = yaml.safe_load(DEMO.read_text(encoding="utf-8"))
    spec["name"] = f"fc-e{epochs}-b{batch}"
    spec["control"].update({"epochs": epochs, "batch_size": batch})
    spec["stop_rules"].update(
        {
            "futility": False,
            "not_learning": False,
            "below_threshold": False,
            "require_restart": False,
        }
    )
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / "data"
    data.mkdir(exist_ok=True)  # the corpus stays inside the spec's folder: a copy of the demo's
    (data / "digits.csv").write_bytes((DEMO.parent / "data" / "digits.csv").read_bytes())
    path = folder / "campaign.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return path


def run_campaign(spec: Path, out: Path) -> dict:
    """``campaign run`` of one spec; its report.json."""
    t0 = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}:{REPO}"}
    done = subprocess.run(
        [sys.executable, "-m", "gpucampaign.cli", "run", str(spec), "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(
            f"{spec}: exit {done.returncode}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    report["_wall_s"] = time.perf_counter() - t0
    return measured(out, report)


def measured(out: Path, report: dict) -> dict:
    """A closed campaign's report.json with what the bench reads beside it."""
    report["_parts"] = split_parts(out, report)
    report["_previous"] = previous_forecast(out, report)
    return report


def split_parts(out: Path, report: dict) -> dict[str, dict[str, float]]:
    """Per training step: its steps and what surrounds them, forecast (the parts the
    re-forecast summed, from ``pilot.json``) and observed (the step times the training call
    wrote to ``metrics.jsonl``; the rest of the observed time)."""
    pilot = pool_pilots(json.loads((out / "pilot.json").read_text(encoding="utf-8")))
    parts = {}
    for s in training_steps(report):
        m = pilot.get(s["run"])
        if not m or "fixed_s" not in m:
            continue
        rows = [
            json.loads(line)
            for line in (out / "runs" / m["run_id"] / "metrics.jsonl").open(encoding="utf-8")
        ]
        done = int(m["steps_done"])
        trained = [r["step_s"] for r in rows if r.get("kind") == "train" and r["step"] > done]
        fc = call_parts(m, left=len(trained))
        seen = 3600 * s["observed_hours"]
        parts[s["step"]] = {
            "steps_fc": fc["steps"],
            "steps_seen": sum(trained),
            "rest_fc": sum(fc.values()) - fc["steps"],
            "rest_seen": seen - sum(trained),
        }
    return parts


def previous_forecast(out: Path, report: dict) -> dict[str, float]:
    """Per training step, the seconds the re-forecast before this round gave from the same
    pilot: the least time outside the loop of any pilot, the first step, the mean of the
    pilot's later steps for each step left, the loop's own per step with its start spread over
    the pilot's steps, every evaluation of the run at its own pilot's and every save's wait."""
    pilot = json.loads((out / "pilot.json").read_text(encoding="utf-8"))
    fixed = min(float(m["fixed_s"]) for m in pilot.values())
    seconds = {}
    for s in training_steps(report):
        m = pilot[s["run"]]
        rows = [
            json.loads(line)
            for line in (out / "runs" / m["run_id"] / "metrics.jsonl").open(encoding="utf-8")
        ]
        done = int(m["steps_done"])
        times = [r["step_s"] for r in rows if r.get("kind") == "train" and r["step"] <= done]
        left = int(m["planned_steps"]) - done
        loop = float(m["loop_s"]) + float(m.get("loop_start_s") or 0.0) / done
        seconds[s["step"]] = (
            fixed
            + times[0]
            + (left - 1) * float(np.mean(times[1:]))
            + left * loop
            + int(m["evals"]) * float(m["eval_s"])
            + int(m["saves"]) * float(m["stall_s"])
        )
    return seconds


def training_steps(report: dict) -> list[dict]:
    """The training steps a campaign re-forecast and observed."""
    return [
        s
        for s in report["forecast_vs_actual"]["steps"]
        if s.get("run") and s.get("reforecast_hours") and s.get("observed_hours")
    ]


def measure(reports: list[dict]) -> dict:
    """Errors and coverage over the campaigns' training steps."""
    errors, inside_default, inside_loo = [], [], []
    steps_err, rest_err, previous_err = [], [], []
    for rep in reports:
        for s in training_steps(rep):
            if (before := rep.get("_previous", {}).get(s["step"])) is not None:
                seen = 3600 * s["observed_hours"]
                previous_err.append(abs(seen - before) / seen)
        for p in rep.get("_parts", {}).values():
            steps_err.append(abs(p["steps_seen"] - p["steps_fc"]) / p["steps_seen"])
            rest_err.append(abs(p["rest_seen"] - p["rest_fc"]) / p["rest_seen"])
    for i, rep in enumerate(reports):
        others = [r for j, rep2 in enumerate(reports) if j != i for r in observed_ratios(rep2)]
        lo, hi = spread_of(others)
        for s in training_steps(rep):
            ratio = s["observed_hours"] / s["reforecast_hours"]
            errors.append(abs(s["observed_hours"] - s["reforecast_hours"]) / s["observed_hours"])
            inside_default.append(bool(s.get("in_range")))
            inside_loo.append(lo <= ratio <= hi)
    return {
        "steps": len(errors),
        "median_abs_error": float(np.median(errors)),
        "p90_abs_error": float(np.quantile(errors, 0.9)),
        "steps_abs_error": float(np.median(steps_err)) if steps_err else None,
        "rest_abs_error": float(np.median(rest_err)) if rest_err else None,
        "previous_abs_error": float(np.median(previous_err)) if previous_err else None,
        "coverage_default": float(np.mean(inside_default)),
        "coverage_calibrated": float(np.mean(inside_loo)),
        "spread_all": spread_of([r for rep in reports for r in observed_ratios(rep)]),
    }


def render(reports: list[dict], m: dict, *, load: str) -> str:
    rows = []
    for rep in reports:
        for s in training_steps(rep):
            p = rep.get("_parts", {}).get(s["step"])
            split = (
                f"{p['steps_fc']:.3g} / {p['steps_seen']:.3g} s | "
                f"{p['rest_fc']:.3g} / {p['rest_seen']:.3g} s"
                if p
                else "- | -"
            )
            rows.append(
                f"| {rep['campaign']} | {s['step']} | {3600 * s['reforecast_hours']:.3g} s | "
                f"{3600 * s['observed_hours']:.3g} s | "
                f"{s['observed_hours'] / s['reforecast_hours']:.2f} | {split} |"
            )
    lo, hi = m["spread_all"]
    return "\n".join(
        [
            "# Re-forecast after the pilot: error and p10-p90 coverage",
            "",
            f"`python bench/forecast.py --campaigns {len(reports)}` on {platform.node()} "
            f"({os.cpu_count()} cores shared with other work; load average {load}), "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. Run once.",
            "",
            "How it was measured: "
            + (__doc__ or "").split("\n\n", 1)[1].split("Usage:")[0].strip(),
            "",
            f"- campaigns: {len(reports)}; training steps re-forecast and observed: {m['steps']}",
            f"- median absolute error of the re-forecast: **{100 * m['median_abs_error']:.1f}%** "
            f"(p90 {100 * m['p90_abs_error']:.1f}%; goal <= 15%)",
            f"- of which the steps: median absolute error {_pct(m['steps_abs_error'])} (the "
            "pilot's step times against the training call's); what surrounds them: "
            f"{_pct(m['rest_abs_error'])}",
            f"- the model before this round (main at f91a08a) on the same records: median "
            f"absolute error {_pct(m['previous_abs_error'])}",
            f"- inside the recorded range (uncalibrated, x{DEFAULT_SPREAD[0]:g} to "
            f"x{DEFAULT_SPREAD[1]:g}): **{100 * m['coverage_default']:.0f}%**",
            f"- inside the range calibrated leave-one-out from the other campaigns: "
            f"**{100 * m['coverage_calibrated']:.0f}%** (goal 70-90%)",
            f"- the ratio observed / re-forecast over all campaigns: p10 {lo:.2f}, p90 {hi:.2f}",
            "",
            "| campaign | step | re-forecast | observed | observed / re-forecast | "
            "steps: forecast / observed | around them: forecast / observed |",
            "|---|---|---:|---:|---:|---:|---:|",
            *rows,
            "",
        ]
    )


def _pct(x: float | None) -> str:
    return "-" if x is None else f"**{100 * x:.1f}%**"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--campaigns", type=int, default=10)
    ap.add_argument("--work", type=Path, default=Path("/tmp/gpucampaign-bench-forecast"))
    ap.add_argument("--write", type=Path, default=None)
    ap.add_argument("--reuse", action="store_true")
    a = ap.parse_args()
    if a.reuse:
        reports = [
            measured(f / "out", json.loads((f / "out" / "report.json").read_text("utf-8")))
            for f in (a.work / f"e{e}-b{b}" for e, b in SIZES[: a.campaigns])
        ]
        load = (a.work / "load.txt").read_text(encoding="utf-8").strip()
    else:
        load_before = " ".join(f"{x:.1f}" for x in os.getloadavg())
        reports = []
        for epochs, batch in SIZES[: a.campaigns]:
            folder = a.work / f"e{epochs}-b{batch}"
            spec = write_spec(folder, epochs=epochs, batch=batch)
            reports.append(run_campaign(spec, folder / "out"))
            print(f"{spec.parent.name}: {reports[-1]['_wall_s']:.0f} s", flush=True)
        load = f"{load_before} at the start, " + " ".join(f"{x:.1f}" for x in os.getloadavg())
        load += " at the end"
        (a.work / "load.txt").write_text(load + "\n", encoding="utf-8")
    m = measure(reports)
    text = render(reports, m, load=load)
    print(text)
    if a.write:
        a.write.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
