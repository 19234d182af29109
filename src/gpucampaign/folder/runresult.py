"""A run's record: ``RunResult``, kept as ``result.json`` in the run folder.

Only a run that did every planned step is complete (``require_complete``); a recorded result
is reused as is by a later call, stop rule included.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from gpucampaign.core.errors import FolderError
from gpucampaign.core.stoprules import STOP_RULES, IncompleteRun
from gpucampaign.folder.layout import RunFolder


@dataclass
class RunResult:
    """What one ``train_run`` call did (a recorded result when ``reused``)."""

    run_id: str
    run: str
    completed: bool
    steps_done: int
    planned_steps: int
    metrics: dict[str, float]
    timings: dict[str, Any]
    n_checkpoints: int
    checkpoint_every: int | None
    save_interval: dict[str, Any] | None
    resumed_from_step: int | None
    refused_checkpoints: list[str] = field(default_factory=list)
    eval_metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    stop: dict[str, Any] | None = None
    device: str = "cpu"
    threads: int = 1
    precision: str = "fp32"
    interrupted: dict[str, Any] | None = None
    reused: bool = False
    # The machine that wrote it: its lot's number, its host name, its Prefect worker.
    lot: int | None = None
    host: str | None = None
    worker: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``from_dict`` reads it back)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunResult:
        """Rebuild from ``to_dict``'s output."""
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


def require_complete(run_id: str, *, steps_done: int, planned_steps: int) -> None:
    """Raise ``IncompleteRun`` unless every planned step ran (never a delivery otherwise)."""
    if steps_done < planned_steps:
        raise IncompleteRun(
            run_id,
            f"the run did {steps_done} of its {planned_steps} planned steps; "
            "it cannot be called complete",
            step=steps_done,
        )


def recorded_result(run_folder: RunFolder) -> RunResult | None:
    """The result a finished call recorded in ``run_folder``, or None when there is none.

    Args:
        run_folder: The run's folder (the run expected there is its ``run_id``).

    Returns:
        The recorded ``RunResult`` with ``reused`` set.

    Raises:
        FolderError: The folder holds another run.
        IncompleteRun: The record has fewer steps than planned.
        StopRule: The recorded run stopped on a rule (raised again, same stop ID).
    """
    path, run_id = run_folder.result, run_folder.run_id
    if not path.is_file():
        return None
    result = RunResult.from_dict(json.loads(path.read_text(encoding="utf-8")))
    if result.run_id != run_id:
        raise FolderError(
            f"'{run_folder.path}' holds run {result.run_id}, not {run_id}: give each run its own "
            "folder.",
            field="out",
        )
    # A recorded stop first: an interrupted run (``resume: inference``) is recorded short of
    # its planned steps, and is that stop, not an incomplete run.
    if result.stop:
        stop = result.stop
        cls = STOP_RULES[stop["rule"]]
        kept = {"numbers": stop["numbers"]} if "numbers" in stop else {}  # a futile stop's
        raise cls(run_id, stop["reason"], stop.get("step"), stop["stop_id"], **kept)
    require_complete(run_id, steps_done=result.steps_done, planned_steps=result.planned_steps)
    result.reused = True
    return result
