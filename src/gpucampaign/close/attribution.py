"""Every second of each machine's lot window given to one cause, the lot's price split in the
same shares, and the goodput: the training time that counted toward a result over the window
elapsed so far.

Only records the campaign already wrote are read: the plan's calendar (its human preparation
and the clock the first machine step was planned on), ``timeline.jsonl`` (each phase's
segment, the cut ones with the work they lost), each run's ``metrics.jsonl`` (the seconds of
its steps, evaluations, checkpoint stalls and restores) and ``result.json`` (the loop's own
wall time), and ``stops.jsonl`` (the runs a stop rule discarded). Nothing is estimated: time
the records do not give to a phase is idle (committed, unused), and the causes sum to the
window by construction.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from gpucampaign.core.files import parse_time
from gpucampaign.core.stoprules import InterruptedRun
from gpucampaign.folder.records import PlanRecord, StopRecord, TimelineRow
from gpucampaign.folder.segments import CUT_OUTCOME, TRAINING_PHASES, lot_ended

HUMAN = "human preparation"
STARTUP = "start-up"
AUDIT = "audit"
PILOT = "pilot"
STEPS = "training steps"
EVAL = "evaluation"
STALL = "checkpoint stall"
RESTART = "restart checks"
CLOSE = "predictions and close"
RECOVERY = "recovery"
WAITING = "waiting on the decision point"
IDLE = "idle"
#: Every cause, in the order the report shows them; each second of a window has exactly one.
CAUSES = (HUMAN, STARTUP, AUDIT, PILOT, STEPS, EVAL, STALL, RESTART, CLOSE, RECOVERY, WAITING, IDLE)

#: What lost work is charged to (``lost_by_cause``).
MACHINE_LOSS = "machine loss"
LOT_END = "lot end"
INTERRUPTION = "interruption"
STOP_RULE = "stop rule"

_PHASE_CAUSE = {
    "audit": AUDIT,
    "pilot": PILOT,
    "restart": RESTART,
    "predict": CLOSE,
    "close": CLOSE,
    "decide": WAITING,
}
# Where two segments overlap on one machine (a CPU step beside a GPU one), the second goes to
# the one that matters most to the renter: training first, the close last.
_PRIORITY = {"train": 6, "pilot": 5, "restart": 4, "audit": 3, "predict": 2, "close": 2}


@dataclass(frozen=True)
class LotWindow:
    """One committed lot's machine: its place (1-based), its duration, its price and its start
    when the spec dates it (else its window is set on the plan's clock)."""

    number: int
    hours: float
    price_usd: Decimal
    starts_at: datetime | None = None
    label: str = ""


@dataclass
class _Machine:
    """What one machine's sweep adds up: seconds per cause, recovery per loss cause, and the
    training time that counted."""

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CAUSES, 0.0))
    lost: dict[str, float] = field(default_factory=dict)
    counted_s: float = 0.0

    def add(self, cause: str, s: float, *, lost_to: str | None = None) -> None:
        self.seconds[cause] += s
        if lost_to is not None:
            self.lost[lost_to] = self.lost.get(lost_to, 0.0) + s


def lot_windows(packages: Sequence[Mapping[str, Any]]) -> list[LotWindow]:
    """One window per committed lot, from ``budget.resolve_packages``'s dicts (each with
    ``days``, ``count``, ``price_usd`` and, when dated, ``starts_at``)."""
    out: list[LotWindow] = []
    for p in packages:
        starts = p.get("starts_at")
        for _ in range(int(p.get("count", 1))):
            n = len(out) + 1
            out.append(
                LotWindow(
                    number=n,
                    hours=24.0 * float(p["days"]),
                    price_usd=Decimal(str(p["price_usd"])),
                    starts_at=parse_time(starts) if isinstance(starts, str) else starts,
                    label=f"lot {n}: {p.get('gpu', '?')} {p['days']} days",
                )
            )
    return out


def loss_cause(row: TimelineRow) -> str | None:
    """What a segment's lost work is charged to (None when it lost nothing)."""
    if lot_ended(row):
        return LOT_END
    if (row.outcome or "").startswith(CUT_OUTCOME):
        return MACHINE_LOSS
    if row.interrupted:
        return INTERRUPTION
    return None


