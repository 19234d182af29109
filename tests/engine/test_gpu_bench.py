"""``bench/gpu.py --smoke`` runs on the CPU in seconds: both parts write their figures, and the
profile's difference rows sum to the difference of the step times (every millisecond placed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.process
def test_the_gpu_bench_smoke_run_places_every_millisecond(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu.py"), "--smoke", "--out-dir", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (found,) = tmp_path.glob("gpu-*-smoke.json")
    results = json.loads(found.read_text())
    (round_,) = results["throughput"]["rounds"]
    assert round_["campaign_train_s"] > 0 and round_["bare_fastest_s"] > 0
    assert round_["campaign_final_save_s"] is not None and round_["load_avg"]
    prof = results["profile"]
    for kind in ("fastest", "same-loader"):
        gap = prof["campaign"]["wall_ms"] - prof[kind]["wall_ms"]
        placed = sum(r["ms"] for r in prof[f"difference_vs_{kind}"])
        assert placed == pytest.approx(gap, abs=1e-6)
    text = found.with_suffix(".md").read_text()
    assert "Where the campaign's" in text and "vs same-loader" in text
