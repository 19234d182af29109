"""The records a campaign writes into its output folder, typed, with one reader each.

``plan.json`` (and ``reforecast.json``, same shape), ``decisions.jsonl``, ``stops.jsonl``,
``timeline.jsonl``, ``rounds.jsonl``, ``pilot.json``, ``campaign.json`` and
``runs/<run_id>/result.json`` (their names are ``folder.layout``'s). Each record has ONE
shape: the one its writer writes. A reader that meets another shape says so instead of guessing.

A run's state (completed, stopped, dropped, not run) is decided here, once, from these
records; the close, the manifest, the report and the flow all read it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from gpucampaign.config import CampaignSpec
from gpucampaign.core.errors import FolderError
from gpucampaign.core.files import (
    append_jsonl,
    atomic_write_bytes,
    json_bytes,
    parse_time,
    read_jsonl,
    utc_now,
)
from gpucampaign.core.stoprules import InterruptedRun
from gpucampaign.core.text import printable
from gpucampaign.folder.layout import (
    CAMPAIGN_FILE,
    DECISIONS,
    MODEL_WEIGHTS,
    PILOT_FILE,
    PLAN,
    REFORECAST_FILE,
    RESULT_FILE,
    ROUNDS,
    STOPS,
    TIMELINE,
    OutputFolder,
    run_relpath,
)
from gpucampaign.folder.runresult import RunResult
from gpucampaign.plan.decision import Decision, Reforecast

AFTER_PILOT = "after-pilot"

RunStatus = Literal["completed", "stopped", "interrupted", "dropped", "not_run"]


def _in(root: str | Path, relative: str) -> Path:
    """A record's file in the output folder, refused when a link takes it out of the folder."""
    return OutputFolder(root).path(relative)


def _read_json(path: Path, into: Callable[[Any], Any] | None = None) -> Any:
    """The JSON document at ``path`` (read ``into`` a record when given); None when there is
    no such file."""
    data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    return data if data is None or into is None else into(data)


# --- plan.json / reforecast.json ------------------------------------------------------------
@dataclass(frozen=True)
class PlanStep:
    """One scheduled calendar step of a plan."""

    name: str
    hours: float
    kind: str | None = None
    run: str | None = None
    phase: str | None = None
    tier: str | None = None
    start_hours: float | None = None