def _window_start(lot: LotWindow, rows: Sequence[TimelineRow], plan: PlanRecord) -> datetime:
    """The lot's start when dated; else the first machine segment's start less the hour the
    plan placed its step at (the window opens while people prepare, on the plan's clock)."""
    if lot.starts_at is not None:
        return lot.starts_at
    first = min(rows, key=lambda r: r.interval[0])  # type: ignore[index]
    planned = plan.step(first.step or "")
    offset = float((planned.start_hours if planned else None) or 0.0)
    return first.interval[0] - timedelta(hours=offset)  # type: ignore[index]


def _human_prep_s(plan: PlanRecord) -> float:
    """The plan's human hours before its first machine step, in seconds."""
    machine = [
        s.start_hours for s in plan.steps if s.kind == "machine" and s.start_hours is not None
    ]
    first = min(machine, default=None)
    hours = sum(
        s.hours
        for s in plan.steps
        if s.kind == "human" and (first is None or (s.start_hours or 0.0) < first)
    )
    return 3600.0 * hours


def _chunks(rows: Sequence[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
    """A run's metrics rows cut at each restore: one piece per training call that kept them."""
    out: list[list[Mapping[str, Any]]] = [[]]
    for r in rows:
        if r.get("kind") == "restore":
            out.append([])
        out[-1].append(r)
    return out if out[0] else out[1:]


def _sum(rows: Iterable[Mapping[str, Any]], key: str, kind: str) -> float:
    return float(
        sum(
            r.get(key) or 0.0
            for r in rows
            if r.get("kind") == kind and isinstance(r.get(key), int | float)
        )
    )


def _training_parts(
    rows: Sequence[TimelineRow],
    metrics: Mapping[str, Sequence[Mapping[str, Any]]],
    results: Mapping[str, Mapping[str, Any]],
) -> dict[int, dict[str, float]]:
    """Per training segment (keyed by ``id`` of its row): the measured seconds of its steps,
    evaluations, checkpoint stalls and restore, from the piece of its run's metrics it wrote.

    A run's pieces are matched to its training segments from the last: a segment cut before
    it saved anything left no piece (its rows were dropped by the resume that redid them).
    The last segment's steps take the loop's wall time from ``result.json`` (``train_s``,
    less its evaluations and stalls): the loop's own cost between steps is training time.
    """
    out: dict[int, dict[str, float]] = {}
    by_run: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        if r.phase in TRAINING_PHASES and r.run is not None:
            by_run.setdefault(r.run, []).append(i)
    for run, idx in by_run.items():
        pieces = _chunks(metrics.get(run) or [])
        for i, piece in zip(reversed(idx), reversed(pieces), strict=False):
            out[id(rows[i])] = {
                "steps": _sum(piece, "step_s", "train"),
                "eval": _sum(piece, "eval_s", "eval"),
                "stall": _sum(piece, "stall_s", "checkpoint"),
                "restore": _sum(piece, "restore_s", "restore"),
            }
        last = out.get(id(rows[idx[-1]]))
        train_s = ((results.get(run) or {}).get("timings") or {}).get("train_s")
        if last is not None and isinstance(train_s, int | float) and not rows[idx[-1]].interrupted:
            last["loop"] = max(0.0, float(train_s) - last["steps"] - last["eval"] - last["stall"])
    return out


def _sweep(
    rows: Sequence[TimelineRow], *, w0: datetime, window_s: float
) -> tuple[dict[int, float], list[tuple[float, float, int | None, int | None]]]:
    """Each elementary piece of the window given to one segment (the most important of those
    that cover it), and the gaps no segment covers with the segments before and after them.

    Returns:
        ``({row index: seconds owned}, [(start, end, previous row, next row), ...])``.
    """
    spans = []
    for i, r in enumerate(rows):
        a, b = r.interval  # type: ignore[misc]
        s = min(window_s, max(0.0, (a - w0).total_seconds()))
        e = min(window_s, max(s, (b - w0).total_seconds()))
        spans.append((s, e, i))
    cuts = sorted({0.0, window_s, *(s for s, _, _ in spans), *(e for _, e, _ in spans)})
    owned: dict[int, float] = {}
    gaps = []
    for a, b in zip(cuts, cuts[1:], strict=False):
        active = [i for s, e, i in spans if s <= a and e >= b and e > s]
        if active:
            win = max(active, key=lambda i: (_PRIORITY.get(rows[i].phase, 0), rows[i].start))
            owned[win] = owned.get(win, 0.0) + (b - a)
            continue
        before = [(e, i) for s, e, i in spans if e <= a and e > s]
        after = [(s, i) for s, e, i in spans if s >= b and e > s]
        gaps.append((a, b, max(before)[1] if before else None, min(after)[1] if after else None))
    return owned, gaps


def _resumed_after(rows: Sequence[TimelineRow]) -> dict[int, str]:
    """Per training segment that resumes its run after a loss (keyed by ``id`` of its row):
    what the loss is charged to (on whichever machine the run was cut)."""
    out: dict[int, str] = {}
    cut: dict[str, str] = {}
    for r in rows:
        if r.phase not in TRAINING_PHASES or r.run is None:
            continue
        if r.run in cut:
            out[id(r)] = cut.pop(r.run)
        cause = loss_cause(r)
        if cause is not None:
            cut[r.run] = cause
    return out


def _recovering(rows: Sequence[TimelineRow]) -> list[tuple[datetime, datetime, str]]:
    """The stretches from a training segment's loss to its run's resumed training, with what
    the loss is charged to: the time to resume, whatever the relaunch did meanwhile (its
    audit, its start-up). A run never resumed has none (nothing after its loss waited on it)."""
    out = []
    cut: dict[str, tuple[datetime, str]] = {}
    for r in sorted(rows, key=lambda x: x.interval[0]):  # type: ignore[index]
        if r.phase not in TRAINING_PHASES or r.run is None:
            continue
        if r.run in cut:
            end, why = cut.pop(r.run)
            out.append((end, r.interval[0], why))  # type: ignore[index]
        if (lost := loss_cause(r)) is not None:
            cut[r.run] = (r.interval[1], lost)  # type: ignore[index]
    return out


def _gap_cause(rows: Sequence[TimelineRow], prev: int | None, nxt: int | None) -> str:
    """Who an uncovered stretch belongs to: the time to resume after a loss, the wait between
    the pilot and the decision, or nobody (idle)."""
    if prev is None or nxt is None:
        return IDLE
    p, n = rows[prev], rows[nxt]
    if loss_cause(p) is not None and n.run is not None and n.run == p.run:
        return RECOVERY
    if p.phase in ("pilot", "decide") and n.phase in ("decide", "train"):
        return WAITING
    return IDLE


def _give_row(
    m: _Machine,
    rows: Sequence[TimelineRow],
    i: int,
    own: float,
    parts: dict[str, float] | None,
    *,
    discarded: set[str],
    resumed: str | None,
    recovering: str | None = None,
) -> None:
    """Split the seconds a segment owns among its causes (``recovering``: the loss a phase
    other than training ran while waiting on, say a relaunch's audit)."""
    r = rows[i]
    if recovering is not None and r.phase not in TRAINING_PHASES:
        m.add(RECOVERY, own, lost_to=recovering)
        return
    cause = loss_cause(r)
    lost = min(own, float(r.lost_seconds or 0.0)) if cause is not None else 0.0
    if lost:
        m.add(RECOVERY, lost, lost_to=cause)
    own -= lost
    if r.phase not in TRAINING_PHASES:
        if r.interrupted:  # a cut phase that is not training is redone whole
            m.add(RECOVERY, own, lost_to=cause)
        else:
            # a person's segment of no known phase is preparation (kind "person" or "human")
            m.add(_PHASE_CAUSE.get(r.phase, HUMAN if r.kind != "machine" else STARTUP), own)
        return
    p = dict(parts or {})
    measured = p.get("steps", 0.0) + p.get("loop", 0.0) + p.get("eval", 0.0)
    measured += p.get("stall", 0.0) + p.get("restore", 0.0)
    scale = min(1.0, own / measured) if measured > 0 else 0.0  # clocks never give more
    steps = scale * (p.get("steps", 0.0) + p.get("loop", 0.0))
    counted = scale * p.get("steps", 0.0)
    restore = scale * p.get("restore", 0.0)
    if r.run in discarded:
        m.lost[STOP_RULE] = m.lost.get(STOP_RULE, 0.0) + counted
    else:
        m.counted_s += counted
    if r.phase == "pilot":
        m.add(PILOT, own - (restore if resumed else 0.0))
    else:
        m.add(STEPS, steps)
        m.add(EVAL, scale * p.get("eval", 0.0))
        m.add(STALL, scale * p.get("stall", 0.0))
        rest = own - steps - scale * (p.get("eval", 0.0) + p.get("stall", 0.0)) - restore
        m.add(STARTUP, max(0.0, rest) + (0.0 if resumed else restore))
    if resumed:
        m.add(RECOVERY, restore, lost_to=resumed)


def _machine(
    lot: LotWindow,
    rows: Sequence[TimelineRow],
    *,
    plan: PlanRecord,
    parts: Mapping[int, dict[str, float]],
    resumed: Mapping[int, str],
    discarded: set[str],
    now: datetime | None,
) -> dict[str, Any]:
    """One machine's window: seconds and shares per cause, price per cause, goodput."""
    window_s = 3600.0 * lot.hours
    m = _Machine()
    timed = [r for r in rows if r.interval is not None]
    waits = _recovering(timed)
    w0 = _window_start(lot, timed, plan) if timed or lot.starts_at else None
    if w0 is None:  # a lot whose machine never ran: committed, unused
        m.add(IDLE, window_s)
        elapsed = window_s if now is None else 0.0
    else:
        owned, gaps = _sweep(timed, w0=w0, window_s=window_s)
        human_left = _human_prep_s(plan)
        for a, b, prev, nxt in gaps:
            if prev is None and nxt is not None and human_left > 0:
                h = min(b - a, human_left)
                human_left -= h
                m.add(HUMAN, h)
                a += h
            for start, end, why in waits:  # waiting on a resume, on either side of a relaunch
                over = min(b, (end - w0).total_seconds()) - max(a, (start - w0).total_seconds())
                if over > 0:
                    m.add(RECOVERY, over, lost_to=why)
                    b -= over  # the gap's rest (none when the wait spans it) goes on below
            cause = _gap_cause(timed, prev, nxt)
            lost_to = loss_cause(timed[prev]) if cause == RECOVERY and prev is not None else None
            m.add(cause, max(0.0, b - a), lost_to=lost_to)
        for i, own in owned.items():
            row = timed[i]
            waiting = [w for s, e, w in waits if s <= row.interval[0] and row.interval[1] <= e]  # type: ignore[index]
            _give_row(
                m,
                timed,
                i,
                own,
                parts.get(id(row)),
                discarded=discarded,
                resumed=resumed.get(id(row)),
                recovering=waiting[0] if waiting else None,
            )
        last = max(((r.interval[1] - w0).total_seconds() for r in timed), default=0.0)  # type: ignore[index]
        upto = last if now is None else (now - w0).total_seconds()
        elapsed = min(window_s, max(0.0, upto))
    total = sum(m.seconds.values())
    price = lot.price_usd
    return {
        "lot": lot.number,
        "label": lot.label,
        "hosts": sorted({r.host or "this machine" for r in rows if r.kind == "machine"}),
        "window_s": window_s,
        "window_start": None if w0 is None else w0.isoformat(timespec="milliseconds"),
        "elapsed_s": elapsed,
        "seconds": dict(m.seconds),
        "shares": {k: (v / total if total else 0.0) for k, v in m.seconds.items()},
        "price_usd": float(price),
        "usd": {
            k: float(price * Decimal(repr(v / total))) if total else 0.0
            for k, v in m.seconds.items()
        },
        "counted_s": m.counted_s,
        "lost_by_cause": dict(m.lost),
    }


def _hosts_to_lots(lots: Sequence[LotWindow], rows: Sequence[TimelineRow]) -> dict[str, int]:
    """The lot each machine belongs to: the lot its segments name (``lot``, written by a
    worker of that lot); else a dated lot open at the machine's first segment; else the
    machines in the order they first worked, one lot each (later ones share the last)."""
    first: dict[str, datetime] = {}
    named: dict[str, int] = {}
    numbers = {lot.number for lot in lots}
    for r in rows:
        if r.kind == "machine" and r.interval is not None:
            h = r.host or "this machine"
            first[h] = min(first.get(h, r.interval[0]), r.interval[0])
            if r.lot is not None and r.lot in numbers:
                named.setdefault(h, r.lot)
    out: dict[str, int] = dict(named)
    if not lots:
        return out
    order = sorted((h for h in first if h not in named), key=lambda h: first[h])
    free = [lot for lot in lots if lot.number not in named.values()] or list(lots)
    for n, h in enumerate(order):
        dated = [
            lot.number
            for lot in lots
            if lot.starts_at is not None
            and lot.starts_at <= first[h] < lot.starts_at + timedelta(hours=lot.hours)
        ]
        out[h] = dated[0] if dated else free[min(n, len(free) - 1)].number
    return out


def attribute_window(
    *,
    lots: Sequence[LotWindow],
    plan: PlanRecord,
    timeline: Iterable[TimelineRow],
    metrics: Mapping[str, Sequence[Mapping[str, Any]]],
    results: Mapping[str, Mapping[str, Any]] | None = None,
    stops: Iterable[StopRecord] = (),
    now: datetime | None = None,
) -> dict[str, Any]:
    """Every second of each lot's window given to one cause, its price split in the same
    shares, and the goodput.

    Args:
        lots: the committed lots (``lot_windows``).
        plan: the untouched ``plan.json`` (its human preparation and its clock).
        timeline: ``timeline.jsonl`` rows (``read_timeline``).
        metrics: each run's ``metrics.jsonl`` rows, by run name.
        results: each run's ``result.json``, by run name (the loop's wall time).
        stops: ``stops.jsonl``: a run a stop rule ended is discarded, its steps lost to it.
        now: the moment the window has elapsed to (a live campaign); None at the close,
            where it has elapsed to the last segment's end.

    Returns:
        ``{causes, machines: [...], seconds, shares, usd, window_s, elapsed_s, counted_s,
        goodput, lost_by_cause, lost_shares}``: per machine (one per lot) and summed; the
        shares are of the lots' windows, the ``usd`` of their prices (no hourly rate);
        ``goodput`` is the training time that counted (steps kept, of runs not discarded)
        over the window elapsed so far, ``lost_shares`` each loss cause's share of it.
    """
    rows = [r for r in timeline if r.interval is not None]
    discarded = {s.run for s in stops if s.run and s.rule != InterruptedRun.rule}
    parts = _training_parts(rows, metrics, results or {})
    resumed = _resumed_after(rows)
    where = _hosts_to_lots(lots, rows)
    people = [r for r in rows if r.kind != "machine"]
    machines = []
    for lot in lots:
        mine = [
            r
            for r in rows
            if r.kind == "machine" and where.get(r.host or "this machine") == lot.number
        ]
        machines.append(
            _machine(
                lot,
                [*mine, *people] if mine else [],
                plan=plan,
                parts=parts,
                resumed=resumed,
                discarded=discarded,
                now=now,
            )
        )
    return _totals(machines)


def _totals(machines: list[dict[str, Any]]) -> dict[str, Any]:
    """The machines' windows added up."""
    seconds = {k: sum(m["seconds"][k] for m in machines) for k in CAUSES}
    window = sum(m["window_s"] for m in machines)
    elapsed = sum(m["elapsed_s"] for m in machines)
    counted = sum(m["counted_s"] for m in machines)
    lost: dict[str, float] = {}
    for m in machines:
        for k, v in m["lost_by_cause"].items():
            lost[k] = lost.get(k, 0.0) + v
    worked = sum(v for k, v in seconds.items() if k not in (HUMAN, IDLE))
    return {
        "causes": list(CAUSES),
        "machines": machines,
        "worked_s": worked,
        "goodput_of_worked": counted / worked if worked else None,
        "seconds": seconds,
        "shares": {k: (v / window if window else 0.0) for k, v in seconds.items()},
        "usd": {k: sum(m["usd"][k] for m in machines) for k in CAUSES},
        "price_usd": sum(m["price_usd"] for m in machines),
        "window_s": window,
        "elapsed_s": elapsed,
        "counted_s": counted,
        "goodput": counted / elapsed if elapsed else None,
        "lost_by_cause": lost,
        "lost_shares": {k: (v / elapsed if elapsed else 0.0) for k, v in lost.items()},
    }
