"""PNG figures of a campaign: the calendar Gantt chart (planned vs actual), and more below.

Figures are drawn on ``matplotlib.figure.Figure`` objects rendered by the Agg backend, never
through pyplot's global state, so they work headless and from several threads. New plot
functions: ``fig = new_figure(...)``, draw, then ``return save(fig, path)``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpucampaign.core.text import say_exact, say_number
from gpucampaign.plan.calendar import Plan
from gpucampaign.plan.machines import lane_machine

if TYPE_CHECKING:
    from matplotlib.figure import Figure

_GPU = "#d62728"
_HOST = "#ff9896"
_HUMAN = "#1f77b4"
_ACTUAL = "#333333"
_TIER_HATCH = {"essential": "", "useful": "..", "exploratory": "//"}


def new_figure(*, width: float = 10.0, height: float = 5.0) -> Figure:
    """A figure bound to the Agg canvas (no pyplot, no display)."""
    # matplotlib (~0.3-0.5 s) loads at the first figure, not with the modules that import
    # this one on the way to a campaign's first step
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def save(fig: Figure, path: str | Path, *, dpi: int = 120) -> Path:
    """Write ``fig`` as PNG, creating the folder; returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi, format="png", bbox_inches="tight")
    return out


def plot_calendar(
    plan: Plan, path: str | Path, *, actual: Iterable[Mapping[str, Any]] | None = None
) -> Path:
    """Write ``draw_calendar``'s figure as a PNG; returns the path."""
    return save(draw_calendar(plan, actual=actual), path)


def draw_calendar(plan: Plan, *, actual: Iterable[Mapping[str, Any]] | None = None) -> Figure:
    """Gantt chart of a plan: one row per lane, human vs machine colours, the window's end.

    With ``actual`` (observed intervals, each ``{name, start_hours, end_hours}``), a second
    panel draws them on their own time scale, one row per lane of their planned step (or an
    "unplanned" row): seconds of training would be invisible on a calendar of hours.

    Returns:
        The figure (the planned panel first).
    """
    # A data-parallel run's step holds several GPU lanes ('gpu0+gpu1'): drawn on each.
    lanes = sorted({lane for s in plan.steps for lane in s.lane.split("+")}, key=_lane_order)
    actual = list(actual or [])
    planned_lane = {s.name: s.lane.split("+")[0] for s in plan.steps}
    row = {lane: k for k, lane in enumerate(lanes)}
    height = 1.8 + 0.7 * max(len(lanes), 1)
    fig = new_figure(width=11, height=height * (2.1 if actual else 1))
    ax = fig.add_subplot(2, 1, 1) if actual else fig.add_subplot()

    content_end = plan.span_hours
    # A calendar far shorter than its window would be a sliver at the left edge: zoom on the
    # steps and say where the window ends instead of drawing it.
    zoomed = content_end < 0.3 * plan.window_hours
    x_end = content_end if zoomed else max(plan.window_hours, content_end)
    _draw_planned(ax, plan, row=row, x_end=x_end, thin=False)
    _draw_window(ax, plan, x_end=x_end, zoomed=zoomed)
    ax.set_xlim(0, x_end * 1.05)
    ax.set_ylim(len(lanes) - 0.4, -0.6)
    # A GPU lane is named by its machine and GPU there (lot 2 / gpu0), the others as placed.
    labels = [lane_machine(plan.machines, lane) or lane for lane in lanes]
    ax.set_yticks(range(len(lanes)), labels)
    ax.set_xlabel("hours from the start of preparation")
    verdict = "fits" if plan.fits else f"{plan.overrun_hours:g} h over"
    ax.set_title(
        f"planned: {plan.name}, span {plan.span_hours:g} h in a {plan.window_hours:g} h window "
        f"({verdict})",
        fontsize=10,
    )
    ax.grid(axis="x", alpha=0.3)
    _calendar_legend(ax, n_lanes=len(lanes))
    if actual:
        _draw_actual(
            fig.add_subplot(2, 1, 2), actual, lanes=lanes, labels=labels, planned_lane=planned_lane
        )
    fig.subplots_adjust(hspace=0.9)
    return fig


