"""Machine segments as they happen: a phase's segment, heartbeats, cut segments closed,
interruptions counted.

A segment is one stretch of machine (or person) time in ``timeline.jsonl``: a start line, a
heartbeat at each checkpoint, an end line (``records.TimelineRow``). A process killed outright
(SIGKILL, out of memory, a lost machine) writes no end line; the next start closes its
segment as interrupted, with the steps trained since the last checkpoint and their time,
read from the run's ``metrics.jsonl`` before the resume truncates it.

This module writes a running segment's lines: to a ``Timeline`` resolved once (its path is
never derived again per line), a heartbeat through the segment's ``SegmentWriter``.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpucampaign.config import CampaignSpec
from gpucampaign.core.files import append_jsonl, parse_time, read_jsonl, utc_now
from gpucampaign.core.interrupt import Interrupted
from gpucampaign.core.stoprules import InterruptedRun
from gpucampaign.folder.layout import METRICS_FILE, TIMELINE, OutputFolder, run_relpath
from gpucampaign.folder.records import LOT_ENDED_OUTCOME, TimelineRow, fold_segments, row_lot_ended
from gpucampaign.plan.lots import this_machine

CUT_OUTCOME = (
    "interrupted: the process ended without recording its end (killed, out of "
    "memory or the machine lost)"
)


#: The phases whose segments train a run: a cut one lost the steps since its last checkpoint.
TRAINING_PHASES = ("pilot", "train")


@dataclass(frozen=True)
class Timeline:
    """An output folder's ``timeline.jsonl``, resolved once (``Timeline.of``: a link that takes
    it out of the folder is refused there) and written by this module alone: a segment's start,
    its heartbeats and its end go to ``path`` without deriving it again.

    Attributes:
        folder: The output folder (a cut segment's run folder is found in it).
        path: Its ``timeline.jsonl``.
    """

    folder: OutputFolder
    path: Path

    @classmethod
    def of(cls, folder: OutputFolder) -> Timeline:
        """The timeline of ``folder``."""
        return cls(folder=folder, path=folder.path(TIMELINE))

    def rows(self) -> list[TimelineRow]:
        """Every segment so far, one row each (``records.read_timeline``'s reading)."""
        return fold_segments(TimelineRow.from_dict(r) for r in read_jsonl(self.path))


@dataclass
class SegmentWriter:
    """The lines of one open segment still to come, written to its timeline (resolved once):
    a heartbeat at each durable checkpoint (``saved``, a training call's ``on_save``), then
    ``after_heartbeat`` (a remote store's copy of the timeline, say).

    Attributes:
        timeline: The output folder's timeline.
        row: The segment's live row (``phase_segment`` writes its end line from it).
        after_heartbeat: Called after each heartbeat, when given.
    """

    timeline: Timeline
    row: TimelineRow
    after_heartbeat: Callable[[], None] | None = None

    def saved(self, info: Mapping[str, Any]) -> None:
        """A checkpoint of step ``info["step"]`` is durable: the segment's heartbeat."""
        heartbeat(self.timeline, self.row, checkpoint_step=int(info["step"]))
        if self.after_heartbeat is not None:
            self.after_heartbeat()


def _timeline(where: Timeline | OutputFolder | str | Path) -> Timeline:
    """``where``'s timeline: the value itself, or the one of an output folder (or its root)."""
    if isinstance(where, Timeline):
        return where
    return Timeline.of(where if isinstance(where, OutputFolder) else OutputFolder(where))


@contextlib.contextmanager
def phase_segment(
    folder: Timeline | OutputFolder,
    spec: CampaignSpec,
    *,
    phase: str,
    step: str | None,
    run: str | None = None,
    note: str = "",
    kind: str = "machine",
    durable: Callable[[str], int | None],
    lot_end: type[Interrupted] | None = None,
) -> Iterator[TimelineRow]:
    """Record one segment of a campaign's phase (machine-busy, or a person deciding) in
    ``timeline.jsonl`` as it happens: a start line now, an end line even when the work fails.

    A segment an earlier process left open (killed before its end line) is closed first, as
    interrupted, with the work it lost since its last checkpoint.

    Args:
        folder: the output folder, or its timeline resolved once (``Timeline``).
        spec: the campaign (its runs, to find the run folder a cut segment trained in).
        phase: the phase's name.
        step: the calendar step the segment stands for (observed time finds its forecast).
        run: the run the phase works on, when it has one.
        note: a word for the timeline.
        kind: ``machine`` or ``person``.
        durable: the step a resume of run ID restores now (its checkpoint's ``LATEST``, read
            from the store), None when unknown: a cut segment lost the work after it.
        lot_end: the exception of a planned stop before the lot's end, its step saved (the
            engine's ``LotEnded``): the segment ends as such, not as interrupted.

    Yields:
        The segment's live row (a heartbeat updates it; its end line is written from it).
    """
    timeline = _timeline(folder)
    # Who writes the segment; the wall clock, not the campaign's: a test that drives the clock
    # counts its reads, and this is no deadline.
    machine = this_machine(spec, now=datetime.now(UTC), env=os.environ)
    close_cut_segments(
        timeline,
        run_dir=lambda cut: _trained_in(timeline.folder, spec, cut),
        durable=lambda cut: durable(spec.resolve_run(str(cut.run)).run_id),
    )
    row = new_segment(
        TimelineRow(
            phase=phase,
            step=step,
            run=run,
            kind=kind,
            start=utc_now(),
            note=note,
            host=machine.host,
            lot=machine.lot,
            worker=machine.worker,
        )
    )
    append_jsonl(timeline.path, row.to_dict())
    t0 = time.perf_counter()
    try:
        yield row
    except BaseException as exc:
        row.outcome = _ended_by(exc, lot_end=lot_end)
        raise
    else:
        row.outcome = row.outcome or "ok"
    finally:
        row.event = "end"
        row.end = utc_now()
        row.seconds = time.perf_counter() - t0
        append_jsonl(timeline.path, row.to_dict())


def _ended_by(exc: BaseException, *, lot_end: type[Interrupted] | None) -> str:
    """The outcome of a segment that ``exc`` ended."""
    if lot_end is not None and isinstance(exc, lot_end):  # planned, its step saved
        return f"{LOT_ENDED_OUTCOME}: {getattr(exc, 'detail', '')}"[:500]
    if isinstance(exc, Interrupted):
        return f"interrupted: {exc}"[:500]
    return f"failed: {exc}"[:500]


def _trained_in(folder: OutputFolder, spec: CampaignSpec, row: TimelineRow) -> Path | None:
    """The run folder whose metrics a cut pilot or training segment wrote."""
    if row.phase not in TRAINING_PHASES or row.run not in spec.run_names():
        return None
    return folder.path(run_relpath(spec.resolve_run(row.run).run_id))


def new_segment(row: TimelineRow) -> TimelineRow:
    """``row`` as the start line of a new segment (a fresh segment ID)."""
    return replace(row, segment=uuid.uuid4().hex[:12], event="start", end=None)


def heartbeat(
    where: Timeline | OutputFolder | str | Path, row: TimelineRow, *, checkpoint_step: int
) -> None:
    """Append a heartbeat of segment ``row`` to ``where``'s timeline (a ``Timeline`` resolved
    once, or the output folder): a checkpoint of ``checkpoint_step`` is kept.

    ``row`` (the segment's live row) keeps the step and the time too, for its end line.
    """
    row.seen, row.checkpoint_step = utc_now(), checkpoint_step
    line = replace(row, event="heartbeat", end=row.seen, outcome=None)
    append_jsonl(_timeline(where).path, line.to_dict())


def lost_since_checkpoint(metrics_path: Path, *, kept_at_least: int = 0) -> tuple[int, float]:
    """Steps trained after the last checkpoint (or restore) of a run, and their seconds.

    ``kept_at_least``: a checkpoint step known durable beyond what the metrics recorded.
    """
    rows = read_jsonl(metrics_path)
    kept = max(
        [
            kept_at_least,
            *(int(r["step"]) for r in rows if r.get("kind") in ("checkpoint", "restore")),
        ]
    )
    lost = [r for r in rows if r.get("kind") == "train" and int(r.get("step", 0)) > kept]
    return len(lost), float(sum(r.get("step_s") or 0.0 for r in lost))


def close_cut_segments(
    timeline: Timeline,
    *,
    run_dir: Callable[[TimelineRow], Path | None],
    durable: Callable[[TimelineRow], int | None] = lambda row: None,
    only: Callable[[TimelineRow], bool] = lambda row: True,
) -> list[TimelineRow]:
    """Close every open segment as interrupted and return the end lines appended.

    Args:
        timeline: The output folder's timeline.
        run_dir: The run folder a segment trained in (None when it trained none).
        durable: The step of the checkpoint a resume of the segment's run restores (its
            ``LATEST``), when known. A kill between moving ``LATEST`` and the heartbeat
            leaves the timeline one save behind; the loss counts from the durable step.
        only: Which open segments to close (default: all; a lost machine's, say).
    """
    closed = []
    for row in timeline.rows():
        if row.segment is None or row.end is not None or not only(row):
            continue
        folder = run_dir(row)
        metrics = folder / METRICS_FILE if folder is not None else None
        kept = max(row.checkpoint_step or 0, (durable(row) if folder is not None else None) or 0)
        lost_steps, lost_s = (
            lost_since_checkpoint(metrics, kept_at_least=kept) if metrics is not None else (0, 0.0)
        )
        end = _last_sign_of_life(row, metrics)
        seconds = max(0.0, (end - parse_time(row.start)).total_seconds())
        note = f"{lost_steps} step(s) since the last checkpoint lost" if lost_steps else ""
        done = replace(
            row,
            event="end",
            end=end.isoformat(timespec="milliseconds"),
            seconds=seconds,
            outcome=CUT_OUTCOME + (f"; {note}" if note else ""),
            checkpoint_step=kept if kept or row.checkpoint_step is not None else None,
            lost_steps=lost_steps,
            lost_seconds=lost_s,
        )
        append_jsonl(timeline.path, done.to_dict())
        closed.append(done)
    return closed


def _last_sign_of_life(row: TimelineRow, metrics: Path | None) -> datetime:
    """The latest of the segment's start, its last heartbeat and its run's last metrics row."""
    times = [parse_time(row.start)]
    if row.seen:
        times.append(parse_time(row.seen))
    if metrics is not None and metrics.is_file():
        times.append(datetime.fromtimestamp(metrics.stat().st_mtime, tz=UTC))
    return max(times)


def inference_restarted(row: TimelineRow) -> bool:
    """True for the segment that ended a ``resume: inference`` run by an inference restart
    (the phase failed with the ``interrupted`` stop: nothing was trained)."""
    return (row.outcome or "").startswith(f"failed: {InterruptedRun.rule}: ")


def _resumes_after(rows: list[TimelineRow], i: int) -> TimelineRow | None:
    """The first later segment of the same phase and run as ``rows[i]`` (its resume)."""
    cut = rows[i]
    for r in rows[i + 1 :]:
        if r.phase == cut.phase and r.run == cut.run and r.run is not None:
            return r
    return None


def _loss(rows: list[TimelineRow], i: int) -> dict[str, Any]:
    """One interrupted (or lot-ended) segment as a line of the ledger."""
    r = rows[i]
    nxt = _resumes_after(rows, i)
    until = None
    if nxt is not None and r.end:
        until = max(0.0, (parse_time(nxt.start) - parse_time(r.end)).total_seconds())
    return {
        "phase": r.phase,
        "run": r.run,
        "host": r.host,
        "lot": r.lot,
        "start": r.start,
        "end": r.end,
        "outcome": r.outcome,
        "checkpoint_step": r.checkpoint_step,
        "lost_steps": r.lost_steps,
        "lost_seconds": r.lost_seconds,
        "resumed_at": nxt.start if nxt is not None else None,
        "resumed_host": nxt.host if nxt is not None else None,
        "resumed_lot": nxt.lot if nxt is not None else None,
        "until_resumed_seconds": until,
        "relaunched": nxt is not None and _other_machine(r, nxt),
    }


def _other_machine(a: TimelineRow, b: TimelineRow) -> bool:
    """True when ``b`` ran on another machine than ``a``: another host, or another lot (two
    lots' workers may share a host; each lot is a machine of its own)."""
    hosts = bool(a.host and b.host and a.host != b.host)
    return hosts or (a.lot is not None and b.lot is not None and a.lot != b.lot)


def lot_ended(row: TimelineRow) -> bool:
    """True for a segment that stopped before its lot's end (saved; nothing lost)."""
    return row_lot_ended(row)


def interruptions(timeline: Iterable[TimelineRow]) -> dict[str, Any]:
    """The interrupted segments, the resumes per run and the work and time they lost.

    Returns:
        ``{segments: [...], lot_ends: [...], resumes: {run: n}, inference_restarts: {run: n},
        relaunches, lost_steps, lost_hours, down_hours}``: each segment says its machine
        (``host``, and its ``lot``), when it was cut, the steps lost since its last checkpoint
        and the time until its run resumed (``until_resumed_seconds``, on ``resumed_host`` of
        ``resumed_lot``); a relaunch is a resume
        on another machine; ``down_hours`` adds those times up. A resume is a segment of a run's
        training that follows an interrupted one; an inference restart is such a segment that
        trained nothing and kept the last good model instead (``resume: inference``).
    """
    rows = list(timeline)
    cut = [_loss(rows, i) for i, r in enumerate(rows) if r.interrupted]
    ends = [_loss(rows, i) for i, r in enumerate(rows) if lot_ended(r)]
    resumes: dict[str, int] = {}
    restarts: dict[str, int] = {}
    after_cut: set[tuple[str, str | None]] = set()
    for r in rows:
        key = (r.phase, r.run)
        if r.run is not None and key in after_cut:
            counts = restarts if inference_restarted(r) else resumes
            counts[r.run] = counts.get(r.run, 0) + 1
            after_cut.discard(key)
        if r.interrupted:
            after_cut.add(key)
    return {
        "segments": cut,
        "lot_ends": ends,
        "resumes": resumes,
        "inference_restarts": restarts,
        "relaunches": sum(1 for c in cut if c["relaunched"]),
        "lost_steps": sum(c["lost_steps"] or 0 for c in cut),
        "lost_hours": sum(c["lost_seconds"] or 0.0 for c in cut) / 3600.0,
        "down_hours": sum(c["until_resumed_seconds"] or 0.0 for c in cut) / 3600.0,
    }
