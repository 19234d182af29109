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
    # An identical curve is drawn once, its legend naming both runs.
    labels = [t.get_text() for t in ax_metric.get_legend().get_texts()]
    assert labels == [
        "control = copy: val accuracy",
        "wide: val accuracy",
        "threshold 0.95",
        "control final accuracy on val: 0.91",
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
    from gpucampaign.plan import calendar
    from gpucampaign.spec import parse_spec

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
    assert [t.get_text() for t in observed.get_yticklabels()] == ["gpu0", "human0", "unplanned"]
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
    assert marks["control resumed at step 2"] == [2.0, 2.0]
