"""The lot's end as a deadline the training keeps: a hook of the loop, and its typed stop.

A run on a dated lot (``starts_at`` on the spec's lots) knows when its machine goes away
(``plan/lots.py``: the lot of this machine, the margin). After each step the hook compares the
time left with the margin, measured from this run's own save, upload and read-back times; once
inside it, the run saves the step reached, waits for the save, reads the checkpoint back from
where it is kept (for an S3 store, from the bucket, after the spool is emptied) and raises
``LotEnded``: it never trains into the margin. A checkpoint that is not off the machine (a
``local`` store, a spool the server did not take) is said in the stop's text and in the
``lot_end`` row of ``metrics.jsonl``.

``LotEnded`` is an ``Interrupted`` (the task ends Cancelled, never retried; the run resumes from
its checkpoint); the flow decides where the campaign goes on (``flows/campaign.py``).
"""

from __future__ import annotations

import os
import time
from datetime import datetime
from typing import Any

from gpucampaign.checkpoint.manager import CheckpointManager
from gpucampaign.core import clock
from gpucampaign.core.files import median
from gpucampaign.core.interrupt import Interrupted
from gpucampaign.engine.hooks import Hook, HookArgs
from gpucampaign.engine.setup import LiveRun
from gpucampaign.plan.lots import Lot, lot_margin_s, machine_lot, unmeasured_save_s
from gpucampaign.plan.rental import iso
from gpucampaign.storage import LocalStore, SpoolingStore

#: The lots that ended in this process: a later run here does not train on them again.
_ENDED: set[int] = set()


def _now() -> datetime:
    return clock.now()


class LotEnded(Interrupted):
    """The run stopped before its lot ends, its step saved.

    Attributes:
        lot: The lot's number (its place in the spec's ``packages``, from 1).
        off_machine: True when the checkpoint was read back from a store off the machine.
        margin_s: The margin the run kept.
    """

    def __init__(
        self, detail: str, *, step: int | None, lot: int, off_machine: bool, margin_s: float
    ) -> None:
        super().__init__("lot_ended", step=step, detail=detail)
        self.args = (f"lot ended: {detail}",)
        self.detail = detail
        self.lot = lot
        self.off_machine = off_machine
        self.margin_s = margin_s

    def __reduce__(self) -> tuple[Any, ...]:
        # Prefect pickles task exceptions into their states: keep every field.
        kwargs = {
            "step": self.step,
            "lot": self.lot,
            "off_machine": self.off_machine,
            "margin_s": self.margin_s,
        }
        return (_rebuild, (self.detail, kwargs))


def _rebuild(detail: str, kwargs: dict[str, Any]) -> LotEnded:
    return LotEnded(detail, **kwargs)


def lot_over_here(lot: int) -> bool:
    """Whether lot ``lot`` ended in this process (a run stopped at its margin)."""
    return lot in _ENDED


def forget_ended_lots() -> None:
    """Forget the lots ended in this process (a test, or a new campaign in it)."""
    _ENDED.clear()


def _dir_bytes(root: Any) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.stat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
    return total


