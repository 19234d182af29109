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
