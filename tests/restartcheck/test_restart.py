"""Restart verification in new processes, the scheduled check of an existing output, the CLI."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from typer.testing import CliRunner

from gpucampaign.cli import app
from gpucampaign.core.stoprules import NoUsableRestart
from gpucampaign.restartcheck.check import default_steps, verify_restart
from gpucampaign.restartcheck.scheduled import verify_checkpoint_resume
from gpucampaign.restartcheck.target import RestartTarget
from gpucampaign.storage import LocalStore
from tests.helpers import digits_file, make_spec, run, run_dir  # noqa: F401


@pytest.mark.process
def test_resume_mid_epoch_in_a_new_process_is_bit_identical(tmp_path, digits_file):  # noqa: F811
    """bf16 autocast, cosine schedule and dropout; interrupted mid-epoch in its own process."""
    spec = make_spec(
        tmp_path,
        digits_file,
        control={"precision": "bf16", "scheduler": "cosine", "dropout": 0.1, "epochs": 3},
    )
    report = verify_restart(
        spec,
        run=spec.resolve_run("control"),
        corpus_path=tmp_path / "data" / "digits.csv",
        workdir=tmp_path / "work",
    )
    assert (
        report.identical
        and report.max_abs_diff == 0.0
        and report.atol == 0.0
        and not report.mismatches
    )
    assert (report.k, report.n) == (15, 22) and report.k_mid_epoch  # 10 steps per epoch
    assert report.compared_steps == 22 and report.threads == 1 and report.device == "cpu"
    assert {"params", "optimizer", "scheduler", "rng", "cursor"} <= set(report.compared)
    assert report.save_s > 0 and report.restore_s > 0 and report.total_s > report.save_s


def test_default_steps():
    n, k = default_steps(planned_steps=400, steps_per_epoch=20)
    assert k % 20 and 20 < k < 40 < n  # mid-epoch, then past an epoch boundary
    n, k = default_steps(planned_steps=10, steps_per_epoch=10)
    assert 0 < k < n == 10


def _finished_run(tmp_path, digits_file):  # noqa: F811
    spec = make_spec(tmp_path, digits_file, control={"dropout": 0.1}, checkpoint={"keep": 2})
    res = run(spec, tmp_path, checkpoint_every=7)  # saves at 7, 14, 20: keeps 14 and 20
    assert res.completed
    return spec


@pytest.mark.process
def test_scheduled_check_resumes_the_previous_kept_checkpoint(tmp_path, digits_file):  # noqa: F811
    spec = _finished_run(tmp_path, digits_file)
    target = RestartTarget(
        spec=spec,
        run=spec.resolve_run("control"),
        corpus_path=tmp_path / "data" / "digits.csv",
        store=LocalStore(tmp_path / "out" / "checkpoints"),
        run_dir=run_dir(spec, tmp_path),
        workdir=tmp_path / "work",
    )
    report = verify_checkpoint_resume(target, m_steps=50)
    assert report.identical and report.mode == "checkpoint"
    assert (report.k, report.n, report.compared_steps) == (14, 20, 6)
    assert "params" in report.compared  # it reached the end: final weights compared with model/


@pytest.mark.process
def test_scheduled_check_detects_a_run_it_cannot_reproduce(tmp_path, digits_file):  # noqa: F811
    spec = _finished_run(tmp_path, digits_file)
    metrics = run_dir(spec, tmp_path) / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    for r in rows:
        if r["kind"] == "train" and r["step"] == 16:
            r["loss"] = r["loss"] + 1e-7
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = dict(
        spec=spec,
        run=spec.resolve_run("control"),
        corpus_path=tmp_path / "data" / "digits.csv",
        store=LocalStore(tmp_path / "out" / "checkpoints"),
        run_dir=run_dir(spec, tmp_path),
    )
    with pytest.raises(NoUsableRestart, match=r"loss\[16\]") as exc:
        verify_checkpoint_resume(RestartTarget(workdir=tmp_path / "w1", **args), m_steps=3)
    assert exc.value.step == 14
    report = verify_checkpoint_resume(
        RestartTarget(workdir=tmp_path / "w2", **args), m_steps=3, check=False
    )
    assert not report.identical and report.max_abs_diff > 0


def test_scheduled_check_without_checkpoints(tmp_path, digits_file):  # noqa: F811
    spec = make_spec(tmp_path, digits_file)
    with pytest.raises(NoUsableRestart, match="no usable checkpoint"):
        verify_checkpoint_resume(
            RestartTarget(
                spec=spec,
                run=spec.resolve_run("control"),
                corpus_path=tmp_path / "data" / "digits.csv",
                store=LocalStore(tmp_path / "empty"),
                run_dir=tmp_path,
                workdir=tmp_path / "w",
            )
        )


@pytest.mark.process
def test_cli_init_and_restart_check(tmp_path):
    runner = CliRunner()
    target = tmp_path / "camp"
    res = runner.invoke(app, ["init", str(target)])
    assert res.exit_code == 0, res.output
    assert (target / "campaign.yaml").is_file() and (target / "data" / "digits.csv").is_file()
    again = runner.invoke(app, ["init", str(target)])
    assert again.exit_code == 2 and "refusing to overwrite" in again.output
    res = runner.invoke(
        app,
        [
            "restart-check",
            str(target / "campaign.yaml"),
            "--run",
            "short",
            "--json",
            "--steps",
            "12",
            "--at",
            "5",
        ],
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["identical"] is True and doc["compared_steps"] == 12 and doc["max_abs_diff"] == 0.0
    assert list(doc)[:5] == ["identical", "compared_steps", "max_abs_diff", "save_s", "restore_s"]
    bad = runner.invoke(app, ["restart-check", str(target / "campaign.yaml"), "--run", "nope"])
    assert bad.exit_code == 2
    shutil.rmtree(target / "data")
    gone = runner.invoke(app, ["restart-check", str(target / "campaign.yaml")])
    assert gone.exit_code == 3 and "missing" in gone.output


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_restart_on_gpu_within_the_recorded_tolerance(tmp_path, digits_file):  # noqa: F811
    spec = make_spec(
        tmp_path, digits_file, control={"precision": "bf16", "dropout": 0.1, "epochs": 3}
    )
    report = verify_restart(
        spec,
        run=spec.resolve_run("control"),
        corpus_path=tmp_path / "data" / "digits.csv",
        workdir=tmp_path / "work",
        check=False,
    )
    assert report.device == "cuda" and report.atol > 0
    assert report.identical, report.mismatches
