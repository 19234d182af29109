"""The launcher of a data-parallel run on this machine: ``launch`` (a run config with
``gpus: N``, N > 1; ``ResolvedRun.size``: one node of N processes).

``train_run`` hands such a run to ``launch``, which starts PyTorch's own launcher (the
elastic agent behind ``torchrun``: ``elastic_launch`` with a ``LaunchConfig`` of N processes
on this node, a standalone c10d rendezvous on a free port, ``max_restarts=0``). Each process
runs ``python -m gpucampaign.engine.worker JOB SHA256`` (``worker.py``): it reads its rank, world
size and rendezvous from the environment the agent sets (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), so another launcher (``torchrun`` on other
nodes, another engine) starts the same worker unchanged. It joins the process group (``nccl``
on CUDA, ``gloo`` on CPU, with a timeout, so no rank waits forever on a dead one), builds the
same run as one process would (``setup_run`` with this rank's ``DataParallelGroup``) and runs
the same loop. What differs is behind the loop's few hooks (``process_group.py``):

- **Batches.** The global batch is the config's ``batch_size``, split over the ranks: every
  rank draws the same global order from the same seeded generator and takes rows
  ``rank, rank + N, ...`` of each batch (``parts.RankShard``). So the steps per epoch, the
  planned steps and the LR schedule are those of one process, and the data cursor
  (``batch_in_epoch`` and the generator's state at the top of the epoch) is the same on every
  rank. ``DistributedDataParallel`` averages the gradients.
- **Loss and stops.** Each step all-reduces ``[loss x rows, rows, stop flag]`` over a ``gloo``
  group: every rank logs the same loss (the global batch's), a non-finite loss on one rank
  raises ``NonFiniteLoss`` on all of them before the backward pass, and a SIGINT or SIGTERM
  seen by any rank stops all of them at the same step, which they save once.
- **Evaluation.** Rank 0 evaluates the whole split, exactly as one process would; the others
  wait at the next collective.
- **Checkpoints: rank-0 save, not ``torch.distributed.checkpoint``.** The weights, optimizer,
  scheduler and scaler are the same on every rank (DDP keeps them in step), so rank 0 holds the
  whole train state but the per-rank RNG states, which it gathers (``TrainState.gather_rng``,
  under ``rng["ranks"]``). Rank 0 then writes it through the existing ``CheckpointManager``:
  the same transaction (temp, fsync, rename or upload, verify, LATEST), the same files, the same
  verification and restart check. DCP would write one shard per rank in its own layout, outside
  that transaction and the checks that read it; it pays off for sharded (FSDP) states, which
  this is not. Rank 0's policy decides when to save (its decision is broadcast); the gather is
  the save barrier: every rank has reached the step before LATEST moves. The meta records
  ``world_size``: a resume with another number of processes is refused (``process_group.py``).
- **Records.** Rank 0 writes the run folder (metrics, params, progress, model, result); rank k
  writes its own into ``.ranks/<k>/`` (its metrics show the same losses; a link there is
  refused, never followed). Rank 0 writes its outcome (the result, a stop rule, an
  interruption or an error), all ranks meet at a barrier, and ``launch`` turns the outcome
  back into what ``train_run`` returns or raises.
- **The job.** ``JOB`` is JSON (``jobfile.py``), never pickle: the spec, the run's name and ID,
  where the pinned corpus and inputs are with their sha256 (each rank loads and checks them
  itself: the corpus is not copied), the local store, the run folder. It lives in a private
  temporary folder outside the output folder (``tempfile.mkdtemp``, 0700; files 0600) with
  the outcome and the stop file, removed after the run, whatever its end; a rank refuses a
  job file whose sha256 is not the ``SHA256`` on its command line.

Faults: a SIGINT or SIGTERM to the launching process reaches the agent, which sends it to every
rank (they run in sessions of their own, so a terminal's Ctrl-C reaches them only this way);
they stop together at the next step, save once, and ``launch`` raises ``Interrupted``. A rank
that dies (SIGKILL, out of memory) fails the group: the agent ends the others (no restart) and
``launch`` raises ``RankFailed``; the next start resumes from LATEST.

Supported: the ranks of one machine (``RunSize.nodes`` is 1). The worker and the group read
nothing of this launcher, so ranks across machines need another launcher and a ``RunSize`` of
more nodes, not another worker. Not supported: a resume with another number of processes.
"""

from __future__ import annotations

import json
import shutil
import signal
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from gpucampaign.config import ResolvedRun, SpecError
from gpucampaign.core.errors import INPUT_ERRORS
from gpucampaign.core.files import sha256_bytes
from gpucampaign.core.interrupt import DEFAULT_GRACE_S, Interrupted, request_stop, stop_requested
from gpucampaign.core.stoprules import STOP_RULES
from gpucampaign.engine.jobfile import job_bytes, write_private
from gpucampaign.engine.setup import RunJob
from gpucampaign.folder.layout import (
    LAUNCH_DIR_PREFIX,
    LAUNCH_JOB_FILE,
    LAUNCH_OUTCOME_FILE,
    LAUNCH_STOP_FILE,
    RunFolder,
)
from gpucampaign.folder.progress import read_progress
from gpucampaign.folder.runresult import RunResult

