"""Data-parallel runs (``gpus: 2``) on CPU with ``gloo``: the run ID, the shards, and the
exact restart and the faults across ranks (``engine/launch.py``: the launcher,
``engine/worker.py``: one rank's process, ``engine/process_group.py``: the ranks' hooks).

The multi-process tests share one uninterrupted 2-process run (20 steps, a save every 4) and
compare every other run's final parameters and per-step losses (rank 0's and rank 1's) with it
bit for bit.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from gpucampaign.checkpoint.manager import CheckpointManager
from gpucampaign.config import CampaignSpec, RunConfig, SpecError, parse_spec
from gpucampaign.core.stoprules import NonFiniteLoss
from gpucampaign.data.corpus import load_corpus
from gpucampaign.engine.loop import train_run
from gpucampaign.engine.parts import RankShard
from gpucampaign.engine.process_group import OneProcess
from gpucampaign.folder.layout import RunFolder
from gpucampaign.storage import LocalStore
from tests.helpers import digits_file, train_losses  # noqa: F401  (fixture)

REPO = Path(__file__).resolve().parents[2]
SLOW_SITE = REPO / "tests" / "helpers" / "slowsteps"
CONTROL = {
    "recipe": "mlp",
    "hidden": [16],
    "batch_size": 128,
    "epochs": 2,
    "lr": 0.01,
    "threads": 1,
    "gpus": 2,
}


def write_campaign(base: Path, digits: tuple[Path, str], **control: Any) -> CampaignSpec:
    """``base/spec.json`` (a 2-process control, a save every 4 steps) and its corpus."""
    src, sha = digits
    (base / "data").mkdir(parents=True, exist_ok=True)
    (base / "data" / "digits.csv").write_bytes(src.read_bytes())
    data = {
        "name": "ddp",
        "packages": [{"gpu": "b200", "days": 3}],
        "calendar": [{"name": "prep", "kind": "human", "hours": 1}],
        "corpus": {"path": "data/digits.csv", "sha256": sha},
        "control": {**CONTROL, **control},
        "decision_rule": {"metric": "accuracy", "threshold": 0.0},
        "checkpoint": {"every_steps": 4, "keep": 2},
    }
    (base / "spec.json").write_text(json.dumps(data))
    return parse_spec(data)


def folder(spec: CampaignSpec, base: Path) -> Path:
    return base / "out" / "runs" / spec.resolve_run("control").run_id


def train(spec: CampaignSpec, base: Path, **kw: Any):
    assert spec.corpus is not None
    return train_run(
        spec,
        run=spec.resolve_run("control"),
        corpus=load_corpus(base / spec.corpus.path, corpus_spec=spec.corpus),
        store=LocalStore(base / "out" / "checkpoints"),
        run_folder=RunFolder.of(base / "out", spec.resolve_run("control").run_id),
        **kw,
    )


def outcome_of(spec: CampaignSpec, base: Path) -> dict[str, Any]:
    """Final weights and every rank's per-step losses."""
    run = folder(spec, base)
    return {
        "weights": load_file(run / "model" / "model.safetensors"),
        "losses": train_losses(run / "metrics.jsonl"),
        "rank1": train_losses(run / ".ranks" / "1" / "metrics.jsonl"),
    }


def assert_same(got: dict[str, Any], ref: dict[str, Any]) -> None:
    assert got["weights"].keys() == ref["weights"].keys()
    for k in ref["weights"]:
        assert torch.equal(got["weights"][k], ref["weights"][k]), f"parameter {k} differs"
    assert got["losses"] == ref["losses"]
    assert got["rank1"] == ref["rank1"]


