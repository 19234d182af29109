"""One rank of a data-parallel run: ``python -m gpucampaign.engine.rank JOB``, started by
``distributed.launch`` through PyTorch's elastic agent (``RANK``, ``WORLD_SIZE`` and the
rendezvous in the environment). See ``distributed.py`` for the design."""

from __future__ import annotations

import os
import pickle
import sys
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as tdist

from gpucampaign.core.files import atomic_write_bytes, json_bytes
from gpucampaign.core.interrupt import Interrupted, graceful_signals
from gpucampaign.core.stoprules import StopRule
from gpucampaign.engine.devices import pick_device
from gpucampaign.engine.distributed import (
    DDP_DIR,
    DEFAULT_TIMEOUT_S,
    OUTCOME_FILE,
    STOP_FILE,
    TIMEOUT_ENV,
    DataParallel,
)
from gpucampaign.engine.loop import train_run
from gpucampaign.engine.ranks import rank_dir
from gpucampaign.spec import ResolvedRun, SpecError


def _timeout_s() -> float:
    raw = os.environ.get(TIMEOUT_ENV)
    return float(raw) if raw else DEFAULT_TIMEOUT_S


def run_rank(job_path: Path) -> int:
    """One rank: join the group, train the run's rank, write rank 0's outcome; the exit code.

    Every outcome every rank agrees on (a result, a stop rule, an interruption, a refusal)
    ends at a barrier; an unexpected error exits at once with 1, and the agent ends the
    others.
    """
    job = pickle.loads(job_path.read_bytes())
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    run: ResolvedRun = job["run"]
    if world != run.config.gpus:
        raise SystemExit(
            f"{run.run_id}: launched with {world} processes, gpus is {run.config.gpus}"
        )
    device = pick_device(run.config.device, lane=job["lane"] + rank)
    timeout = timedelta(seconds=_timeout_s())
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    tdist.init_process_group(backend=backend, timeout=timeout)
    control = tdist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else None
    out_dir = Path(job["out_dir"])
    ranks = DataParallel(
        rank=rank,
        world_size=world,
        device=device,
        control=control,
        stop_file=out_dir / DDP_DIR / STOP_FILE,
    )
    _end_with_the_launcher()
    outcome: dict[str, Any]
    with graceful_signals():
        try:
            res = train_run(
                job["spec"],
                run=run,
                corpus=job["corpus"],
                store=job["store"],
                out_dir=rank_dir(out_dir, rank),
                stop_after_steps=job["stop_after_steps"],
                checkpoint_every=job["checkpoint_every"],
                lane=job["lane"],
                dist=ranks,
            )
            outcome = {"kind": "result", "result": res.to_dict()}
        except StopRule as exc:
            outcome = {"kind": "stop", **exc.to_record()}
        except Interrupted as exc:
            outcome = {"kind": "interrupted", "reason": exc.reason, "step": exc.step}
        except SpecError as exc:
            outcome = {"kind": "spec_error", "message": str(exc), "field": exc.field}
        except Exception as exc:
            traceback.print_exc()
            if rank == 0:
                error = {"kind": "error", "error": f"{type(exc).__name__}: {exc}"}
                atomic_write_bytes(out_dir / DDP_DIR / OUTCOME_FILE, json_bytes(error))
            sys.stderr.flush()
            os._exit(1)  # the others may wait in a collective: the agent ends them
        if rank == 0:
            atomic_write_bytes(out_dir / DDP_DIR / OUTCOME_FILE, json_bytes(outcome))
        ranks.barrier()  # every rank is done before any exits
    tdist.destroy_process_group()
    return 0


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
    sys.exit(run_rank(Path(sys.argv[1])))
