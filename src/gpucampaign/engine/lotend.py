"""The lot's end as a deadline the training keeps: a hook of the loop, and its typed stop.

A run on a dated lot (``starts_at`` on the spec's lots) knows when its machine goes away
(``plan/lots.py``: the lot of this machine, the margin). After each step the hook compares the
time left with the margin, measured from this run's own save, upload and read-back times; once
inside it, it asks the loop to end the run: the step reached saved, the save waited for, the
checkpoint read back from where it is kept (for an S3 store, from the bucket, after the spool is
emptied: ``Checkpointer.read_back``), then ``LotEnded`` raised: it never trains into the
margin. A checkpoint that is not off the machine (a
``local`` store, a spool the server did not take) is said in the stop's text and in the
``lot_end`` row of ``metrics.jsonl``.

``LotEnded`` is an ``Interrupted`` (the task ends Cancelled, never retried; the run resumes from
its checkpoint); the flow decides where the campaign goes on (``flows/campaign.py``).
"""

from __future__ import annotations

import os
from datetime import datetime
from typing import Any

from gpucampaign.config import CampaignSpec
from gpucampaign.core import clock
from gpucampaign.core.files import median
from gpucampaign.core.interrupt import Interrupted
from gpucampaign.engine.hooks import Ending, Hook, HookArgs, RunView, StopRequest
from gpucampaign.plan.lots import (
    Lot,
    ended_lot,
    least_margin_s,
    lot_margin_s,
    machine_lot,
    unmeasured_save_s,
)
from gpucampaign.plan.rental import iso
from gpucampaign.storage import SpoolingStore

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


def forget_ended_lots() -> None:
    """Forget the lots ended in this process (a test, or a new campaign in it)."""
    _ENDED.clear()


def refuse_start(spec: CampaignSpec, *, what: str) -> None:
    """Start no phase on a machine whose lot has ended or is inside the least margin a run
    keeps (one that ended in this process counts, with no other lot open for it).

    Called before a phase takes its GPU slot: the queued runs of a lane behind one the lot's
    end stopped are not started (the flow then closes resumable or goes on on another lot).

    Raises:
        LotEnded: ``what`` is not started; nothing was trained or written.
    """
    now, ended = _now(), frozenset(_ENDED)
    lot = machine_lot(spec, now=now, env=os.environ, ended=ended)
    least = least_margin_s(spec)
    if lot is not None and (lot.ends_at - now).total_seconds() > least:
        return
    lot = lot or ended_lot(spec, now=now, env=os.environ, ended=ended)
    if lot is None:
        return
    _ENDED.add(lot.number)
    left = (lot.ends_at - now).total_seconds()
    when = f"ended at {iso(lot.ends_at)}" if left <= 0 else f"ends in {left:.0f} s"
    raise LotEnded(
        f"{lot.label} {when} (now {iso(now)}): {what} not started; nothing trained",
        step=None,
        lot=lot.number,
        off_machine=True,  # nothing of this run is on the machine
        margin_s=least,
    )


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
    """Asks to stop a run at its lot's end minus the margin, its checkpoint read back."""

    def __init__(self, r: RunView, lot: Lot, *, restored_meta: dict[str, Any] | None) -> None:
        self.r = r
        self.lot = lot
        self.restored = restored_meta or {}
        self.folder_bytes = 0
        self.margin_s = 0.0
        self._saves_seen = -1

    @classmethod
    def for_run(cls, r: RunView, args: HookArgs) -> LotDeadline | None:
        """The hook when this machine's lot is dated and open (or pinned), else None."""
        now, ended = _now(), frozenset(_ENDED)
        lot = machine_lot(r.spec, now=now, env=os.environ, ended=ended)
        # A lot that ended with none open after it still bounds the run: it stops at its start
        # (``refuse_start`` keeps such a run from starting at all; this is the backstop).
        lot = lot or ended_lot(r.spec, now=now, env=os.environ, ended=ended)
        return None if lot is None else cls(r, lot, restored_meta=args.restored_meta)

    # --- the margin -----------------------------------------------------------------------
    def _measure(self) -> float:
        """The margin from what this run measured so far (its saves, its restore, its steps)."""
        saves = self.r.saves
        throughput = [s.bytes / s.upload_s for s in saves if s.upload_s > 0]
        if saves:
            save_s = (median([s.durable_s for s in saves]) or 0.0) + (
                median(list(self.r.save_stalls)) or 0.0
            )
        elif self.restored.get("write_s") is not None:
            save_s = float(self.restored["write_s"]) + float(self.restored.get("upload_s") or 0)
        else:  # nothing measured yet: the state's size at a slow rate
            save_s = unmeasured_save_s(self.r.state_bytes())
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

    def _left_s(self) -> float:
        if len(self.r.saves) != self._saves_seen:  # a new measure: the margin again
            self._saves_seen = len(self.r.saves)
            self.margin_s = self._measure()
        return (self.lot.ends_at - _now()).total_seconds() - self.margin_s

    # --- the events -----------------------------------------------------------------------
    def on_start(self) -> StopRequest | None:
        out = self.r.run_folder.out
        if self.r.dist.is_main and isinstance(self.r.store, SpoolingStore) and out is not None:
            self.folder_bytes = _dir_bytes(out)  # the output folder, mirrored before the end
        if self.r.dist.agree(self._left_s() <= 0):  # nothing trained: what is kept stays
            return self._stop(save=False)
        return None

    def after_step(self) -> StopRequest | None:
        if self.r.dist.agree(self._left_s() <= 0):
            return self._stop(save=True)
        return None

    def _stop(self, *, save: bool) -> StopRequest:
        """Ask the loop to save the step reached, read the checkpoint back, record the end and
        raise ``LotEnded``."""
        _ENDED.add(self.lot.number)
        left_s = max(1.0, (self.lot.ends_at - _now()).total_seconds() - 1.0)
        return StopRequest(
            stop=self._lot_ended, save=save, read_back_s=min(left_s, self.margin_s), row=self._row
        )

    def _where(self, ending: Ending) -> tuple[bool, str, float]:
        """Whether the checkpoint is off the machine, where it is, and the read-back's
        seconds."""
        if not ending.saved and self.r.resumed_from is None:
            return True, "nothing was trained yet, nothing is lost", 0.0
        if ending.read_back is not None:
            rb = ending.read_back
            return rb.off_machine, rb.where, rb.read_s
        return False, "checked by rank 0", 0.0

    def _row(self, ending: Ending) -> dict[str, Any]:
        off, where, read_s = self._where(ending)
        return {
            "kind": "lot_end",
            "step": ending.step,
            "lot": self.lot.number,
            "ends_at": iso(self.lot.ends_at),
            "margin_s": self.margin_s,
            "left_s": (self.lot.ends_at - _now()).total_seconds(),
            "off_machine": off,
            "read_back_s": read_s,
            "where": where,
        }

    def _lot_ended(self, ending: Ending) -> LotEnded:
        off, where, _ = self._where(ending)
        step = ending.step
        left = (self.lot.ends_at - _now()).total_seconds()
        done = f"step {step} saved; {where}" if ending.saved else f"stopped at step {step}: {where}"
        detail = (
            f"{self.lot.label} ends in {left:.0f} s, inside the margin of {self.margin_s:.0f} s "
            f"kept for saving and copying: {done}"
        )
        return LotEnded(
            detail, step=step, lot=self.lot.number, off_machine=off, margin_s=self.margin_s
        )