def children_of(pid: int) -> list[int]:
    """Live processes whose parent is ``pid`` (read from /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def start_child(base: Path, *, sleep_s: float) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "GPUCAMPAIGN_TEST_STEP_SLEEP_S": str(sleep_s),
        "GPUCAMPAIGN_DIST_TIMEOUT_S": "60",
        "PYTHONPATH": os.pathsep.join(
            [str(SLOW_SITE), str(REPO / "src"), str(REPO), os.environ.get("PYTHONPATH", "")]
        ),
    }
    return subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "helpers" / "ddprun.py"), str(base)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_for_ranks(proc: subprocess.Popen[str], latest: Path, *, timeout_s: float = 120) -> list:
    """The rank processes of the child, once its first checkpoint has committed."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ranks = children_of(proc.pid)
        if latest.exists() and len(ranks) >= 2:
            return ranks
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("no checkpoint within the timeout: " + proc.communicate()[0][-3000:])


# --- no process -----------------------------------------------------------------------------------
def test_gpus_one_keeps_the_run_id_and_two_changes_it() -> None:
    one = RunConfig()
    assert "gpus" not in one.identity() and "gpus" not in one.model_dump()
    assert RunConfig(gpus=2).identity()["gpus"] == 2
    spec = parse_spec(
        {
            "name": "ids",
            "packages": [{"gpu": "b200", "days": 3}],
            "calendar": [{"name": "prep", "kind": "human", "hours": 1}],
            "control": {"recipe": "mlp"},
            "variants": [
                {"name": "same", "changes": {"gpus": 1}},
                {"name": "two", "changes": {"gpus": 2}},
            ],
        }
    )
    ids = {r: spec.resolve_run(r).run_id.split("-")[1] for r in ("control", "same", "two")}
    assert ids["control"] == ids["same"] != ids["two"]
    with pytest.raises(ValueError, match="gpus"):
        RunConfig(gpus=0)


def test_rank_shards_partition_every_global_batch() -> None:
    batches = [list(range(0, 5)), list(range(5, 10)), [10]]
    parts = [list(RankShard(batches, rank=k, world_size=2)) for k in (0, 1)]
    assert len(RankShard(batches, rank=0, world_size=2)) == 3
    for i, batch in enumerate(batches[:2]):
        assert sorted(parts[0][i] + parts[1][i]) == batch
        assert not set(parts[0][i]) & set(parts[1][i])
    assert parts[0][2] == parts[1][2] == [10]  # a batch shorter than the ranks: never empty


def test_a_ranks_live_progress_is_never_sealed() -> None:
    from gpucampaign.folder.layout import is_live_progress

    assert is_live_progress("runs/control-1/.ranks/1/progress.json")
    assert not is_live_progress("runs/control-1/.ranks/1/metrics.jsonl")


def test_the_worker_reads_its_place_from_the_launchers_environment() -> None:
    """The rank side takes what torchrun sets, so another launcher starts it unchanged."""
    from gpucampaign.engine.worker import RankEnv

    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "node2"}
    assert RankEnv.from_environ(env) == RankEnv(rank=5, world_size=8, local_rank=1)
    assert RankEnv.from_environ({"RANK": "1", "WORLD_SIZE": "2"}).local_rank == 1


def test_launching_is_apart_from_the_ranks() -> None:
    """The rank side (worker, process group) imports nothing of the launcher, and a run's
    size is nodes x GPUs per node, read as one process count."""
    import ast

    from gpucampaign.config import RunSize, run_size

    engine = REPO / "src" / "gpucampaign" / "engine"
    for module in ("worker.py", "process_group.py", "setup.py"):
        tree = ast.parse((engine / module).read_text(encoding="utf-8"))
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert "gpucampaign.engine.launch" not in imported, module
    assert run_size(RunConfig(gpus=4)) == RunSize(nodes=1, gpus_per_node=4)
    assert RunSize(nodes=2, gpus_per_node=4).processes == 8
    assert run_size(RunConfig()).processes == 1


# --- 2 processes, gloo --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, digits_file) -> dict[str, Any]:  # noqa: F811
    """The uninterrupted 2-process run."""
    base = tmp_path_factory.mktemp("ddp-reference")
    spec = write_campaign(base, digits_file)
    res = train(spec, base)
    assert res.completed and res.steps_done == 20 and res.resumed_from_step is None
    return outcome_of(spec, base)