def _draw_planned(ax: Any, plan: Plan, *, row: Mapping[str, int], x_end: float, thin: bool) -> None:
    """One bar per planned step, coloured by kind and hatched by tier, with its name."""
    narrow = 0  # labels of bars too short for their name alternate above and below the bar
    for s in sorted(plan.steps, key=lambda s: (s.lane, s.start_hours)):
        colour = _HUMAN if s.kind == "human" else (_GPU if s.resource == "gpu" else _HOST)
        for lane in s.lane.split("+"):
            ax.barh(
                row[lane],
                s.hours,
                left=s.start_hours,
                height=0.6 if thin else 0.7,
                color=colour,
                edgecolor="black",
                linewidth=0.5,
                hatch=_TIER_HATCH[s.tier],
            )
        y = row[s.lane.split("+")[0]]
        fits_inside = s.hours / x_end > 0.012 * len(s.name)
        if not fits_inside:
            narrow += 1
        dy = 0.0 if fits_inside else (-0.45 if narrow % 2 else 0.45)
        ax.text(
            s.start_hours + s.hours / 2,
            y + dy,
            s.name,
            ha="center",
            va="center",
            fontsize=7,
            bbox={"facecolor": "white", "alpha": 0.7, "linewidth": 0, "pad": 1},
        )


#: The actual panel's row of time no calendar step stands for (each bar named by its run).
_UNPLANNED = "unplanned"
#: The unit of the actual panel: the first whose span stays under 120 of it.
_UNITS = (("s", 3600.0), ("min", 60.0), ("h", 1.0))


def _draw_actual(
    ax: Any,
    actual: list[Mapping[str, Any]],
    *,
    lanes: list[str],
    labels: list[str],
    planned_lane: Mapping[str, str],
) -> None:
    """Observed intervals on their own scale (seconds, minutes or hours from the first one),
    one row per lane of their planned step, or an "unplanned" row."""
    rows = list(lanes) + (
        [_UNPLANNED] if any(a["name"] not in planned_lane for a in actual) else []
    )
    row = {lane: k for k, lane in enumerate(rows)}
    t0 = min(float(a["start_hours"]) for a in actual)
    span = max(float(a["end_hours"]) for a in actual) - t0
    unit, scale = next(((u, k) for u, k in _UNITS if span * k < 120), _UNITS[-1])
    seen: dict[int, int] = {}
    for a in sorted(actual, key=lambda a: float(a["start_hours"])):
        start, stop = float(a["start_hours"]) - t0, float(a["end_hours"]) - t0
        y = row[planned_lane.get(a["name"], _UNPLANNED)]
        seen[y] = seen.get(y, 0) + 1  # labels on one row alternate above and below its bars
        ax.barh(
            y,
            (stop - start) * scale,
            left=start * scale,
            height=0.5,
            color=_ACTUAL,
            edgecolor="black",
            linewidth=0.5,
        )
        dy = -0.35 if seen[y] % 2 else 0.35
        ax.text(start * scale, y + dy, a["name"], fontsize=7, va="center")
    ax.set_xlim(0, max(span * scale, 1e-9) * 1.05)
    ax.set_ylim(len(rows) - 0.4, -0.7)
    ax.set_yticks(range(len(rows)), labels + rows[len(lanes) :])
    ax.set_xlabel(f"{unit} from the first observed interval")
    ax.set_title(
        f"actual: {len(actual)} observed interval(s) over {span * scale:.3g} {unit} "
        "(timeline.jsonl), on their own scale",
        fontsize=10,
    )
    ax.grid(axis="x", alpha=0.3)


def _draw_window(ax: Any, plan: Plan, *, x_end: float, zoomed: bool) -> None:
    """The window's end: a dashed line, or a note when the chart is zoomed on the steps."""
    if zoomed:
        ax.text(
            x_end * 1.05,
            -0.55,
            f"window ends at {plan.window_hours:g} h ->",
            fontsize=8,
            va="top",
            ha="right",
        )
    else:
        ax.axvline(plan.window_hours, color="black", linestyle="--", linewidth=1.2)
        ax.text(
            plan.window_hours, -0.55, f" window end {plan.window_hours:g} h", fontsize=8, va="top"
        )


def _calendar_legend(ax: Any, *, n_lanes: int) -> None:
    from matplotlib.patches import Patch

    handles = [
        Patch(color=_GPU, label="machine: GPU"),
        Patch(color=_HOST, label="machine: cpu / other"),
        Patch(color=_HUMAN, label="human"),
        Patch(facecolor="white", edgecolor="black", hatch="..", label="useful"),
        Patch(facecolor="white", edgecolor="black", hatch="//", label="exploratory"),
    ]
    ax.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.12 - 0.4 / n_lanes),
        ncol=len(handles),
        fontsize=7,
        frameon=False,
    )