if TYPE_CHECKING:
    from torch.distributed.launcher.api import LaunchConfig

_AGENT_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")


class RankFailed(RuntimeError):
    """A process of a data-parallel run died or failed; the others were ended with it. The
    run resumes from its last good checkpoint at its next start."""


def launch(
    job: RunJob,
    *,
    progress: Callable[[dict[str, Any]], None] | None = None,
    on_save: Callable[[dict[str, Any]], None] | None = None,
) -> RunResult:
    """Train ``job.run`` on its ``size.processes`` processes of this machine; rank 0's result.

    ``progress`` and ``on_save`` are ``train_run``'s: called here, from rank 0's live progress
    file and its ``checkpoint`` rows, while the ranks train. The job goes to the ranks as JSON
    in a private temporary folder (``jobfile.py``), removed when they are done, whatever
    their end; nothing of the launch is written in the output folder.

    Raises:
        StopRule: The one rank 0 raised (every rank agreed on it).
        Interrupted: A stop was requested (here or in a rank): every rank saved the step.
        RankFailed: A rank died or failed, or refused its job file; the others were ended.
        SpecError: A rank refused its arguments (a resume with another ``gpus``, say), or the
            run folder or one of its ranks' folders is a link.
    """
    run = job.run
    _check_devices(run)
    for k in range(run.size.processes):  # the run folder, .ranks and every rank's folder
        job.run_folder.at_rank(k).refuse_links()
    work = Path(tempfile.mkdtemp(prefix=LAUNCH_DIR_PREFIX))  # 0700, outside the output folder
    try:
        return _launch_in(job, work=work, progress=progress, on_save=on_save)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _launch_in(
    job: RunJob,
    *,
    work: Path,
    progress: Callable[[dict[str, Any]], None] | None,
    on_save: Callable[[dict[str, Any]], None] | None,
) -> RunResult:
    """``launch`` with its private folder ``work``: the job, rank 0's outcome, the stop file."""
    run = job.run
    job_file, outcome_file = work / LAUNCH_JOB_FILE, work / LAUNCH_OUTCOME_FILE
    data = job_bytes(job, outcome_file=outcome_file, stop_file=work / LAUNCH_STOP_FILE)
    write_private(job_file, data)
    # The agent installs handlers that raise SignalException and forward the signal to the
    # ranks; the caller's (``graceful_signals``) come back afterwards.
    previous = _handlers()
    relay = _Relay(
        job.run_folder, progress=progress, on_save=on_save, stop_file=work / LAUNCH_STOP_FILE
    )
    relay.start()
    failure: str | None = None
    signalled: str | None = None
    # torch's elastic agent, imported here: every fresh process that trains imports this
    # module (a restart check's among them), and only a data-parallel run needs it (issue 47).
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    try:
        config = _launch_config(run, log_dir=work / "agent")
        start_ranks(config, job_file, sha256=sha256_bytes(data))
    except SignalException as exc:
        signalled = exc.sigval.name
        request_stop(signalled)  # the campaign stops too, as it would on this signal
    except ChildFailedError as exc:
        failure = exc.format_msg()
    finally:
        relay.stop()
        _restore_handlers(previous)
    outcome = _read_outcome(outcome_file)
    if outcome is None:
        if signalled is not None:
            raise Interrupted(signalled, detail=f"{run.run_id}: the ranks ended before saving")
        if _replaced(job_file, data):
            failure = f"its job file {job_file} was replaced after the launch: the ranks refused it"
        raise RankFailed(
            f"run {run.run_id}: a process of the {run.size.processes}-process run failed and "
            f"the others were ended; it resumes from its last checkpoint at the next start.\n"
            f"{failure or 'rank 0 wrote no outcome'}"
        )
    return _outcome_result(outcome, run=run, failure=failure)


def start_ranks(config: LaunchConfig, job_file: Path, *, sha256: str) -> None:
    """Run the ranks through torch's elastic agent until they all end; each is handed the job
    file and its sha256 on its command line."""
    from torch.distributed.launcher import api

    api.elastic_launch(config, sys.executable)(
        "-m", "gpucampaign.engine.worker", str(job_file), sha256
    )


def _replaced(job_file: Path, data: bytes) -> bool:
    try:
        return job_file.read_bytes() != data
    except OSError:
        return True


def _launch_config(run: ResolvedRun, *, log_dir: Path) -> LaunchConfig:
    """The agent's ``LaunchConfig``: the run's processes on this node, a standalone rendezvous
    on a free port (``torchrun --standalone``), no restart; the agent's folders (each rank's
    ``error.json``) in ``log_dir``, inside the launch's private folder: left to itself, the
    agent makes a ``/tmp/torchelastic_*`` folder at every launch and never removes it."""
    size = run.size
    assert size.nodes == 1, "this launcher starts the ranks of one machine"
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.launcher.api import LaunchConfig

    return LaunchConfig(
        min_nodes=size.nodes,
        max_nodes=size.nodes,
        nproc_per_node=size.gpus_per_node,
        run_id=f"gpucampaign-{uuid.uuid4().hex[:12]}",
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
        monitor_interval=0.1,
        start_method="spawn",
        shutdown_timeout=int(DEFAULT_GRACE_S) + 10,
        logs_specs=DefaultLogsSpecs(log_dir=str(log_dir)),
    )


