"""What every phase task shares: task options, the timeline of busy intervals, stop records."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prefect.cache_policies import NO_CACHE

from gpucampaign.files import utc_now
from gpucampaign.folder import OutputFolder
from gpucampaign.interrupt import Interrupted
from gpucampaign.records import StopRecord, TimelineRow, append_stop, append_timeline
from gpucampaign.spec import CampaignSpec
from gpucampaign.stoprules import StopRule

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
    """Record one interval (machine-busy, or a person deciding) in timeline.jsonl, even when
    the work fails."""
    row = TimelineRow(
        phase=phase,
        step=calendar_step(spec, run=run, phase=phase),
        run=run,
        kind=kind,
        start=utc_now(),
        note=note,
    )
    t0 = time.perf_counter()
    try:
        yield row
    except Interrupted as exc:
        row.outcome = f"interrupted: {exc}"[:500]
        raise
    except BaseException as exc:
        row.outcome = f"failed: {exc}"[:500]
        raise
    else:
        row.outcome = row.outcome or "ok"
    finally:
        row.end = utc_now()
        row.seconds = time.perf_counter() - t0
        append_timeline(folder.root, row)


def record_stop(folder: OutputFolder, exc: StopRule, *, run: str, phase: str) -> StopRecord:
    """Append a stop to stops.jsonl (once per stop ID) and return its record."""
    record = StopRecord.from_dict(
        {**exc.to_record(), "run": run, "phase": phase, "time": utc_now()}
    )
    append_stop(folder.root, record)
    return record


def artifact_key(*parts: str) -> str:
    """Prefect artifact keys allow lower-case letters, digits and dashes only."""
    import re

    return re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-")


def out_folder(out: str | Path) -> OutputFolder:
    """The campaign's output folder object."""
    return OutputFolder(Path(out))