class LotDeadline(Hook):
    """Stops a run at its lot's end minus the margin, with its checkpoint verified."""

    def __init__(self, r: LiveRun, lot: Lot, *, restored_meta: dict[str, Any] | None) -> None:
        self.r = r
        self.lot = lot
        self.restored = restored_meta or {}
        self.folder_bytes = 0
        self.margin_s = 0.0
        self._saves_seen = -1

    @classmethod
    def for_run(cls, r: LiveRun, args: HookArgs) -> LotDeadline | None:
        """The hook when this machine's lot is dated and open (or pinned), else None."""
        lot = machine_lot(r.spec, now=_now(), env=os.environ, ended=frozenset(_ENDED))
        return None if lot is None else cls(r, lot, restored_meta=args.restored_meta)

    # --- the margin -----------------------------------------------------------------------
    def _measure(self) -> float:
        """The margin from what this run measured so far (its saves, its restore, its steps)."""
        saves = self.r.saver.saves
        throughput = [s.bytes / s.upload_s for s in saves if s.upload_s > 0]
        if saves:
            save_s = (median([s.durable_s for s in saves]) or 0.0) + (
                median(self.r.saver.stalls) or 0.0
            )
        elif self.restored.get("write_s") is not None:
            save_s = float(self.restored["write_s"]) + float(self.restored.get("upload_s") or 0)
        else:  # nothing measured yet: the state's size at a slow rate
            save_s = unmeasured_save_s(self._state_bytes())
        rate = median(throughput) if throughput else None
        mirror_s = self.folder_bytes / rate if rate else 0.0
        retrieve_s = self.r.restore_s if self.r.resumed_from is not None else None
        return lot_margin_s(
            step_s=self.r.step_s(),
            save_s=save_s,
            retrieve_s=retrieve_s,
            mirror_s=mirror_s,
            extra_minutes=self.r.spec.checkpoint.lot_end_margin_minutes,
        )

    def _state_bytes(self) -> int:
        """The model's bytes, three times (weights and two optimizer moments)."""
        model = self.r.state.model
        return 3 * sum(p.numel() * p.element_size() for p in model.parameters())

    def _left_s(self) -> float:
        if len(self.r.saver.saves) != self._saves_seen:  # a new measure: the margin again
            self._saves_seen = len(self.r.saver.saves)
            self.margin_s = self._measure()
        return (self.lot.ends_at - _now()).total_seconds() - self.margin_s

    # --- the events -----------------------------------------------------------------------
    def on_start(self) -> None:
        if self.r.dist.is_main and isinstance(self.r.manager.store, SpoolingStore):
            self.folder_bytes = _dir_bytes(self.r.out_dir.parent.parent)
        if self.r.dist.agree(self._left_s() <= 0):  # nothing trained: what is kept stays
            self._stop(save=False)

    def after_step(self) -> None:
        if self.r.dist.agree(self._left_s() <= 0):
            self._stop(save=True)

    def _stop(self, *, save: bool) -> None:
        """Save the step reached, prove the checkpoint is kept, record it and raise."""
        r = self.r
        step = r.state.global_step
        _ENDED.add(self.lot.number)
        if save:
            r.mlog.flush()  # a non-finite loss is the first fault, and stops before the save
            with r.rng.held():
                r.saver.save(step, last_step=True)
            r.saver.wait()
        if not save and r.resumed_from is None:
            off, where, read_s = True, "nothing was trained yet, nothing is lost", 0.0
        elif r.dist.is_main:
            off, where, read_s = self._verify(step)
        else:
            off, where, read_s = False, "checked by rank 0", 0.0
        left = (self.lot.ends_at - _now()).total_seconds()
        done = f"step {step} saved; {where}" if save else f"stopped at step {step}: {where}"
        detail = (
            f"{self.lot.label} ends in {left:.0f} s, inside the margin of {self.margin_s:.0f} s "
            f"kept for saving and copying: {done}"
        )
        r.mlog.write(
            {
                "kind": "lot_end",
                "step": step,
                "lot": self.lot.number,
                "ends_at": iso(self.lot.ends_at),
                "margin_s": self.margin_s,
                "left_s": left,
                "off_machine": off,
                "read_back_s": read_s,
                "where": where,
            }
        )
        r.mlog.sync()
        raise LotEnded(
            detail, step=step, lot=self.lot.number, off_machine=off, margin_s=self.margin_s
        )

    def _verify(self, step: int) -> tuple[bool, str, float]:
        """Read the run's latest checkpoint back from the store off the machine.

        Returns:
            Whether it is off the machine, the sentence that says where it is, and the seconds
            the read-back took.
        """
        r = self.r
        t0 = time.perf_counter()
        store: Any = r.manager.store
        if isinstance(store, SpoolingStore):
            left_s = max(1.0, (self.lot.ends_at - _now()).total_seconds() - 1.0)
            waiting = store.drain(timeout_s=min(left_s, self.margin_s))
            if waiting:
                return (
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
            return (
                False,
                f"NOT VERIFIED: the store's latest good checkpoint is {found}{why}",
                read_s,
            )
        if isinstance(store, LocalStore):
            return (
                False,
                f"checkpoint {ck.key} verified, but NOT OFF THE MACHINE (storage.url: local): "
                "it goes away with the lot unless the folder is copied; use an s3:// store",
                read_s,
            )
        return True, f"checkpoint {ck.key} read back from {store.url} and verified", read_s