def _lane_order(lane: str) -> tuple[int, int]:
    kinds = ("gpu", "host", "human")
    kind = next(k for k in kinds if lane.startswith(k))
    return kinds.index(kind), int(lane[len(kind) :])


# --- training curves and confusion matrix (close) ------------------------------------------------
_METRIC = re.compile(r"(accuracy|f1|precision|recall|auc)$")
_NOT_CURVE_KINDS = {"checkpoint", "restore", "progress"}


def _series(
    records: Iterable[Mapping[str, Any]], *, x: str
) -> dict[str, list[tuple[float, float]]]:
    """Curves of metric records: ``{"<split or kind> <field>": [(x, value)]}``.

    Rows of ``metrics.jsonl`` carry a ``kind`` (train, eval...) and eval rows a ``split``, so
    a training loss and a validation loss never end up on one line.
    """
    out: dict[str, list[tuple[float, float]]] = {}
    for r in records:
        if r.get("kind") in _NOT_CURVE_KINDS or not isinstance(r.get(x), int | float):
            continue
        prefix = str(r.get("split") or r.get("kind") or "").strip()
        for k, v in r.items():
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                continue
            if "loss" in k or _METRIC.search(k):
                out.setdefault(f"{prefix} {k}".strip(), []).append((float(r[x]), float(v)))
    return {k: sorted(v) for k, v in out.items()}


def plot_curves(
    runs_metrics: Mapping[str, Iterable[Mapping[str, Any]]],
    path: str | Path,
    *,
    x: str = "step",
    **marks: Any,
) -> Path:
    """Write ``draw_curves``'s figure as a PNG (``marks``: its keyword arguments)."""
    return save(draw_curves(runs_metrics, x=x, **marks), path)


def draw_curves(
    runs_metrics: Mapping[str, Iterable[Mapping[str, Any]]],
    *,
    x: str = "step",
    metric: str | None = None,
    threshold: float | None = None,
    control_final: float | None = None,
    split: str | None = None,
    continued: Mapping[str, float] | None = None,
) -> Figure:
    """Loss and metric curves of every run, side by side (one colour per run).

    Fields with "loss" in their name go to the left panel, accuracy / F1 / precision / recall
    / AUC to the right one, named by the row's ``split`` (eval rows) or ``kind``; checkpoint
    and restore rows are skipped. Each panel's title names the splits it shows. Runs whose
    curve is identical share one line (in the first run's colour). The decision ``metric``'s
    panel carries the ``threshold`` and the control's final value on ``split`` as horizontal
    lines; where a run was really interrupted (an ``interrupt`` row, or a ``restore`` that is
    not its pilot's continuation) the loss panel has a vertical line.

    One legend, outside the panels on the right, names each run once (its colour), each
    series once (its line style) and each mark: many runs never cover the curves.

    Args:
        runs_metrics: ``{run label: metrics.jsonl rows}``; each row has ``x`` (``step``).
        x: the row field on the horizontal axis.
        metric: the decision metric (its panel gets the lines below).
        threshold: the decision threshold.
        control_final: the control's final value of ``metric`` on ``split``.
        split: the split ``control_final`` was measured on (the selection split).
        continued: ``{run: step}`` where the pilot stopped and the run's training continued
            (a restore there is the plan, not an interruption).

    Returns:
        The figure.
    """
    fig = new_figure(width=13, height=4.2)
    ax_loss, ax_metric = fig.subplots(1, 2)
    fig.subplots_adjust(right=0.76, wspace=0.25)  # the legend's column on the right
    styles = ["-", "--", ":", "-."]
    # One line per distinct curve: identical curves of several runs are drawn once.
    curves: dict[tuple[str, tuple[tuple[float, float], ...]], list[str]] = {}
    colour: dict[str, int] = {}
    for n, (run, records) in enumerate(runs_metrics.items()):
        colour[run] = n
        for name, pts in _series(records, x=x).items():
            curves.setdefault((name, tuple(pts)), []).append(run)
    names = list(dict.fromkeys(name for name, _ in curves))
    splits: dict[int, list[str]] = {id(ax_loss): [], id(ax_metric): []}
    for (name, curve), runs in curves.items():
        ax = _panel(name, ax_loss=ax_loss, ax_metric=ax_metric)
        if " " in name:
            splits[id(ax)].append(name.split(" ")[0])
        xs, ys = zip(*curve, strict=True)
        ax.plot(
            xs,
            ys,
            styles[names.index(name) % len(styles)],
            color=f"C{colour[runs[0]] % 10}",
            marker="o" if len(xs) < 30 else None,
            markersize=3,
            label=f"{' = '.join(runs)}: {name}",
        )
    marks = _mark_interruptions(ax_loss, runs_metrics, colour=colour, x=x, continued=continued)
    if metric is not None:
        marks += _mark_decision(
            _panel(metric, ax_loss=ax_loss, ax_metric=ax_metric),
            metric=metric,
            threshold=threshold,
            control_final=control_final,
            split=split,
        )
    for ax, title in ((ax_loss, "loss"), (ax_metric, "metrics")):
        shown = list(dict.fromkeys(splits[id(ax)]))
        ax.set_title(f"{title}: {', '.join(shown)}" if shown else title, fontsize=10)
        ax.set_xlabel(x)
        ax.grid(alpha=0.3)
        if not ax.get_lines():
            ax.text(
                0.5, 0.5, f"no {title} recorded", ha="center", va="center", transform=ax.transAxes
            )
    handles = _legend_handles(curves, colour=colour, names=names, styles=styles) + marks
    if handles:
        fig.legend(handles=handles, loc="center left", bbox_to_anchor=(0.77, 0.5), fontsize=7)
    return fig