@dataclass(frozen=True)
class PlanRecord:
    """A plan as ``calendar.Plan.to_dict`` writes it (only what is read back)."""

    steps: tuple[PlanStep, ...]
    span_hours: float | None = None
    window_hours: float | None = None
    spare_gpu_hours: float | None = None  # the lot's GPU hours the plan leaves unused

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlanRecord:
        """Read a plan dict; each step needs ``name`` and ``hours``.

        Raises:
            SpecError: the dict is not a plan written by ``campaign plan``.
        """
        if not isinstance(data.get("steps"), list):
            raise FolderError(
                "plan.json has no 'steps': it is not a plan written by `campaign plan`",
                field="plan",
            )
        try:
            steps = tuple(
                PlanStep(
                    name=str(s["name"]),
                    hours=float(s["hours"]),
                    kind=s.get("kind"),
                    run=s.get("run"),
                    phase=s.get("phase"),
                    tier=s.get("tier"),
                    start_hours=s.get("start_hours"),
                )
                for s in data["steps"]
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise FolderError(
                f"plan.json: a step lacks its name or hours ({exc})", field="plan"
            ) from None
        evidence = data.get("evidence")
        spare = evidence.get("spare_gpu_hours") if isinstance(evidence, Mapping) else None
        return cls(
            steps=steps,
            span_hours=data.get("span_hours"),
            window_hours=data.get("window_hours"),
            spare_gpu_hours=float(spare) if isinstance(spare, int | float) else None,
        )

    def step(self, name: str) -> PlanStep | None:
        """The step of that name, None when the plan has none."""
        return next((s for s in self.steps if s.name == name), None)


def read_plan(root: str | Path, *, relative: str = PLAN) -> PlanRecord | None:
    """``plan.json`` (or ``reforecast.json`` with ``relative``) of an output folder, if written."""
    return _read_json(_in(root, relative), PlanRecord.from_dict)


# --- decisions.jsonl ------------------------------------------------------------------------
@dataclass(frozen=True)
class DecisionRecord:
    """One line of ``decisions.jsonl``: a decision point, when, what was decided."""

    point: str
    time: str
    decision: Decision
    reforecast: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DecisionRecord:
        """Read one line (the decision nested under ``decision``)."""
        return cls(
            point=str(data["point"]),
            time=str(data.get("time") or ""),
            decision=Decision.model_validate(data["decision"]),
            reforecast=dict(data.get("reforecast") or {}),
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON line as written."""
        return {
            "point": self.point,
            "time": self.time,
            "decision": self.decision.model_dump(mode="json"),
            "reforecast": self.reforecast,
        }


def read_decisions(root: str | Path) -> list[DecisionRecord]:
    """Every decision taken, in order."""
    return [DecisionRecord.from_dict(r) for r in read_jsonl(_in(root, DECISIONS))]


def append_decision(root: str | Path, record: DecisionRecord) -> None:
    """Append a decision to ``decisions.jsonl``."""
    append_jsonl(_in(root, DECISIONS), record.to_dict())


def record_decision_after_pilot(
    root: str | Path, decision: Decision, *, reforecast: Reforecast
) -> DecisionRecord:
    """Append the decision taken after the pilot, with the re-forecast hours it rests on, and
    keep the re-forecast plan in ``reforecast.json`` (``plan.json`` is never rewritten)."""
    record = DecisionRecord(
        point=AFTER_PILOT,
        time=utc_now(timespec="seconds"),
        decision=decision,
        reforecast=reforecast.hours_record(),
    )
    append_decision(root, record)
    atomic_write_bytes(_in(root, REFORECAST_FILE), json_bytes(reforecast.plan.to_dict()))
    return record


def decision_after_pilot(decisions: Iterable[DecisionRecord]) -> Decision | None:
    """The last decision taken after the pilot, None when none was."""
    found = [d.decision for d in decisions if d.point == AFTER_PILOT]
    return found[-1] if found else None


# --- rounds.jsonl ---------------------------------------------------------------------------
@dataclass(frozen=True)
class RoundRecord:
    """One line of ``rounds.jsonl``: a round of seeds the campaign bought beyond its plan
    (``close.rounds``), or one it was refused (``bought`` False: a person declined it in
    'ask' mode). ``seeds`` holds every seed of each base run once the round is trained (the
    first its own); ``runs`` the new runs; ``gpu_hours`` and ``lot_share`` its measured price
    (one seed's training time of each side times the seeds); ``verdict`` the answer that asked
    for it."""

    round: int
    seeds: dict[str, list[int]]
    runs: list[str]
    gpu_hours: float | None
    lot_share: float | None
    why: str
    bought: bool = True
    by: str = "auto"
    time: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RoundRecord:
        """Read one line."""
        known: dict[str, Any] = {k: data.get(k) for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)

    def to_dict(self) -> dict[str, Any]:
        """The line written."""
        return asdict(self)


def read_rounds(root: str | Path) -> list[RoundRecord]:
    """Every round recorded, in order (bought or declined)."""
    return [RoundRecord.from_dict(r) for r in read_jsonl(_in(root, ROUNDS))]


def append_round(root: str | Path, record: RoundRecord) -> None:
    """Append a round to ``rounds.jsonl`` (before its runs train: a rerun trains them)."""
    append_jsonl(_in(root, ROUNDS), record.to_dict())


def spec_with_rounds(spec: CampaignSpec, root: str | Path) -> CampaignSpec:
    """The spec with the seeds of every round the folder bought (``rounds.jsonl``): its runs
    are the spec's and the rounds'; the spec itself when no round was bought. Idempotent: a
    round records the whole seed list of each base run it grew."""
    seeds: dict[str, list[int]] = {}
    for r in read_rounds(root):
        if r.bought:
            for base, given in r.seeds.items():
                have = seeds.setdefault(base, list(spec.seeds_of(base)))
                # The spec's own seeds first (a spec extended in place may hold more).
                have += [k for k in given if k not in have]
    if all(list(spec.seeds_of(b)) == k for b, k in seeds.items()):
        return spec
    return spec.with_seeds(seeds)


# --- stops.jsonl ----------------------------------------------------------------------------
@dataclass(frozen=True)
class StopRecord:
    """One line of ``stops.jsonl``: a stop rule that ended a run or a phase."""

    stop_id: str
    rule: str
    run_id: str
    reason: str = ""
    step: int | None = None
    run: str | None = None
    phase: str | None = None
    time: str | None = None
    numbers: dict[str, Any] | None = None  # what decided the stop, when the rule keeps it

    def __post_init__(self) -> None:
        # The reason often quotes a library's error (torch's, with its colours): one line of
        # plain text, whatever it held, before it reaches a file or a report.
        object.__setattr__(self, "reason", printable(str(self.reason or "")))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StopRecord:
        """Read one line."""
        known: dict[str, Any] = {k: data.get(k) for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)

    def to_dict(self) -> dict[str, Any]:
        """The JSON line as written (``numbers`` only when the rule keeps them)."""
        row = asdict(self)
        if row["numbers"] is None:
            del row["numbers"]
        return row


def read_stops(root: str | Path) -> list[StopRecord]:
    """Every stop recorded, in order."""
    return read_stops_file(_in(root, STOPS))


def read_stops_file(path: Path) -> list[StopRecord]:
    """Every stop of ``stops.jsonl`` at ``path`` (resolved in its folder once: ``read_stops``
    from the folder's root), in order."""
    return [StopRecord.from_dict(r) for r in read_jsonl(path)]


def append_stop(root: str | Path, record: StopRecord) -> bool:
    """Append a stop unless its stop ID is already recorded; True when it was appended."""
    if any(s.stop_id == record.stop_id for s in read_stops(root)):
        return False
    append_jsonl(_in(root, STOPS), record.to_dict())
    return True


# --- timeline.jsonl -------------------------------------------------------------------------
def _when_known() -> Any:
    """An optional field of a line: None by default, and left out of the line while None."""
    return field(default=None, metadata={"when_known": True})


@dataclass
class TimelineRow:
    """One observed interval of ``timeline.jsonl`` (machine busy, or a person deciding).

    A segment (``segment`` set) is written as it happens: a ``start`` line, a ``heartbeat``
    line at each checkpoint (``checkpoint_step``, ``seen``), an ``end`` line. ``read_timeline``
    folds them into one row per segment; a segment without its end line stays open
    (``end`` None) until the next start closes it as interrupted, with the steps trained
    since its last checkpoint (``lost_steps``) and their time (``lost_seconds``). ``host`` is
    the machine it ran on, ``lot`` that machine's lot, ``worker`` the worker that ran it.
    """

    phase: str
    step: str | None = None
    start: str = ""
    end: str | None = None
    seconds: float | None = None
    run: str | None = None
    kind: str = "machine"
    note: str = ""
    outcome: str | None = _when_known()
    steps: int | None = _when_known()
    segment: str | None = _when_known()
    event: str | None = _when_known()
    checkpoint_step: int | None = _when_known()
    seen: str | None = _when_known()
    lost_steps: int | None = _when_known()
    lost_seconds: float | None = _when_known()
    host: str | None = _when_known()  # the machine the segment ran on
    lot: int | None = _when_known()  # its lot's number among the spec's lots, when known
    worker: str | None = _when_known()  # the Prefect worker whose flow run wrote it

    @property
    def interrupted(self) -> bool:
        """True when the segment ended by an interruption (a signal, a kill, a lost machine)."""
        return (self.outcome or "").startswith("interrupted")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TimelineRow:
        """Read one line."""
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})

    @classmethod
    def between(
        cls, step: str | None, *, phase: str, start: datetime, end: datetime, **fields: Any
    ) -> TimelineRow:
        """A finished interval from two aware datetimes."""
        return cls(
            phase=phase,
            step=step,
            start=start.isoformat(timespec="milliseconds"),
            end=end.isoformat(timespec="milliseconds"),
            seconds=(end - start).total_seconds(),
            **fields,
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON line as written; the optional fields only when known."""
        row = asdict(self)
        for f in self.__dataclass_fields__.values():
            if f.metadata.get("when_known") and row[f.name] is None:
                del row[f.name]
        return row

    @property
    def interval(self) -> tuple[datetime, datetime] | None:
        """(start, end) as datetimes; None while the interval is open."""
        if not self.start or not self.end:
            return None
        return parse_time(self.start), parse_time(self.end)


#: The outcome of a segment that stopped before its lot's end (``engine/lotend.py``).
LOT_ENDED_OUTCOME = "lot ended"
#: Why a run did not run when the campaign's last training segment stopped at a lot's end.
NOT_RUN_LOT_ENDED = (
    "the lot ended before it finished (not started, or stopped with its step saved): a rerun "
    "on an open lot resumes it"
)


def row_lot_ended(row: TimelineRow) -> bool:
    """True for a segment that stopped before its lot's end (saved; nothing lost)."""
    return (row.outcome or "").startswith(LOT_ENDED_OUTCOME)


def read_timeline(root: str | Path) -> list[TimelineRow]:
    """Every observed interval, one row per segment, in the order the segments started."""
    return fold_segments(TimelineRow.from_dict(r) for r in read_jsonl(_in(root, TIMELINE)))


def fold_segments(lines: Iterable[TimelineRow]) -> list[TimelineRow]:
    """One row per segment from its start, heartbeat and end lines (rows without a segment
    pass through): the end line when written, else the start with the last heartbeat."""
    rows: list[TimelineRow] = []
    where: dict[str, int] = {}
    for line in lines:
        if line.segment is None:
            rows.append(line)
        elif line.segment not in where:
            where[line.segment] = len(rows)
            rows.append(line if line.event != "heartbeat" else replace(line, end=None))
        elif line.event == "heartbeat":
            i = where[line.segment]
            if rows[i].event != "end":
                rows[i] = replace(rows[i], checkpoint_step=line.checkpoint_step, seen=line.seen)
        else:
            rows[where[line.segment]] = line
    return rows


def append_timeline(root: str | Path, row: TimelineRow) -> None:
    """Append one interval to ``timeline.jsonl`` as it stands (a finished segment, an imported
    one); a running segment's lines are ``folder.segments``' to write (``Timeline``)."""
    append_jsonl(_in(root, TIMELINE), row.to_dict())


# --- pilot.json -----------------------------------------------------------------------------
def read_pilot(root: str | Path) -> dict[str, dict[str, Any]]:
    """The pilot's measurements per run name (``decision.pilot_measures``); {} before the pilot."""
    return dict(_read_json(_in(root, PILOT_FILE)) or {})


def write_pilot(root: str | Path, measured: Mapping[str, Mapping[str, Any]]) -> None:
    """Keep the pilot's measurements per run name (a rerun does not pilot again)."""
    atomic_write_bytes(_in(root, PILOT_FILE), json_bytes({k: dict(v) for k, v in measured.items()}))


# --- campaign.json: the campaign ID -----------------------------------------------------------
def read_campaign_id(root: str | Path) -> str | None:
    """The campaign ID the folder recorded at its first start; None when there is none (no
    ``campaign.json``, or one that cannot be read)."""
    try:
        return _campaign_id_in(root)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def fix_campaign_id(root: str | Path, *, name: str, spec_sha256: str) -> str:
    """The campaign's ID, fixed at its first start: ``<name>-<UTC start>-<spec sha256[:8]>``.

    Read back from ``campaign.json`` when the folder has one; else made now and written there
    with the spec's hash and the start (``%Y%m%dT%H%M%SZ``)."""
    known = _campaign_id_in(root)
    if known is not None:
        return known
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    cid = f"{name}-{stamp}-{spec_sha256[:8]}"
    record = {"campaign_id": cid, "spec_sha256": spec_sha256, "started_at": stamp}
    atomic_write_bytes(_in(root, CAMPAIGN_FILE), json_bytes(record))
    return cid


def _campaign_id_in(root: str | Path) -> str | None:
    known = _read_json(_in(root, CAMPAIGN_FILE))
    return str(known["campaign_id"]) if known else None


# --- runs/<run_id>/result.json and a run's state --------------------------------------------
def read_result(root: str | Path, run_id: str) -> RunResult | None:
    """``runs/<run_id>/result.json`` as a ``RunResult``, None when the run wrote none."""
    return _read_json(_in(root, run_relpath(run_id, RESULT_FILE)), RunResult.from_dict)


@dataclass(frozen=True)
class RunState:
    """What became of one run of the spec, and why."""

    run: str
    run_id: str
    tier: str
    status: RunStatus
    result: RunResult | None = None
    stop: StopRecord | None = None  # the stop that decided the state, when one did
    reason: str = ""

    @property
    def stop_id(self) -> str | None:
        """The ID of the stop that decided the state, None when none did."""
        return self.stop.stop_id if self.stop is not None else None

    def to_dict(self) -> dict[str, Any]:
        """``{run, tier, status, stop_id?, reason?}``: the manifest's entry for the run."""
        out: dict[str, Any] = {"run": self.run, "tier": self.tier, "status": self.status}
        if self.stop_id:
            out["stop_id"] = self.stop_id
        if self.reason:
            out["reason"] = self.reason
        return out


def run_state(
    spec: CampaignSpec,
    run: str,
    *,
    root: str | Path,
    stops: Sequence[StopRecord],
    decision: Decision | None,
    run_id: str | None = None,
    not_run_reason: str | None = None,
) -> RunState:
    """The one answer to "what became of this run?" (``run_id``: its ID as a sealed manifest
    records it, so that a folder's user recipe is never looked up to resolve it).

    Stopped when a stop names its run ID (interrupted when that stop is the ``interrupted``
    one of a ``resume: inference`` run: its model of the last good checkpoint is evidence, never
    a delivery); dropped when the decision point dropped it; completed when its ``result.json``
    says every planned step ran AND its model was saved; not run otherwise (the question was
    re-posed, or the campaign stopped first: ``not_run_reason`` says how, when it is known).
    """
    rid = run_id or spec.resolve_run(run).run_id
    base: dict[str, Any] = {"run": run, "run_id": rid, "tier": spec.tier_of(run)}
    result = read_result(root, rid)
    stop = next((s for s in stops if s.run_id == rid), None)
    if stop is not None and stop.rule == InterruptedRun.rule:
        return RunState(**base, status="interrupted", stop=stop, result=result, reason=stop.reason)
    if stop is not None:
        return RunState(
            **base,
            status="stopped",
            stop=stop,
            result=result,
            reason=f"stopped by {stop.rule}: {stop.reason}",
        )
    if decision is not None and run in decision.dropped_runs:
        return RunState(**base, status="dropped", reason="dropped at the decision point")
    if result is not None and result.completed:
        if _in(root, run_relpath(rid, MODEL_WEIGHTS)).is_file():
            return RunState(**base, status="completed", result=result)
        return RunState(
            **base,
            status="not_run",
            result=result,
            reason="result.json says complete but the model was not saved",
        )
    repose = decision is not None and decision.action == "re-pose"
    why = "the question was re-posed" if repose else (not_run_reason or "the campaign stopped")
    return RunState(**base, status="not_run", reason=why, result=result)


def run_states(
    spec: CampaignSpec,
    *,
    root: str | Path,
    decision: Decision | None = None,
    run_ids: Mapping[str, str] | None = None,
) -> dict[str, RunState]:
    """``run_state`` of every run of the spec, keyed by run ID, control first (``run_ids``:
    the IDs by run name as a sealed manifest records them; else each run is resolved)."""
    stops = read_stops(root)
    ids = dict(run_ids) if run_ids is not None else spec.run_ids()
    # The campaign's last training segment stopped at a lot's end: the runs left are the
    # lot's, not missing (the close says so, and the folder is resumable).
    trained = [r for r in read_timeline(root) if r.phase in ("pilot", "train")]
    why = NOT_RUN_LOT_ENDED if trained and row_lot_ended(trained[-1]) else None
    return {
        ids[run]: run_state(
            spec,
            run,
            root=root,
            stops=stops,
            decision=decision,
            run_id=ids[run],
            not_run_reason=why,
        )
        for run in spec.run_names()
    }


def runs_with_model(states: Mapping[str, RunState], *, root: str | Path) -> list[str]:
    """The run names whose model gets predictions: every completed run, every run a stop rule
    ended after it wrote its model (the quality floor: the model it reached), and every
    interrupted run whose last good model was kept (evidence at its step, not a delivery)."""
    return [
        s.run
        for s in states.values()
        if s.status == "completed"
        or (
            s.status in ("stopped", "interrupted")
            and _in(root, run_relpath(s.run_id, MODEL_WEIGHTS)).is_file()
        )
    ]