@pytest.mark.process
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_stopped_and_resumed_in_fresh_processes_is_bit_identical(
    tmp_path: Path,
    digits_file,  # noqa: F811
    reference: dict[str, Any],
) -> None:
    spec = write_campaign(tmp_path, digits_file)
    pilot = train(spec, tmp_path, stop_after_steps=7)
    assert not pilot.completed and pilot.steps_done == 7
    ck, _ = CheckpointManager(
        LocalStore(tmp_path / "out" / "checkpoints"),
        run_id=spec.resolve_run("control").run_id,
        config_sha256=spec.resolve_run("control").config_sha256,
        keep=2,
    ).load_latest()
    assert ck is not None and ck.step == 7 and ck.meta["world_size"] == 2
    assert len(ck.train_state["rng"]["ranks"]) == 2  # every rank's RNG states
    res = train(spec, tmp_path)
    assert res.completed and res.resumed_from_step == 7
    assert_same(outcome_of(spec, tmp_path), reference)
    assert not list((folder(spec, tmp_path) / ".ranks").glob("*/model"))  # rank 0 writes
    assert not (folder(spec, tmp_path) / ".ddp").exists()  # nothing of the launch in the folder


@pytest.mark.process
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_resume_with_another_number_of_processes_is_refused(
    tmp_path: Path,
    digits_file,  # noqa: F811
) -> None:
    spec = write_campaign(tmp_path, digits_file)
    train(spec, tmp_path, stop_after_steps=4)
    # The same run ID and checkpoints, resumed by one process: refused, naming the field.
    with pytest.raises(SpecError, match="written by 2 process") as err:
        train(spec, tmp_path, dist=OneProcess())
    assert err.value.field == "gpus"