def _legend_handles(
    curves: Mapping[tuple[str, tuple[tuple[float, float], ...]], list[str]],
    *,
    colour: Mapping[str, int],
    names: list[str],
    styles: list[str],
) -> list[Any]:
    """Each run once (its colour; a run whose every curve is another run's says whose) and
    each series once (its line style, in black)."""
    from matplotlib.lines import Line2D

    drawn_by: dict[str, str] = {}  # run -> the run whose colour its curves are drawn in
    for runs in curves.values():
        for run in runs:
            if drawn_by.get(run) != run:
                drawn_by[run] = runs[0]
    handles: list[Any] = []
    for run in colour:
        if run not in drawn_by:
            continue
        first = drawn_by[run]
        label = run if first == run else f"{run} (same curves as {first})"
        handles.append(Line2D([], [], color=f"C{colour[first] % 10}", linewidth=2, label=label))
    handles += [
        Line2D([], [], color="black", label=name, linestyle=styles[n % len(styles)])  # type: ignore[arg-type]
        for n, name in enumerate(names)
    ]
    return handles


def _mark_interruptions(
    ax_loss: Any,
    runs_metrics: Mapping[str, Iterable[Mapping[str, Any]]],
    *,
    colour: Mapping[str, int],
    x: str,
    continued: Mapping[str, float] | None = None,
) -> list[Any]:
    """A vertical line on the loss panel where a run was really interrupted: at its
    ``interrupt`` rows, and at a ``restore`` that follows none (the process died) unless it
    is where the pilot stopped and the training continued. Returns the lines drawn."""
    lines = []
    for run, records in runs_metrics.items():
        stopped_at: set[float] = set()
        for r in records:
            kind, at = str(r.get("kind")), r.get(x)
            if kind not in ("interrupt", "restore") or not isinstance(at, int | float):
                continue
            if kind == "interrupt":
                stopped_at.add(float(at))
                what = "interrupted"
            elif float(at) in stopped_at or float(at) == (continued or {}).get(run):
                continue  # resumed where the interruption (or the pilot) is already drawn
            else:
                what = "resumed after its process ended"
            lines.append(
                ax_loss.axvline(
                    float(at),
                    color=f"C{colour[run] % 10}",
                    linestyle=(0, (1, 3)) if what == "interrupted" else "-.",
                    linewidth=1,
                    label=f"{run} {what} at {x} {at}",
                )
            )
    return lines


