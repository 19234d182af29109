"""The close's figures are valid PNGs that matplotlib reads back."""

from __future__ import annotations

from pathlib import Path

import matplotlib.image as mpimg
import pytest

from gpucampaign.close.figures import plot_confusion, plot_curves

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _valid_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    image = mpimg.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


def test_curves(tmp_path: Path):
    runs = {
        "control": [
            {"step": s, "loss": 2.0 / s, "val_accuracy": 0.5 + s / 100} for s in range(1, 11)
        ],
        "wide": [{"step": s, "loss": 1.8 / s, "train_loss": 1.9 / s} for s in range(1, 11)],
    }
    _valid_png(plot_curves(runs, tmp_path / "figures" / "curves.png"))


def test_curves_from_metrics_jsonl_rows(tmp_path: Path):
    from gpucampaign.close.figures import _series

    rows = [
        {"kind": "train", "step": 1, "loss": 2.3, "lr": 0.1, "step_s": 0.004},
        {"kind": "eval", "split": "val", "step": 1, "loss": 2.1, "accuracy": 0.3, "eval_s": 0.01},
        {"kind": "checkpoint", "step": 1, "save_s": 0.02, "bytes": 100},
        {"kind": "train", "step": 2, "loss": float("nan"), "lr": 0.1, "step_s": 0.004},
    ]
    assert _series(rows, x="step") == {
        "train loss": [(1.0, 2.3)],
        "val loss": [(1.0, 2.1)],
        "val accuracy": [(1.0, 0.3)],
    }
    _valid_png(plot_curves({"control": rows}, tmp_path / "rows.png"))


def test_curves_without_records_still_draw(tmp_path: Path):
    _valid_png(plot_curves({"control": []}, tmp_path / "empty.png"))


def test_confusion(tmp_path: Path):
    matrix = [[5, 1, 0], [0, 6, 0], [2, 0, 4]]
    _valid_png(plot_confusion(matrix, ["0", "1", "2"], tmp_path / "confusion.png", title="wide"))
    with pytest.raises(ValueError, match="3x3"):
        plot_confusion([[1, 2]], ["0", "1", "2"], tmp_path / "bad.png")


# --- what the figures show, read back from the matplotlib objects ---------------------------
def _rows(loss: float, acc: float) -> list[dict]:
    return [{"kind": "train", "step": s, "loss": loss / s} for s in (1, 2, 3)] + [
        {"kind": "eval", "split": "val", "step": 3, "loss": loss / 2, "accuracy": acc}
    ]


def test_curves_carry_the_threshold_the_control_and_name_their_splits():
    from gpucampaign.close.figures import draw_curves

    runs = {"control": _rows(2.0, 0.91), "copy": _rows(2.0, 0.91), "wide": _rows(1.5, 0.97)}
    fig = draw_curves(runs, metric="accuracy", threshold=0.95, control_final=0.91, split="val")
    ax_loss, ax_metric = fig.axes[:2]
    assert ax_loss.get_title() == "loss: train, val" and ax_metric.get_title() == "metrics: val"
    # An identical curve is drawn once; one legend outside the panels names each run once,
    # each series once and each mark.
    assert ax_metric.get_legend() is None and ax_loss.get_legend() is None
    (legend,) = fig.legends
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels == [
        "control",
        "copy (same curves as control)",
        "wide",
        "train loss",
        "val loss",
        "val accuracy",
        "threshold 0.95",
        "control final accuracy on val: 0.91",
    ]
    assert [line.get_label() for line in ax_metric.get_lines()][:2] == [
        "control = copy: val accuracy",
        "wide: val accuracy",
    ]
    assert len(ax_loss.get_lines()) == 4  # train and val loss of two distinct curves
    flat = {line.get_label(): list(line.get_ydata()) for line in ax_metric.get_lines()}
    assert flat["threshold 0.95"] == [0.95, 0.95]
    assert flat["control final accuracy on val: 0.91"] == [0.91, 0.91]
    assert list(ax_metric.get_lines()[1].get_xydata()[0]) == [3.0, 0.97]
    low, high = ax_metric.get_ylim()
    assert low < 0.91 and high > 0.97  # both lines and every curve in view
    # A minimized loss: the lines go on the loss panel.
    fig = draw_curves(runs, metric="loss", threshold=0.5, control_final=1.0, split="val")
    assert "threshold 0.5" in [line.get_label() for line in fig.axes[0].get_lines()]