@pytest.mark.process
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_non_finite_loss_stops_every_rank_and_the_launch_leaves_no_folder(
    tmp_path: Path,
    digits_file,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = write_campaign(tmp_path, digits_file, lr=1e30, optimizer="sgd", scheduler="none")
    # The launch's temporary folders (its job file, torch's elastic agent's error files) go
    # where tempfile puts them: here, to be seen. Left to itself, the agent made a
    # /tmp/torchelastic_* folder at every launch and never removed it.
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    with pytest.raises(NonFiniteLoss):
        train(spec, tmp_path)
    assert list(temp.iterdir()) == []
    run = folder(spec, tmp_path)
    # Both ranks stopped before the same step: the same finite losses, then nothing.
    losses = train_losses(run / "metrics.jsonl")
    assert losses == train_losses(run / ".ranks" / "1" / "metrics.jsonl")
    assert all(loss == loss and abs(loss) != float("inf") for _, loss in losses)


@pytest.mark.process
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sigint_to_the_launcher_stops_every_rank_at_one_saved_step(
    tmp_path: Path,
    digits_file,  # noqa: F811
    reference: dict[str, Any],
) -> None:
    spec = write_campaign(tmp_path, digits_file)
    latest = tmp_path / "out" / "checkpoints" / spec.resolve_run("control").run_id / "LATEST"
    proc = start_child(tmp_path, sleep_s=0.15)
    try:
        ranks = wait_for_ranks(proc, latest)
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, output[-3000:]
    assert not any(alive(p) for p in ranks), "a rank outlived the launcher"
    stopped = json.loads(output.strip().splitlines()[-1])["step"]
    run = folder(spec, tmp_path)
    for metrics in (run / "metrics.jsonl", run / ".ranks" / "1" / "metrics.jsonl"):
        rows = [json.loads(r) for r in metrics.read_text().splitlines()]
        assert [r["step"] for r in rows if r["kind"] == "interrupt"] == [stopped]
    assert json.loads(latest.read_text())["step"] == stopped  # saved once, at the stop
    res = train(spec, tmp_path)
    assert res.completed and res.resumed_from_step == stopped
    assert_same(outcome_of(spec, tmp_path), reference)


@pytest.mark.process
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_one_rank_sigkilled_ends_the_others_and_the_run_resumes(
    tmp_path: Path,
    digits_file,  # noqa: F811
    reference: dict[str, Any],
) -> None:
    spec = write_campaign(tmp_path, digits_file)
    latest = tmp_path / "out" / "checkpoints" / spec.resolve_run("control").run_id / "LATEST"
    proc = start_child(tmp_path, sleep_s=0.15)
    try:
        ranks = wait_for_ranks(proc, latest)
        os.kill(max(ranks), signal.SIGKILL)  # one rank, the last started
        output, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 3, output[-3000:]
    assert "rank_failed" in output
    assert not any(alive(p) for p in ranks), "a rank outlived the failure"
    saved = json.loads(latest.read_text())["step"]
    res = train(spec, tmp_path)
    assert res.completed and res.resumed_from_step == saved
    assert_same(outcome_of(spec, tmp_path), reference)


@pytest.mark.process
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_restart_check_of_a_two_process_run_is_identical(
    tmp_path: Path,
    digits_file,  # noqa: F811
) -> None:
    from gpucampaign.restartcheck import verify_restart

    spec = write_campaign(tmp_path, digits_file, dropout=0.1)
    report = verify_restart(
        spec,
        run=spec.resolve_run("control"),
        corpus_path=tmp_path / "data" / "digits.csv",
        workdir=tmp_path / "work",
        n_steps=14,
        k_steps=7,
    )
    assert report.identical and report.max_abs_diff == 0.0 and not report.mismatches
    assert (report.k, report.n) == (7, 14)


@pytest.mark.process
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_stop_requested_in_a_worker_thread_reaches_the_ranks(
    tmp_path: Path,
    digits_file,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Prefect task launches from a thread, where the agent forwards no signal: the stop
    request of the process reaches the ranks through the launcher's stop file."""
    import threading

    from gpucampaign.core.interrupt import Interrupted, clear_stop, request_stop

    spec = write_campaign(tmp_path, digits_file)
    latest = tmp_path / "out" / "checkpoints" / spec.resolve_run("control").run_id / "LATEST"
    monkeypatch.setenv("GPUCAMPAIGN_TEST_STEP_SLEEP_S", "0.15")
    paths = [str(SLOW_SITE), str(REPO / "src"), str(REPO), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))
    caught: list[BaseException] = []

    def launch() -> None:
        try:
            train(spec, tmp_path)
        except BaseException as exc:  # reported to the test thread
            caught.append(exc)

    worker = threading.Thread(target=launch)
    worker.start()
    try:
        deadline = time.monotonic() + 120
        while not latest.exists() and worker.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        request_stop("SIGTERM")
        worker.join(timeout=120)
    finally:
        clear_stop()
    assert not worker.is_alive()
    assert len(caught) == 1 and isinstance(caught[0], Interrupted), caught
    stopped = caught[0].step
    assert stopped is not None and 4 <= stopped < 20
    assert json.loads(latest.read_text())["step"] == stopped
    assert not (folder(spec, tmp_path) / ".ddp").exists()


def test_a_cuda_run_with_more_processes_than_gpus_is_refused(
    tmp_path: Path,
    digits_file,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    spec = write_campaign(tmp_path, digits_file, device="auto")
    with pytest.raises(SpecError, match="1 CUDA device") as err:
        train(spec, tmp_path)
    assert err.value.field == "gpus"
    assert not (folder(spec, tmp_path) / ".ddp").exists()  # nothing was launched


def test_the_report_shows_the_scaling_against_a_one_gpu_run() -> None:
    from gpucampaign.close.report import _scaling_md

    runs = [
        {"run": "control", "gpus": 2, "step_s": 0.05},
        {"run": "one-gpu", "gpus": 1, "step_s": 0.09},
        {"run": "wide", "gpus": 1, "step_s": None},
    ]
    text = "\n".join(_scaling_md({"runs": runs}))
    assert "## Data-parallel scaling" in text
    assert "| control | 2 | 50.0 ms | 1.80x `one-gpu` |" in text
    assert "| one-gpu | 1 | 90.0 ms | reference |" in text
    assert _scaling_md({"runs": runs[1:]}) == []  # no data-parallel run: no section
