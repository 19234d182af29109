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
  ``result.json`` and ``metrics.jsonl`` (``plan.reforecast.call_parts``, the parts the
  re-forecast summed): the steps (their forecast against the sum of the step times the
  training call recorded) and what surrounds them (the rest of the observed time);
- each part on its own (``split_parts``): the time outside the loop, the loop's start, the
  steps, the loop's own time (the live view's reports with it), the evaluations, the save
  waits: its share of the observed time, forecast and actual, the ratio actual / forecast and
  its bias, (actual - forecast) / observed, each a median over the training steps;
- the error main before this round (29805d9) makes on the same records (``main_forecast``),
  and the model of the round before (f91a08a, ``previous_forecast``): the same steps and
  actuals, so the load's drift is the same for each;
- the share of observed times inside the range the campaign recorded (the uncalibrated
  default, ``plan.ranges.DEFAULT_SPREAD``);
- the share inside the range calibrated leave-one-out: each campaign's range from the other
  campaigns' errors (``plan.ranges.spread_of``: what ``campaign plan --calibrate-from``
  does with several earlier campaigns).

Usage: python bench/forecast.py [--campaigns 10] [--work DIR] [--reuse]
[--write bench/results/forecast.md] (``--reuse``: measure the closed campaigns already in
DIR again, with the load they were run at, kept in DIR/load.txt); ``--demo N``: the demo spec
itself, as users run it (futility and the restart check on), N times, each training step's
re-forecast against its observed time (``bench/results/forecast-demo.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml

from gpucampaign.config.parts import EVAL_SPLITS
from gpucampaign.folder.records import read_decisions
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
    report["_main"] = main_forecast(out, report)
    return report


#: The parts compared one by one, forecast against the training call's own timings.
COMPONENTS = ("outside", "loop start", "steps", "loop", "evaluations", "save waits")


def split_parts(out: Path, report: dict) -> dict[str, dict[str, dict[str, float]]]:
    """Per training step, each part of the re-forecast (``call_parts`` of the pooled pilots,
    ``pilot.json``) against what the training call measured (its ``result.json`` timings and
    its segment on the timeline, the observed time): ``outside``, the call's time outside the
    loop and beyond ``train_run`` less its final evaluations (forecast: outside, set-up and
    the model folder's write); ``loop start``; ``steps`` (the sum of the step times);
    ``loop``, the loop's own time (the live view's reports with it); ``evaluations``, all of
    them, the final ones too; ``save waits``, the loop's stalls on its saves."""
    pilot = pool_pilots(json.loads((out / "pilot.json").read_text(encoding="utf-8")))
    kept = {k: v for d in read_decisions(out) for k, v in d.reforecast.items()}
    parts = {}
    for s in training_steps(report):
        m = pilot.get(s["run"])
        if not m or "fixed_s" not in m:
            continue
        folder = out / "runs" / m["run_id"]
        t = json.loads((folder / "result.json").read_text("utf-8"))["timings"]
        done = int(m["steps_done"])
        rows = [json.loads(line) for line in (folder / "metrics.jsonl").open(encoding="utf-8")]
        # The call's own steps (``steps_s_sum`` holds the pilot's too: restored with the state)
        steps = sum(r["step_s"] for r in rows if r.get("kind") == "train" and r["step"] > done)
        left = int(m["planned_steps"]) - done
        # The parts the decision kept (``decisions.jsonl``: ``parts_s``), the ones the
        # re-forecast summed; older folders: ``call_parts`` again, without the live view's
        # reports and futility's looks (``forecast_run`` adds their counts).
        fc = kept.get(s["step"], {}).get("parts_s") or call_parts(m, left=left)
        waits = int(m.get("saves") or 0) * float(m.get("stall_s") or 0.0)
        evals = [float(x) for x in t["eval_s"]]
        final = sum(evals[-len(EVAL_SPLITS) :])
        stalls = sum(float(x) for x in t["stall_s"])
        seen = 3600 * s["observed_hours"]
        in_loop = t["train_s"] - t["loop_start_s"] - steps - (sum(evals) - final)
        parts[s["step"]] = {
            "forecast": {
                "outside": fc["outside"] + fc["saves"] - waits,
                "loop start": fc["loop start"],
                "steps": fc["steps"],
                "loop": fc["loop"],
                "evaluations": fc["evaluations"],
                "save waits": waits,
            },
            "actual": {
                "outside": seen - t["train_s"] - final,
                "loop start": t["loop_start_s"],
                "steps": steps,
                "loop": in_loop - stalls,
                "evaluations": sum(evals),
                "save waits": stalls,
            },
            "seen": {"all": seen},
        }
    return parts


def main_forecast(out: Path, report: dict) -> dict[str, float]:
    """Per training step, the seconds main before this round (29805d9) gave from the same
    pilots: the live view's reports spread over the loop's steps at one pooled rate, no
    evaluation's cost when the pilots' steps held none (the one timed after them unused), each
    run at its own pilot's median step (the pilots of the same step not pooled)."""
    raw = json.loads((out / "pilot.json").read_text(encoding="utf-8"))
    before = {}
    for run, m in raw.items():
        new_keys = ("report_s", "report_every", "eval_step", "step_shape")
        m = {k: v for k, v in m.items() if k not in new_keys}
        if "report_s" in raw[run]:
            extra = float(raw[run]["report_s"]) * int(raw[run]["reports"])
            m["loop_s"] = float(m["loop_s"]) + extra / max(1, int(m["steps_done"]))
        if not int(m.get("evals_done") or 0):
            m["eval_s"] = 0.0
        before[run] = m
    pilot = pool_pilots(before)
    seconds = {}
    for s in training_steps(report):
        m = pilot.get(s["run"])
        if m and "fixed_s" in m:
            left = int(m["planned_steps"]) - int(m["steps_done"])
            seconds[s["step"]] = sum(call_parts(m, left=left).values())
    return seconds


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
    steps_err, rest_err, previous_err, main_err = [], [], [], []
    by_part: dict[str, list[tuple[float, float, float]]] = {c: [] for c in COMPONENTS}
    for rep in reports:
        for s in training_steps(rep):
            seen = 3600 * s["observed_hours"]
            if (before := rep.get("_previous", {}).get(s["step"])) is not None:
                previous_err.append(abs(seen - before) / seen)
            if (before := rep.get("_main", {}).get(s["step"])) is not None:
                main_err.append(abs(seen - before) / seen)
        for p in rep.get("_parts", {}).values():
            fc, act, seen = p["forecast"], p["actual"], p["seen"]["all"]
            steps_err.append(abs(act["steps"] - fc["steps"]) / act["steps"])
            rest_fc, rest_act = sum(fc.values()) - fc["steps"], seen - act["steps"]
            rest_err.append(abs(rest_act - rest_fc) / rest_act)
            for c in COMPONENTS:
                by_part[c].append((fc[c], act[c], seen))
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
        "main_abs_error": float(np.median(main_err)) if main_err else None,
        "parts": {c: _part_stats(v) for c, v in by_part.items() if v},
        "coverage_default": float(np.mean(inside_default)),
        "coverage_calibrated": float(np.mean(inside_loo)),
        "spread_all": spread_of([r for rep in reports for r in observed_ratios(rep)]),
    }


