"""The loop's hooks: objects a training call tells what happens, at fixed points.

Every stop rule that watches the training (``non_finite_loss``, ``below_threshold``,
``futility``), the MLflow tracker and the live view is a ``Hook``. Each is built for one call
by its factory in the registry (``engine/registry.py``) from the spec and the run; a factory
returns None when its rule is off. The loop calls the built hooks through ``Hooks``, in the
registry's order; it knows none of them by name.

The events of one call, in order (``ARCHITECTURE.md`` has the map with who listens)::

    on_start()              the loop starts: restored, metrics.jsonl open, no step yet
    per step:
      on_train_row(row)     a step's train row, its loss fetched (rows wait and are fetched
                            in one transfer: see ``engine/loop.py``), before it is written;
                            raising a StopRule drops it and the rows after it
      on_rows(rows)         rows just written to metrics.jsonl (every kind, in order)
      after_eval(metrics)   an evaluation on val during training gave ``metrics``
      after_step()          the step is applied and its save decided
    after_train()           the call's target step is reached, its saves durable
    at_end(metrics)         the run's last step: final evaluations and model/ written;
                            returns the stop (or None), recorded in result.json, then raised
    on_close()              metrics.jsonl closes: the end of every call, whatever ended it

A hook that stops the run raises a ``StopRule`` (``core/stoprules.py``) from its event, except
``at_end``, which returns it so that ``result.json`` records it before it is raised.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from gpucampaign.core.stoprules import StopRule
from gpucampaign.engine.setup import LiveRun

ProgressFn = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class HookArgs:
    """What a training call gives its hooks besides the run.

    Args:
        restored_meta: The restored checkpoint's meta, if any (the MLflow run ID is there).
        progress: The call's progress callback (the live view calls it).
        show_progress: Show a progress bar when stderr is a terminal.
    """

    restored_meta: dict[str, Any] | None = None
    progress: ProgressFn | None = None
    show_progress: bool = False


class Hook:
    """One listener of a training call; every event does nothing unless overridden.

    A hook is built for one call with its run (``HookFactory``), so events carry only what
    is new.
    """

    def on_start(self) -> None:
        """The loop starts (before the first step of this call)."""

    def on_train_row(self, row: dict[str, Any]) -> None:
        """A step's ``train`` row with its loss fetched, before it is written."""

    def on_rows(self, rows: list[dict[str, Any]]) -> None:
        """Rows just written to ``metrics.jsonl``."""

    def after_eval(self, metrics: dict[str, float]) -> None:
        """An evaluation on ``val`` during training gave ``metrics``."""

    def after_step(self) -> None:
        """A step is applied and its save decided."""

    def after_train(self) -> None:
        """The call's target step is reached and its saves are durable."""

    def at_end(self, metrics: dict[str, float]) -> StopRule | None:
        """The run's final ``metrics`` (on the selection split): the stop they call for."""
        return None

    def on_close(self) -> None:
        """The call ends (``metrics.jsonl`` closes), however it ended."""


#: Builds a hook for one training call, or None when it has nothing to do there (its rule off).
HookFactory = Callable[[LiveRun, HookArgs], Hook | None]


class Hooks:
    """The hooks of one call, called in order; also the metrics log's observer (the row and
    close events come from ``MetricsLog``)."""

    def __init__(self, hooks: Iterable[Hook]) -> None:
        self.hooks = list(hooks)

    def __iter__(self) -> Any:
        return iter(self.hooks)

    def on_start(self) -> None:
        for h in self.hooks:
            h.on_start()

    def after_eval(self, metrics: dict[str, float]) -> None:
        for h in self.hooks:
            h.after_eval(metrics)

    def after_step(self) -> None:
        for h in self.hooks:
            h.after_step()

    def after_train(self) -> None:
        for h in self.hooks:
            h.after_train()

    def at_end(self, metrics: dict[str, float]) -> StopRule | None:
        """The first stop a hook returns (every hook is asked)."""
        stops = [s for h in self.hooks if (s := h.at_end(metrics)) is not None]
        return stops[0] if stops else None

    # --- LogObserver (folder/metrics.py) ---------------------------------------------------
    def check_row(self, row: dict[str, Any]) -> None:
        if row.get("kind") == "train":
            for h in self.hooks:
                h.on_train_row(row)

    def rows_written(self, rows: list[dict[str, Any]]) -> None:
        for h in self.hooks:
            h.on_rows(rows)

    def log_closed(self) -> None:
        """Every hook's ``on_close``, even when one raises (the first error is raised)."""
        error: BaseException | None = None
        for h in self.hooks:
            try:
                h.on_close()
            except BaseException as exc:  # noqa: BLE001 - raised below, after the others
                error = error or exc
        if error is not None:
            raise error
