"""When a run saves, and the save: the ``Checkpointer`` the loop calls after every step.

Behind it: the save policy (``checkpoint/savepolicy.py``: a fixed interval, else Daly's from
the measured costs), one save at a time in a background thread, and the collection of each
save's result (its ``checkpoint`` row in ``metrics.jsonl``, then ``on_save``: the timeline's
heartbeat).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from gpucampaign.checkpoint.manager import CheckpointManager, SavedCheckpoint
from gpucampaign.checkpoint.savepolicy import SavePolicy
from gpucampaign.checkpoint.state import BackgroundSaves, snapshot
from gpucampaign.checkpoint.trainstate import MODEL, TrainState
from gpucampaign.config import CampaignSpec, RunConfig
from gpucampaign.core.files import median, sync_files
from gpucampaign.engine.process_group import Ranks
from gpucampaign.folder.metrics import MetricsLog
from gpucampaign.storage import LocalStore, SpoolingStore

SaveFn = Callable[[dict[str, Any]], None]

#: A step no run reaches (``quiet_until``: no save due by the policy).
NEVER = 2**62


@dataclass(frozen=True)
class ReadBack:
    """What reading a run's latest checkpoint back from where it is kept found.

    Attributes:
        off_machine: True when it was read back, verified, from a store off the machine.
        where: The sentence that says where it is (or why it is not off the machine).
        read_s: The seconds the read-back took.
    """

    off_machine: bool
    where: str
    read_s: float


class SavingRun(Protocol):
    """What the checkpointer reads of the run (``setup.LiveRun``)."""

    spec: CampaignSpec
    device: torch.device
    planned: int
    manager: CheckpointManager
    state: TrainState
    mlog: MetricsLog
    checkpoint_meta: dict[str, Any]
    dist: Ranks
    unsynced: list[Path]  # the hooks' files, fsynced with the metrics before a snapshot

    @property
    def run_id(self) -> str: ...

    @property
    def config(self) -> RunConfig: ...

    @property
    def steps_per_epoch(self) -> int: ...

    def step_s(self) -> float | None: ...


class Checkpointer:
    """Decides when the run saves, and saves: the loop asks ``due`` after every step, then
    ``submit``s, and ``wait``s before it returns.

    Args:
        r: The run, restored (its step is where the policy starts).
        restored_meta: The restored checkpoint's meta (its measured costs), if any.
        checkpoint_every: A fixed interval in steps (overrides the spec and the measure).
        on_save: Called with ``{run_id, step, planned_steps, save_s, key}`` after each save.
    """

    def __init__(
        self,
        r: SavingRun,
        *,
        restored_meta: dict[str, Any] | None,
        checkpoint_every: int | None,
        on_save: SaveFn | None,
    ) -> None:
        cp = r.spec.checkpoint
        self.policy = SavePolicy.start(
            r.state.global_step,
            fixed=checkpoint_every or cp.every_steps,
            fixed_source="argument" if checkpoint_every else "spec",
            restored_meta=restored_meta,
            first_save=r.spec.pilot.steps,
            mtbi_s=cp.interruption_hours * 3600,
            tolerable_s=cp.tolerable_loss_minutes * 60,
            planned_steps=r.planned,
        )
        self.saves: list[SavedCheckpoint] = []
        self.stalls: list[float] = []  # per save, in the loop's time
        self._r = r
        self._one_process = r.dist.world_size == 1
        self._on_save = on_save
        self._background = BackgroundSaves()
        self._submitted: int | None = None  # the step of the last save started

    def due(self, step: int, *, last_step: bool = False) -> bool:
        """Whether ``step`` is to be checkpointed now: the policy's next save, or the last step.

        ``last_step``: the last step of this call (its target, or a stop). A step already saved
        is not saved again. A save finished in the background is collected here first.
        """
        if self._background.finished:
            # Collected as soon as it is durable, not at the next save: its row and heartbeat
            # then say what a kill right now would keep.
            self.wait()
        if step == self._submitted:
            return False
        due = self.policy.due(step, last_step=last_step)
        # Data-parallel: rank 0's policy decides (its measured costs); every rank snapshots.
        # One process has no one to agree with: nothing to ask at every step.
        return due if self._one_process else self._r.dist.agree(due)

    def quiet_until(self, step: int) -> int:
        """The first step after ``step`` at which ``due`` may say yes other than at the call's
        last step (the loop asks ``due`` at that one): the next step while a save is in flight
        (collected as soon as it is durable), else the policy's next save. Data-parallel: the
        next step (``due`` is asked at every step, where the ranks agree: their policies and
        saves in flight are rank 0's to know)."""
        if self._background.in_flight or not self._one_process:
            return step + 1
        at = self.policy.next_save
        return at if at > step else NEVER

    def submit(self, step: int) -> None:
        """Checkpoint ``step`` in the background (``due`` said so; the waiting metrics rows are
        written: the loop checks them first, so a checkpoint never holds a step after a
        non-finite loss); ``wait`` collects it. Snapshot the train state and hand it to the
        background writer; re-plan the next save.

        The loop stalls only to collect the previous save (never two in flight) and to snapshot
        the state to host memory; the fsync of the metrics so far (and the hooks' files), then
        the write, the verification and the move of ``LATEST`` happen in the background thread.
        """
        r = self._r
        t0 = time.perf_counter()
        assert not r.mlog.waiting, "the loop writes the waiting rows before a snapshot"
        self.wait()
        # Data-parallel: every rank's RNG states are gathered here, so every rank has reached
        # this step's save before rank 0 writes it and moves LATEST; the other ranks write
        # nothing (rank 0 holds the same weights, optimizer and cursor).
        state = snapshot(r.state.state_dict())
        # The rows so far and the hooks' files of the steps it holds (futility's records) are
        # made durable by the save's thread before it writes the checkpoint: the order a
        # restart needs, and the loop does not wait for the fsyncs.
        rows_durable = r.mlog.sync_later()
        files = list(r.unsynced)
        r.unsynced.clear()
        if not r.dist.is_main:
            rows_durable()  # no checkpoint written here: durable now, as before
            sync_files(files)
            self._submitted = step
            return
        model_state = state.pop(MODEL)
        if r.device.type == "cuda":
            torch.cuda.synchronize()  # the pinned copies are complete before the thread reads
        stall_s = time.perf_counter() - t0
        self.stalls.append(stall_s)
        step_s = r.step_s()
        extra = {
            "epoch": r.state.epoch,
            "batch_in_epoch": r.state.batch_in_epoch,
            "planned_steps": r.planned,
            "steps_per_epoch": r.steps_per_epoch,
            "step_s": step_s,
            "stall_s": stall_s,
            "threads": r.config.threads,
            "device": str(r.device),
            "precision": r.config.precision,
            **r.checkpoint_meta,
            "world_size": r.dist.world_size,
        }
        manager = r.manager

        def save() -> SavedCheckpoint:
            rows_durable()
            sync_files(files)
            return manager.save(step, model_state=model_state, train_state=state, extra_meta=extra)

        self._background.submit(save)
        self._submitted = step
        writes = [s.durable_s for s in self.saves]
        self.policy.saved(
            step, save_costs=self.stalls, step_s=step_s, write_s=median(writes) if writes else None
        )

    def wait(self) -> None:
        """Wait for the save in flight, if any, and log its ``checkpoint`` row."""
        saved = self._background.wait()
        if saved is None:
            return
        r = self._r
        self.saves.append(saved)
        r.mlog.write(
            {
                "kind": "checkpoint",
                "step": saved.step,
                "save_s": saved.save_s,
                "stall_s": self.stalls[len(self.saves) - 1],
                "write_s": saved.write_s,
                "upload_s": saved.upload_s,
                "commit_s": saved.commit_s,
                "bytes": saved.bytes,
                "key": saved.key,
                "every_steps": self.policy.interval.every_steps,
                "interval_source": self.policy.interval.source,
            }
        )
        if self._on_save is not None:
            self._on_save(
                {
                    "run_id": r.run_id,
                    "step": saved.step,
                    "planned_steps": r.planned,
                    "save_s": saved.save_s,
                    "key": saved.key,
                }
            )

    def close(self) -> None:
        """Let the save in flight finish, then stop the background thread (its result is
        dropped: the caller is already failing, or collected it with ``wait``)."""
        self._background.close()

    def read_back(self, step: int, *, timeout_s: float) -> ReadBack:
        """Read the run's latest checkpoint back from where it is kept (for an S3 store, from
        the bucket, once the spool is empty, waiting at most ``timeout_s`` for it): is
        ``step`` there, verified, and off the machine?"""
        r = self._r
        t0 = time.perf_counter()
        store: Any = r.manager.store
        if isinstance(store, SpoolingStore):
            waiting = store.drain(timeout_s=timeout_s)
            if waiting:
                return ReadBack(
                    False,
                    f"NOT OFF THE MACHINE: {len(waiting)} checkpoint file(s) are still only in "
                    f"{store.spool.root} (the S3 server did not take them before the lot's "
                    "end); they are lost with the machine",
                    time.perf_counter() - t0,
                )
            store = store.remote
        m = r.manager
        check = CheckpointManager(
            store,
            run_id=m.run_id,
            config_sha256=m.config_sha256,
            keep=m.keep,
            staging_dir=m.staging_dir,
            expect_tensors=m.expect_tensors,
        )
        ck, refused = check.load_latest()
        read_s = time.perf_counter() - t0
        if ck is None or ck.step != step:
            found = "none" if ck is None else f"step {ck.step}"
            why = f" ({'; '.join(refused)})" if refused else ""
            return ReadBack(
                False, f"NOT VERIFIED: the store's latest good checkpoint is {found}{why}", read_s
            )
        if isinstance(store, LocalStore):
            return ReadBack(
                False,
                f"checkpoint {ck.key} verified, but NOT OFF THE MACHINE (storage.url: local): "
                "it goes away with the lot unless the folder is copied; use an s3:// store",
                read_s,
            )
        where = f"checkpoint {ck.key} read back from {store.url} and verified"
        return ReadBack(True, where, read_s)
