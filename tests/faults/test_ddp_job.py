"""The job a data-parallel run hands to its ranks, attacked (``engine/launch.py``,
``engine/jobfile.py``, ``engine/worker.py``): no pickle anywhere, a private JSON job outside the
output folder and gone after the run, a replaced job refused, no link in the run folder
followed; and a stop the ranks decided ends ``campaign run`` with exit 3 and its message.

Each two-process run is a pilot of 4 steps on CPU with ``gloo`` (``tests/engine/
test_distributed.py`` holds the bit-identical restarts)."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch.distributed.launcher.api as torch_launcher

import gpucampaign.engine.launch as launch_mod
from gpucampaign.core.errors import FolderError
from gpucampaign.engine.launch import RankFailed
from tests.engine.test_distributed import SLOW_SITE, children_of, folder, train, write_campaign
from tests.flows.test_campaign import tiny_campaign
from tests.helpers import digits_file  # noqa: F401  (fixture)

PICKLE_MAGIC = tuple(bytes([0x80, p]) for p in range(2, 6))


class _Marker:
    """Unpickled, it creates the folder ``path``: proof that the file ran as code."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (self.path,))


def _snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def _wrap_launcher(monkeypatch: pytest.MonkeyPatch, before: Any) -> None:
    """Call ``before(args)`` with the ranks' command line just before the agent starts them."""
    real = torch_launcher.elastic_launch

    def wrapped(config: Any, entrypoint: Any) -> Any:
        start = real(config, entrypoint)

        def run(*args: str) -> Any:
            before(args)
            return start(*args)

        return run

    monkeypatch.setattr(torch_launcher, "elastic_launch", wrapped)
    if hasattr(launch_mod, "elastic_launch"):
        monkeypatch.setattr(launch_mod, "elastic_launch", wrapped)


pytestmark = [pytest.mark.process, pytest.mark.slow, pytest.mark.timeout(600)]


