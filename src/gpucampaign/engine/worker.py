"""One rank's process of a data-parallel run:
``python -m gpucampaign.engine.worker JOB SHA256``.

It reads where it stands from the environment as ``torchrun`` (its elastic agent) sets it:
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` (which of this node's GPUs it takes), and the
rendezvous ``MASTER_ADDR`` / ``MASTER_PORT`` that ``init_process_group`` reads. So any launcher
that sets them (``launch.launch`` on this machine, ``torchrun`` on other nodes, another engine)
starts it unchanged. ``JOB`` is the launcher's JSON job (``jobfile.py``: no code, no copy of the
corpus), read only when its bytes have the sha256 ``SHA256``. See ``launch.py`` for the design.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as tdist

from gpucampaign.core.errors import InputError
from gpucampaign.core.files import json_bytes
from gpucampaign.core.interrupt import Interrupted, graceful_signals
from gpucampaign.core.stoprules import StopRule
from gpucampaign.engine.devices import pick_device
from gpucampaign.engine.jobfile import HandedJob, JobRefused, build_job, open_job, write_private
from gpucampaign.engine.loop import train_run
from gpucampaign.engine.process_group import DataParallelGroup
from gpucampaign.engine.setup import RunJob

#: Seconds a collective may wait for the other ranks before it fails (a dead or stuck rank);
#: rank 0's evaluations run while the others wait, so it is generous.
DEFAULT_TIMEOUT_S = 1800.0
TIMEOUT_ENV = "GPUCAMPAIGN_DIST_TIMEOUT_S"


def _timeout_s() -> float:
    raw = os.environ.get(TIMEOUT_ENV)
    return float(raw) if raw else DEFAULT_TIMEOUT_S


@dataclass(frozen=True, kw_only=True)
class RankEnv:
    """Where this process stands in its run, as the launcher's environment says."""

    rank: int
    world_size: int
    local_rank: int

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> RankEnv:
        """``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` (torchrun's; ``LOCAL_RANK`` defaults
        to ``RANK``, one node)."""
        env = os.environ if environ is None else environ
        rank = int(env["RANK"])
        return cls(
            rank=rank,
            world_size=int(env["WORLD_SIZE"]),
            local_rank=int(env.get("LOCAL_RANK", rank)),
        )


def run_rank(job_path: Path, *, sha256: str) -> int:
    """One rank: join the group, train the run's rank, write rank 0's outcome; the exit code.

    The job is read only when its bytes have the ``sha256`` the launcher handed over: a
    replaced file is refused (exit 2) before anything of it is used. Every outcome every rank
    agrees on (a result, a stop rule, an interruption, a refusal) ends at a barrier; an
    unexpected error exits at once with 1, and the agent ends the others.
    """
    try:
        data = open_job(job_path, sha256=sha256)
    except JobRefused as exc:
        sys.stderr.write(f"{exc}\n")
        return 2
    env = RankEnv.from_environ()
    try:
        handed = build_job(data)
    except (StopRule, InputError) as exc:  # the same on every rank: none joins the group
        if env.rank == 0:
            write_private(Path(data["outcome_file"]), json_bytes(_outcome_of(exc)))
        return 0
    job, run = handed.job, handed.job.run
    if env.world_size != run.size.processes:
        raise SystemExit(
            f"{run.run_id}: launched with {env.world_size} processes, the run has "
            f"{run.size.processes}"
        )
    group = _join(handed, env)
    _end_with_the_launcher()
    with graceful_signals():
        outcome = _train_rank(job, group, outcome_file=handed.outcome_file)
        if env.rank == 0:
            write_private(handed.outcome_file, json_bytes(outcome))
        group.barrier()  # every rank is done before any exits
    tdist.destroy_process_group()
    return 0


def _join(handed: HandedJob, env: RankEnv) -> DataParallelGroup:
    """Join the process group (``nccl`` on CUDA, ``gloo`` on CPU, with a timeout) on this
    rank's device: the lane's GPU plus its local rank."""
    job = handed.job
    device = pick_device(job.run.config.device, lane=job.lane + env.local_rank)
    timeout = timedelta(seconds=_timeout_s())
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    tdist.init_process_group(backend=backend, timeout=timeout)
    control = tdist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else None
    return DataParallelGroup(
        rank=env.rank,
        world_size=env.world_size,
        local_rank=env.local_rank,
        device=device,
        control=control,
        stop_file=handed.stop_file,
    )


def _train_rank(job: RunJob, group: DataParallelGroup, *, outcome_file: Path) -> dict[str, Any]:
    """Train this rank; the outcome every rank agrees on (an unexpected error exits here)."""
    try:
        res = train_run(
            job.spec,
            run=job.run,
            corpus=job.corpus,
            store=job.store,
            run_folder=job.run_folder.at_rank(group.rank),
            stop_after_steps=job.stop_after_steps,
            checkpoint_every=job.checkpoint_every,
            lane=job.lane,
            dist=group,
        )
        return {"kind": "result", "result": res.to_dict()}
    except (StopRule, Interrupted, InputError) as exc:
        return _outcome_of(exc)
    except Exception as exc:
        traceback.print_exc()
        if group.rank == 0:
            error = {"kind": "error", "error": f"{type(exc).__name__}: {exc}"}
            write_private(outcome_file, json_bytes(error))
        sys.stderr.flush()
        os._exit(1)  # the others may wait in a collective: the agent ends them


def _outcome_of(exc: StopRule | Interrupted | InputError) -> dict[str, Any]:
    """Rank 0's outcome for an end every rank agrees on (``launch`` raises it again)."""
    if isinstance(exc, StopRule):
        return {"kind": "stop", **exc.to_record()}
    if isinstance(exc, Interrupted):
        return {"kind": "interrupted", "reason": exc.reason, "step": exc.step}
    return {
        "kind": "spec_error",
        "message": str(exc),
        "field": exc.field,
        "error_class": type(exc).__name__,
    }


def _end_with_the_launcher(every_s: float = 1.0) -> None:
    """End this rank when the launching process is gone (SIGKILLed, say): the agent that would
    have ended it is gone too, and a rank must not train on alone. The next start resumes
    from LATEST; a save cut short never moved it."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(every_s)
            if os.getppid() != parent:
                sys.stderr.write("the launching process is gone: this rank ends\n")
                os._exit(1)

    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()


if __name__ == "__main__":
    sys.exit(run_rank(Path(sys.argv[1]), sha256=sys.argv[2]))