def _mark_decision(
    ax: Any, *, metric: str, threshold: float | None, control_final: float | None, split: str | None
) -> list[Any]:
    """The threshold and the control's final value on ``split``, as horizontal lines; the
    lines drawn."""
    lines = []
    if threshold is not None:
        lines.append(
            ax.axhline(
                threshold,
                color="black",
                linestyle="--",
                linewidth=1,
                label=f"threshold {say_exact(threshold)}",
            )
        )
    if control_final is not None:
        lines.append(
            ax.axhline(
                control_final,
                color="C0",
                linestyle=":",
                linewidth=1.2,
                label=f"control final {metric} on {split}: {say_number(control_final)}",
            )
        )
    return lines


def _panel(name: str, *, ax_loss: Any, ax_metric: Any) -> Any:
    """The loss panel for a series whose field has "loss" in its name, else the metric one."""
    return ax_loss if "loss" in name.split(" ")[-1] else ax_metric


def plot_confusion(
    matrix: Iterable[Iterable[int]],
    labels: Iterable[Any],
    path: str | Path,
    *,
    title: str = "confusion matrix",
) -> Path:
    """Write ``draw_confusion``'s figure as a PNG; returns the path."""
    return save(draw_confusion(matrix, labels, title=title), path)


def draw_confusion(
    matrix: Iterable[Iterable[int]], labels: Iterable[Any], *, title: str = "confusion matrix"
) -> Figure:
    """Confusion matrix as a heat map with counts (rows: label, columns: prediction).

    Args:
        matrix: ``matrix[i][j]`` counts label ``labels[i]`` predicted as ``labels[j]``.
        labels: class names, in matrix order.
        title: figure title: the run and the split the predictions are on.

    Returns:
        The figure.
    """
    rows = [list(r) for r in matrix]
    names = [str(v) for v in labels]
    if len(rows) != len(names) or any(len(r) != len(names) for r in rows):
        raise ValueError(f"confusion matrix must be {len(names)}x{len(names)} to match its labels")
    k = len(names)
    side = min(12.0, 2.5 + 0.45 * k)
    fig = new_figure(width=side + 1.0, height=side)
    ax = fig.add_subplot()
    image = ax.imshow(rows, cmap="Blues", vmin=0)
    fig.colorbar(image, ax=ax, shrink=0.8)
    top = max((max(r) for r in rows if r), default=0)
    for i in range(k):
        for j in range(k):
            v = rows[i][j]
            if v:
                ax.text(
                    j,
                    i,
                    str(v),
                    ha="center",
                    va="center",
                    fontsize=8,
                    color="white" if v > top / 2 else "black",
                )
    ax.set_xticks(range(k), names, fontsize=8)
    ax.set_yticks(range(k), names, fontsize=8)
    ax.set_xlabel("prediction")
    ax.set_ylabel("label")
    ax.set_title(title, fontsize=10)
    return fig


def plot_attribution(att: Mapping[str, Any], path: str | Path) -> Path:
    """Write ``draw_attribution``'s figure as a PNG; returns the path."""
    return save(draw_attribution(att), path)


def draw_attribution(att: Mapping[str, Any]) -> Figure:
    """One bar per machine: its lot window split by cause (left), and the same without the
    idle time and the human preparation, so the machine's working causes can be read (right)."""
    machines = list(att["machines"])
    causes = [str(c) for c in att["causes"]]
    fig = new_figure(width=13.0, height=2.6 + 0.5 * len(machines))
    axes = fig.subplots(1, 2, sharey=True)
    from matplotlib import colormaps

    palette = colormaps["tab20"]
    colors: dict[str, Any] = {c: palette(i % 20) for i, c in enumerate(causes)}
    colors["idle"] = "#dddddd"
    labels = [f"lot {m['lot']} ({', '.join(m['hosts']) or 'unused'})"[:40] for m in machines]
    for ax, skip, title in (
        (axes[0], (), "share of the lot window"),
        (axes[1], ("idle", "human preparation"), "share of the machine's working time"),
    ):
        for y, m in enumerate(machines):
            shown = {c: m["seconds"][c] for c in causes if c not in skip}
            total = sum(shown.values()) or 1.0
            left = 0.0
            for c, s in shown.items():
                ax.barh(
                    y, 100.0 * s / total, left=left, color=colors[c], label=c if y == 0 else None
                )
                left += 100.0 * s / total
        ax.set_yticks(range(len(machines)), labels)
        ax.set_xlim(0, 100)
        ax.set_xlabel(f"% ({title})")
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small")
    fig.tight_layout()
    return fig