def test_the_ranks_job_is_private_json_outside_the_folder_and_gone_after(
    tmp_path: Path,
    digits_file,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = write_campaign(tmp_path, digits_file)
    seen: dict[str, Any] = {}

    def look(args: tuple[str, ...]) -> None:
        job = Path(args[2])
        seen.update(
            job=job,
            mode=job.stat().st_mode & 0o777,
            dir_mode=job.parent.stat().st_mode & 0o777,
            data=json.loads(job.read_bytes()),
            size=job.stat().st_size,
        )

    _wrap_launcher(monkeypatch, look)
    res = train(spec, tmp_path, stop_after_steps=4)
    assert res.steps_done == 4
    out = tmp_path / "out"
    job: Path = seen["job"]
    assert not job.is_relative_to(out) and not job.is_relative_to(tmp_path)
    assert seen["mode"] == 0o600 and seen["dir_mode"] == 0o700
    corpus = tmp_path / "data" / "digits.csv"
    assert seen["data"]["corpus"]["sha256"] == spec.corpus.sha256  # type: ignore[union-attr]
    assert seen["size"] < corpus.stat().st_size / 4  # a reference to the corpus, not a copy
    assert not job.exists() and not job.parent.exists()  # removed after the run
    for p in out.rglob("*"):
        if p.is_file():
            assert p.suffix != ".pkl", p
            assert p.read_bytes()[:2] not in PICKLE_MAGIC, f"{p} is a pickle"
    assert not (folder(spec, tmp_path) / ".ddp").exists()


def test_a_replaced_job_file_is_refused_and_never_runs(
    tmp_path: Path,
    digits_file,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    faults,
) -> None:
    spec = write_campaign(tmp_path, digits_file)
    marker = tmp_path / "ran"

    def replace(args: tuple[str, ...]) -> None:
        Path(args[2]).write_bytes(pickle.dumps(_Marker(marker)))

    _wrap_launcher(monkeypatch, replace)
    with pytest.raises(RankFailed) as failed:
        train(spec, tmp_path, stop_after_steps=4)
    if marker.exists():
        faults.add("code_ran")
    assert not marker.exists(), "the replaced job file ran as code in a rank"
    faults.add("code_runs_refused")
    assert "was replaced after the launch: the ranks refused it" in str(failed.value)
    assert not list((tmp_path / "out").rglob("LATEST"))  # nothing trained


def test_a_pickle_planted_where_the_job_was_is_never_read(
    tmp_path: Path,
    digits_file,  # noqa: F811
    faults,
) -> None:
    spec = write_campaign(tmp_path, digits_file)
    marker = tmp_path / "ran"
    planted = folder(spec, tmp_path) / ".ddp"
    planted.mkdir(parents=True)
    (planted / "job.pkl").write_bytes(pickle.dumps(_Marker(marker)))
    res = train(spec, tmp_path, stop_after_steps=4)
    assert res.steps_done == 4
    if marker.exists():
        faults.add("code_ran")
    assert not marker.exists(), "the planted pickle ran as code"
    faults.add("code_runs_refused")


def test_a_ddp_link_out_of_the_run_folder_is_never_followed(
    tmp_path: Path,
    digits_file,  # noqa: F811
    faults,
) -> None:
    spec = write_campaign(tmp_path, digits_file)
    outside = tmp_path / "outside"
    outside.mkdir()
    for name in ("job.pkl", "outcome.json", "stop", "keep.txt"):
        (outside / name).write_text(f"the user's {name}\n")
    before = _snapshot(outside)
    run = folder(spec, tmp_path)
    run.mkdir(parents=True)
    (run / ".ddp").symlink_to(outside, target_is_directory=True)
    res = train(spec, tmp_path, stop_after_steps=4)
    assert res.steps_done == 4
    assert _snapshot(outside) == before, "the launcher wrote or removed through the link"
    faults.add("links_refused")


def test_a_ranks_folder_linked_out_is_refused_before_any_rank_starts(
    tmp_path: Path,
    digits_file,  # noqa: F811
    faults,
) -> None:
    spec = write_campaign(tmp_path, digits_file)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("the user's file\n")
    before = _snapshot(outside)
    run = folder(spec, tmp_path)
    run.mkdir(parents=True)
    (run / ".ranks").symlink_to(outside, target_is_directory=True)
    with pytest.raises(FolderError, match="is a link") as err:
        train(spec, tmp_path, stop_after_steps=4)
    assert ".ranks" in str(err.value) and "remove the link" in str(err.value)
    assert _snapshot(outside) == before and sorted(os.listdir(outside)) == ["keep.txt"]
    faults.add("links_refused")


def _rank_pids(parent: int) -> dict[int, int]:
    """The ranks (``RANK`` -> pid) among the live children of ``parent``."""
    ranks = {}
    for pid in children_of(parent):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"gpucampaign.engine.worker" in cmd:
            rank = next((e[5:] for e in env if e.startswith(b"RANK=")), None)
            if rank is not None:
                ranks[int(rank)] = pid
    return ranks


def test_a_stop_the_ranks_decided_ends_campaign_run_with_exit_3_and_its_message(
    tmp_path: Path,
) -> None:
    """A SIGTERM that reaches one rank only (not `campaign run`): every rank saves and stops,
    and `campaign run` says so with exit 3, not exit 0 with no verdict and no report."""

    def edit(data: dict[str, Any]) -> None:
        data["control"].update(gpus=2)
        data["packages"] = [{"gpu": "b200", "days": 3, "price_usd": 900}]
        data["pilot"] = {"steps": 30}

    spec = tiny_campaign(tmp_path, edit=edit)
    out = tmp_path / "out"
    paths = [str(SLOW_SITE), os.environ.get("PYTHONPATH", "")]
    env = {
        **os.environ,
        "GPUCAMPAIGN_TEST_STEP_SLEEP_S": "0.2",
        "PYTHONPATH": os.pathsep.join(paths),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpucampaign.cli", "run", str(spec), "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            ranks = _rank_pids(proc.pid)
            if 1 in ranks and any(out.glob("runs/*/.ranks/1/metrics.jsonl")):
                time.sleep(1.0)  # its first steps: its own signal handlers are in place
                os.kill(ranks[1], signal.SIGTERM)
                break
            time.sleep(0.1)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 3, stdout + stderr
    assert "stopped:" in stderr and "interrupted by" in stderr, stderr[-3000:]
    assert "verdict: none" not in stdout and "report:" not in stdout, stdout
    assert "Traceback" not in stdout + stderr