def test_the_calendar_draws_actual_seconds_on_their_own_scale():
    from gpucampaign.close.figures import draw_calendar
    from gpucampaign.config import parse_spec
    from gpucampaign.plan import calendar

    spec = parse_spec(
        {
            "name": "t",
            "packages": [{"gpu": "rtx4090", "days": 3}],
            "calendar": [
                {"name": "prep", "kind": "human", "hours": 2},
                {
                    "name": "control",
                    "kind": "machine",
                    "resource": "gpu",
                    "hours": 3,
                    "after": ["prep"],
                    "run": "control",
                },
            ],
        }
    )
    plan = calendar.plan(spec)
    # 0.46 s of training, two hours into the plan: invisible on an axis of hours.
    actual = [
        {"name": "control", "start_hours": 2.0, "end_hours": 2.0 + 0.46 / 3600},
        {"name": "close", "start_hours": 2.0 + 1 / 3600, "end_hours": 2.0 + 3 / 3600},
    ]
    fig = draw_calendar(plan, actual=actual)
    planned, observed = fig.axes
    assert planned.get_title().startswith("planned: t, span 5 h")
    assert planned.get_xlim()[1] >= 5.0  # hours
    assert observed.get_xlabel() == "s from the first observed interval"
    assert observed.get_xlim() == pytest.approx((0, 3 * 1.05))
    widths = [p.get_width() for p in observed.patches]
    assert widths == pytest.approx([0.46, 2.0])  # seconds: visible bars
    assert [t.get_text() for t in observed.get_yticklabels()] == [
        "lot 1 / gpu0",
        "human0",
        "unplanned",
    ]
    # The planned panel's legend lists what it draws, never an "actual" it does not.
    assert "actual" not in [t.get_text() for t in planned.get_legend().get_texts()]
    assert len(draw_calendar(plan).axes) == 1  # no actual: the plan alone


def test_the_confusion_matrix_names_its_run_and_split(tmp_path: Path, monkeypatch):
    from gpucampaign.close import closing, figures

    fig = figures.draw_confusion([[5, 1], [0, 6]], ["a", "b"], title="x on test")
    ax = fig.axes[0]
    assert ax.get_title() == "x on test" and ax.images[0].get_array().tolist() == [[5, 1], [0, 6]]
    drawn = {}
    monkeypatch.setattr(figures, "plot_confusion", lambda *a, **kw: drawn.update(kw))
    analyses = {"wide": {"confusion": [[1, 0], [0, 1]], "classes": ["a", "b"]}}
    closing.draw_run_figures(tmp_path, metrics={}, analyses=analyses, shown="wide", split="test")
    assert drawn["title"] == "confusion matrix of 'wide' on test"


def test_curves_mark_where_a_run_was_interrupted_and_resumed():
    from gpucampaign.close.figures import draw_curves

    rows = _rows(2.0, 0.9) + [
        {"kind": "interrupt", "step": 2, "reason": "SIGTERM"},
        {"kind": "restore", "step": 2, "restore_s": 0.1, "refused": []},
    ]
    ax_loss = draw_curves({"control": rows}).axes[0]
    marks = {line.get_label(): list(line.get_xdata()) for line in ax_loss.get_lines()}
    assert marks["control interrupted at step 2"] == [2.0, 2.0]
    assert not any("resumed" in label for label in marks)  # one mark for one interruption


def test_only_real_interruptions_are_marked_not_the_pilots_continuation():
    """Every run resumes from its pilot's checkpoint (step 10 of 20): that is the plan, not
    an interruption. Only the control's SIGTERM and the killed process of 'wide' are marked."""
    from gpucampaign.close.figures import draw_curves

    def run(*extra: dict, loss: float = 2.0) -> list[dict]:
        rows = [{"kind": "train", "step": s, "loss": loss / s} for s in range(1, 21)]
        rows.insert(10, {"kind": "restore", "step": 10, "restore_s": 0.1, "refused": []})
        return rows + list(extra)

    runs = {
        "control": run(
            {"kind": "interrupt", "step": 14, "reason": "SIGTERM"},
            {"kind": "restore", "step": 14, "restore_s": 0.1, "refused": []},
        ),
        "wide": run({"kind": "restore", "step": 16, "restore_s": 0.1, "refused": []}, loss=1.5),
        **{f"v{n}": run() for n in range(14)},
    }
    fig = draw_curves(runs, continued={name: 10.0 for name in runs})
    marks = [
        line.get_label()
        for line in fig.axes[0].get_lines()
        if line.get_xdata()[0] in (10.0, 14.0, 16.0) and len(line.get_xdata()) == 2
    ]
    assert marks == [
        "control interrupted at step 14",
        "wide resumed after its process ended at step 16",
    ]
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert len(labels) == len(set(labels))  # distinct entries
    assert labels[:2] == ["control", "wide"] and "v0 (same curves as control)" in labels
    # The legend stands right of both panels, covering neither.
    fig.canvas.draw()
    box = fig.legends[0].get_window_extent()
    assert all(box.x0 >= ax.get_window_extent().x1 for ax in fig.axes)


def test_time_no_step_stands_for_is_named_by_its_run():
    """A seed run trained without a calendar step of its own sits in the actual panel's
    "unplanned" row named by its run, not by its phase ("train")."""
    from datetime import UTC, datetime, timedelta

    from gpucampaign.close.forecast import actual_intervals
    from gpucampaign.folder.records import TimelineRow

    t0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
    rows = [
        TimelineRow.between(
            None,
            phase="train",
            run=run,
            start=t0 + timedelta(minutes=n),
            end=t0 + timedelta(minutes=n + 1),
        )
        for n, run in enumerate(["wider.s1", "wider.s2"])
    ]
    assert [a["name"] for a in actual_intervals(rows)] == ["train wider.s1", "train wider.s2"]
