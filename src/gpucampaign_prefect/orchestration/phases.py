"""What every phase task shares: task options, the timeline of busy intervals (the library's
``folder.segments.phase_segment``, given the store's durable step and the lot's end), stop
records."""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar, cast

from prefect.cache_policies import NO_CACHE
from prefect.states import Cancelled, Completed, State

from gpucampaign.checkpoint.manager import durable_step
from gpucampaign.config import CampaignSpec
from gpucampaign.core.files import utc_now
from gpucampaign.core.interrupt import Interrupted
from gpucampaign.core.stoprules import StopRule
from gpucampaign.engine.lotend import LotEnded
from gpucampaign.folder.layout import OutputFolder
from gpucampaign.folder.records import StopRecord, TimelineRow, append_stop
from gpucampaign.folder.segments import phase_segment

# Inputs hold numpy arrays and the spec: hashing them for a cache key is wasted work,
# and a campaign phase must never be skipped because a cache says it ran.
TASK_OPTIONS: dict[str, Any] = {"cache_policy": NO_CACHE, "persist_result": False}


def not_a_stop_rule(task: Any, task_run: Any, state: Any) -> bool:
    """Retry condition: transient errors are retried, stop rules and interruptions never."""
    try:
        state.result()
    except (StopRule, Interrupted):
        return False
    except Exception:
        return True
    return False


F = TypeVar("F", bound=Callable[..., Any])


def cancel_on_interrupt(fn: F) -> F:
    """Under ``@task``: an ``Interrupted`` phase ends Cancelled (no traceback, no retry).

    The state keeps the exception, so ``future.result()`` in the flow raises it again and the
    flow stops the phases still waiting.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Interrupted as exc:
            return Cancelled(message=f"{exc}; rerun to resume", data=exc)

    return cast(F, wrapper)


#: The name of the state a phase ends in when a stop rule the flow handles ended it: the UI
#: shows a stop as what it is (a Completed state of that name), never as a Failed task run.
STOPPED = "Stopped"


def stopped_state(exc: StopRule) -> State[Any]:
    """The state of a task a stop rule ended: ``Completed`` named ``Stopped``, with the stop's
    message; its result is the stop itself (``stop_of`` reads it back in the flow)."""
    return Completed(name=STOPPED, message=str(exc), data=exc)


def stop_of(value: Any) -> StopRule | None:
    """The stop a phase's result carries (``stopped_state``), or None."""
    return value if isinstance(value, StopRule) else None


def ends_on_stop(phase: str) -> Callable[[F], F]:
    """Under ``@task``: a stop rule the phase raises is recorded in ``stops.jsonl`` first
    (once per stop ID, from the call's ``out`` and ``run``, else the phase's name), then ends
    the task in ``stopped_state``: not Failed, never retried."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except StopRule as exc:
                run = str(kwargs.get("run") or phase)
                record_stop(out_folder(kwargs["out"]), exc, run=run, phase=phase)
                return stopped_state(exc)

        return cast(F, wrapper)

    return wrap


# Every phase that can fail transiently retries once; a stop rule is final.
PHASE_OPTIONS: dict[str, Any] = {
    **TASK_OPTIONS,
    "retries": 1,
    "retry_condition_fn": not_a_stop_rule,
}


def calendar_step(
    spec: CampaignSpec, *, run: str | None = None, phase: str | None = None
) -> str | None:
    """The calendar step that stands for a run or a phase, so observed time finds its forecast."""
    # A phase step (the pilot of the control) wins over the run's own step (its training).
    for step in spec.calendar:
        if phase is not None and step.phase == phase:
            return step.name
    for step in spec.calendar:
        if run is not None and step.run == run:
            return step.name
    return None


@contextlib.contextmanager
def busy(
    folder: OutputFolder,
    spec: CampaignSpec,
    *,
    phase: str,
    run: str | None = None,
    note: str = "",
    kind: str = "machine",
) -> Iterator[TimelineRow]:
    """Record one segment (machine-busy, or a person deciding) in timeline.jsonl as it
    happens: a start line now, an end line even when the work fails
    (``folder.segments.phase_segment``).

    A segment an earlier process left open (killed before its end line) is closed first, as
    interrupted, with the work it lost since the checkpoint its run's ``LATEST`` names now.
    """
    with phase_segment(
        folder,
        spec,
        phase=phase,
        step=calendar_step(spec, run=run, phase=phase),
        run=run,
        note=note,
        kind=kind,
        durable=lambda run_id: durable_step(spec.storage.url, out=folder.root, run_id=run_id),
        lot_end=LotEnded,
    ) as row:
        yield row


def record_stop(folder: OutputFolder, exc: StopRule, *, run: str, phase: str) -> StopRecord:
    """Append a stop to stops.jsonl (once per stop ID) and return its record."""
    record = StopRecord.from_dict(
        {**exc.to_record(), "run": run, "phase": phase, "time": utc_now()}
    )
    append_stop(folder.root, record)
    return record


def artifact_key(*parts: str) -> str:
    """Prefect artifact keys allow lower-case letters, digits and dashes only."""
    return re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-")


def out_folder(out: str | Path) -> OutputFolder:
    """The campaign's output folder object."""
    return OutputFolder(Path(out))