def _check_devices(run: ResolvedRun) -> None:
    """Refuse a CUDA run with more processes than this machine has GPUs (two ranks on one
    GPU is not data parallelism, and NCCL refuses it).

    Raises:
        SpecError: Fewer CUDA devices than ``gpus``.
    """
    requested, gpus = run.config.device, run.size.gpus_per_node
    if requested == "cpu" or not (requested != "auto" or torch.cuda.is_available()):
        return
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count < gpus:
        raise SpecError(
            f"field 'gpus': run {run.run_id} has gpus: {gpus} on device '{requested}', and this "
            f"machine has {count} CUDA device(s); a data-parallel run needs one GPU per process "
            f"on one machine. Run it on a lot with {gpus} GPUs, or set gpus: {max(1, count)}.",
            field="gpus",
        )


def _outcome_result(outcome: dict[str, Any], *, run: ResolvedRun, failure: str | None) -> RunResult:
    """What rank 0's outcome means for the caller: its result, or the exception to raise."""
    kind = outcome["kind"]
    if kind == "result":
        return RunResult.from_dict(outcome["result"])
    if kind == "stop":
        rule = STOP_RULES[outcome["rule"]]
        more = {"numbers": outcome["numbers"]} if "numbers" in outcome else {}  # a futile stop's
        raise rule(
            run.run_id, outcome["reason"], step=outcome["step"], stop_id=outcome["stop_id"], **more
        )
    if kind == "interrupted":
        raise Interrupted(outcome["reason"], step=outcome["step"])
    if kind == "spec_error":  # bad input: the same kind as the rank's
        error = INPUT_ERRORS.get(str(outcome.get("error_class")), SpecError)
        raise error(outcome["message"], field=outcome["field"])
    raise RankFailed(
        f"run {run.run_id}: rank 0 failed: {outcome.get('error')}\n{failure or ''}".rstrip()
    )


def _read_outcome(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and "kind" in data else None


def _handlers() -> dict[int, Any]:
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {
        s: signal.getsignal(s)
        for name in _AGENT_SIGNALS
        if (s := getattr(signal, name, None)) is not None
    }


def _restore_handlers(previous: dict[int, Any]) -> None:
    for signum, handler in previous.items():
        if handler is not None:
            signal.signal(signum, handler)


class _Relay:
    """While the ranks train: calls ``on_save`` and ``progress`` in the launching process,
    from rank 0's ``checkpoint`` rows in ``metrics.jsonl`` and its live progress file, and
    passes a stop requested here on to the ranks (``stop_file``)."""

    def __init__(
        self,
        run_folder: RunFolder,
        *,
        progress: Callable[[dict[str, Any]], None] | None,
        on_save: Callable[[dict[str, Any]], None] | None,
        stop_file: Path,
        every_s: float = 0.25,
    ) -> None:
        self.run_folder, self.stop_file = run_folder, stop_file
        self._stop_sent = False
        self.progress, self.on_save, self.every_s = progress, on_save, every_s
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ddp-relay", daemon=True)
        metrics = run_folder.metrics
        self._offset = metrics.stat().st_size if metrics.is_file() else 0
        self._last_step: Any = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()
        self._poll()  # the last rows

    def _loop(self) -> None:
        while not self._done.wait(self.every_s):
            self._poll()

    def _poll(self) -> None:
        reason = stop_requested()
        if reason is not None and not self._stop_sent:
            self._stop_sent = True
            write_private(self.stop_file, reason.encode())
        try:
            self._relay_saves()
            self._relay_progress()
        except Exception:  # reporting never fails the run
            return

    def _relay_saves(self) -> None:
        metrics = self.run_folder.metrics
        if self.on_save is None or not metrics.is_file():
            return
        if metrics.stat().st_size < self._offset:  # truncated by a resume: read it again
            self._offset = 0
        with open(metrics, "rb") as f:
            f.seek(self._offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self._offset += end
        planned = _planned_steps(self.run_folder)
        for line in data[:end].splitlines():
            row = json.loads(line)
            if row.get("kind") == "checkpoint":
                self.on_save(
                    {
                        "run_id": self.run_folder.run_id,
                        "step": row["step"],
                        "planned_steps": planned,
                        "save_s": row.get("save_s"),
                        "key": row.get("key"),
                    }
                )

    def _relay_progress(self) -> None:
        if self.progress is None:
            return
        record = read_progress(self.run_folder.path)
        if record and record.get("step") != self._last_step and record.get("planned_steps"):
            self._last_step = record.get("step")
            self.progress({**record, "fraction": record["step"] / record["planned_steps"]})


def _planned_steps(run_folder: RunFolder) -> int | None:
    try:
        return int(json.loads(run_folder.params.read_text())["planned_steps"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