def _part_stats(v: list[tuple[float, float, float]]) -> dict[str, float]:
    """One part over the training steps: its median share of the observed time, forecast and
    actual; the ratio actual / forecast (median, p10, p90); the bias, (actual - forecast) /
    observed (median)."""
    fc, act, seen = (np.asarray(x) for x in zip(*v, strict=True))
    ratio = act[fc > 0] / fc[fc > 0]
    return {
        "share_fc": float(np.median(fc / seen)),
        "share_act": float(np.median(act / seen)),
        "ratio": float(np.median(ratio)) if ratio.size else float("nan"),
        "ratio_p10": float(np.quantile(ratio, 0.1)) if ratio.size else float("nan"),
        "ratio_p90": float(np.quantile(ratio, 0.9)) if ratio.size else float("nan"),
        "bias": float(np.median((act - fc) / seen)),
    }


def render(reports: list[dict], m: dict, *, load: str) -> str:
    rows = []
    for rep in reports:
        for s in training_steps(rep):
            p = rep.get("_parts", {}).get(s["step"])
            split = "- | -"
            if p:
                fc, act, seen = p["forecast"], p["actual"], p["seen"]["all"]
                split = (
                    f"{fc['steps']:.3g} / {act['steps']:.3g} s | "
                    f"{sum(fc.values()) - fc['steps']:.3g} / {seen - act['steps']:.3g} s"
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
            f"({os.cpu_count()} cores; load average {load}), "
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
            f"- main before this round (29805d9: the reports spread over the steps, no "
            f"evaluation's cost without one in the pilot) on the same records: median absolute "
            f"error {_pct(m['main_abs_error'])}; the model of the round before (f91a08a): "
            f"{_pct(m['previous_abs_error'])}",
            f"- inside the recorded range (uncalibrated, x{DEFAULT_SPREAD[0]:g} to "
            f"x{DEFAULT_SPREAD[1]:g}): **{100 * m['coverage_default']:.0f}%**",
            f"- inside the range calibrated leave-one-out from the other campaigns: "
            f"**{100 * m['coverage_calibrated']:.0f}%** (goal 70-90%)",
            f"- the ratio observed / re-forecast over all campaigns: p10 {lo:.2f}, p90 {hi:.2f}",
            "",
            "Each part of the re-forecast against the training call's own timings (median over "
            "the training steps; bias: (actual - forecast) / observed time, its median):",
            "",
            "| part | forecast, share of observed | actual, share | actual / forecast "
            "(p10-p90) | bias |",
            "|---|---:|---:|---:|---:|",
            *(
                f"| {c} | {100 * v['share_fc']:.1f}% | {100 * v['share_act']:.1f}% | "
                f"{v['ratio']:.2f} ({v['ratio_p10']:.2f}-{v['ratio_p90']:.2f}) | "
                f"{100 * v['bias']:+.1f}% |"
                for c, v in m["parts"].items()
            ),
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


def same_calls(out: Path) -> dict[str, list[float]]:
    """The training calls of a closed campaign that do the same work, grouped: a run and its
    seeds (``<run>.s<k>``: the same steps, evaluations and saves; another seed draws other
    numbers of the same cost), each call's segment on the timeline in seconds (the time a
    report observes)."""
    groups: dict[str, list[float]] = {}
    for line in (out / "timeline.jsonl").open(encoding="utf-8"):
        row = json.loads(line)
        if row.get("event") != "end" or row.get("phase") != "train" or not row.get("run"):
            continue
        # The round's seeds are not in the folder's spec (``replicate_of`` knows the spec's)
        base = re.sub(r"\.s\d+$", "", str(row["run"]))
        groups.setdefault(base, []).append(float(row["seconds"]))
    return {k: v for k, v in groups.items() if len(v) >= 3}


def demo_runs(n: int, *, work: Path) -> str:
    """The demo spec, unchanged, run ``n`` times: each training step's re-forecast, observed
    time and error, as its report says them; and the floor a forecast made before a call meets
    on this machine: how far each call lands from the median of the same call run three times
    in the same campaign (a run and its two seeds, ``same_calls``), one after the other."""
    load_before = " ".join(f"{x:.1f}" for x in os.getloadavg())
    rows, errors, spread, typical, misses, replay = [], [], [], [], [], []
    for i in range(1, n + 1):
        report = run_campaign(DEMO, work / f"demo-{i}")
        for base, seconds in same_calls(work / f"demo-{i}").items():
            mid = float(np.median(seconds))
            spread += [abs(s - mid) / s for s in seconds]
            # The two seeds' calls (after the run's own, which ends before its round of seeds
            # starts): the same work from step 0, one right after the other. The first's time
            # as the forecast of the second's: what no forecast made before a call can beat.
            replay += [abs(seconds[1] - seconds[2]) / seconds[2]]
            for s in training_steps(report):
                if s["run"] == base:
                    typical.append(abs(3600 * s["reforecast_hours"] - mid) / mid)
        for s in training_steps(report):
            err = (s["reforecast_hours"] - s["observed_hours"]) / s["observed_hours"]
            errors.append(abs(err))
            # The error in two (the report's ``steps_split``): the steps' part and the rest's,
            # each over the observed time (they sum to the error), and the call's median step
            # over the one the re-forecast used.
            x, split = s.get("steps_split"), "- | - | -"
            if x:
                seen = 3600 * s["observed_hours"]
                by_steps = (x["reforecast_steps_s"] - x["observed_steps_s"]) / seen
                pace = x["observed_step_s"] / x["pilot_step_s"]
                split = (
                    f"{100 * by_steps:+.0f}% | "
                    f"{100 * (x['reforecast_rest_s'] - x['observed_rest_s']) / seen:+.0f}% | "
                    f"{pace:.2f}"
                )
                if abs(err) > 0.15:
                    misses.append(abs(by_steps) > 0.15)
            rows.append(
                f"| {i} | {s['step']} | {3600 * s['reforecast_hours']:.3g} s | "
                f"{3600 * s['observed_hours']:.3g} s | {100 * err:+.0f}% | {split} | "
                f"{'yes' if abs(err) <= 0.15 else '**no**'} |"
            )
    load = f"{load_before} at the start, " + " ".join(f"{x:.1f}" for x in os.getloadavg())
    within = sum(e <= 0.15 for e in errors)
    return "\n".join(
        [
            "# The demo's re-forecast after the pilot, run after run",
            "",
            f"`python bench/forecast.py --demo {n}` on {platform.node()} ({os.cpu_count()} "
            f"cores; load average {load} at the end), "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: `campaign run` of "
            "`examples/digits/campaign.yaml` as it is, one run after the other; each training "
            "step's re-forecast (made after the pilot) and observed time from its report.",
            "",
            f"- training steps within 15% of their observed time: **{within} of {len(errors)}**;"
            f" median absolute error {100 * float(np.median(errors)):.1f}%, largest "
            f"{100 * max(errors):.1f}%",
            "- the floor, the same call three times in one campaign (a run and its two seeds, "
            "each the same steps, evaluations and saves): calls within 15% of the median of "
            f"their three: **{sum(e <= 0.15 for e in spread)} of {len(spread)}**; median "
            f"distance {100 * float(np.median(spread)):.1f}%, largest {100 * max(spread):.1f}%"
            if spread
            else "- no run with two seeds to measure the floor against",
            "- the ceiling, each second seed's call forecast by its first seed's actual time "
            "(the same work, one call after the other): "
            f"**{sum(e <= 0.15 for e in replay)} of {len(replay)}** within 15%, median "
            f"{100 * float(np.median(replay)):.1f}%"
            if replay
            else "",
            "- the re-forecast of those runs against the median of their three calls (the "
            f"typical call): **{sum(e <= 0.15 for e in typical)} of {len(typical)}** within "
            f"15%, median {100 * float(np.median(typical)):.1f}%"
            if typical
            else "",
            f"- the misses whose steps alone are more than 15% of the observed time off "
            f"(the report's split: the call's steps against the re-forecast's): **{sum(misses)} "
            f"of {len(misses)}**",
            "",
            "| run | step | re-forecast | observed | re-forecast - observed | of which the steps "
            "| of which the rest | the call's median step / the pilot's | within 15% |",
            "|---|---|---:|---:|---:|---:|---:|---:|---|",
            *rows,
            "",
        ]
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--campaigns", type=int, default=10)
    ap.add_argument("--demo", type=int, default=0)
    ap.add_argument("--work", type=Path, default=Path("/tmp/gpucampaign-bench-forecast"))
    ap.add_argument("--write", type=Path, default=None)
    ap.add_argument("--reuse", action="store_true")
    a = ap.parse_args()
    if a.demo:
        text = demo_runs(a.demo, work=a.work)
        print(text)
        if a.write:
            a.write.write_text(text, encoding="utf-8")
        return
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
