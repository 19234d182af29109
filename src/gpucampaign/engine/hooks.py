"""The loop's hooks: objects a training call tells what happens, at fixed points. A hook
observes and asks; only the loop ends a run.

Every stop rule that watches the training (``non_finite_loss``, ``below_threshold``,
``not_learning``, ``futility``, the lot's end), the MLflow tracker and the live view is a
``Hook``. Each is built for one call by its factory in the registry (``engine/registry.py``)
from a read-only view of the run (``RunView``); a factory returns None when its rule is off.
The loop fires every event itself, through ``Hooks``, in the registry's order; it knows none of
them by name.

The events of one call, in order (``ARCHITECTURE.md`` has the map with who listens)::

    on_start()              the loop starts: restored, metrics.jsonl open, no step yet
    per step:
      on_train_row(row)     a step's train row, its loss fetched (rows wait and are fetched
                            in one transfer when the loop flushes: see ``engine/loop.py``),
                            before it is written; a stop drops it and the rows after it
      on_rows(rows)         rows written to metrics.jsonl (every kind, in order), handed on
                            by the loop after each flush and event
      after_eval(metrics)   an evaluation on val during training gave ``metrics``
      wants_rows()          asked before after_step: the waiting rows written first?
      after_step()          the step is applied and its save decided; both only at the
                            steps the hook needs (``next_step``, ``next_time``: every step
                            unless it says otherwise) and at the step after any other event
    after_train()           the call's target step is reached, its saves durable
    at_end(metrics)         the run's last step: final evaluations and model/ written;
                            the stop it returns is recorded in result.json, then raised
    on_close()              the call ends, whatever ended it

``on_start``, ``on_train_row``, ``after_eval`` and ``after_step`` may return a ``StopRequest``:
the loop ends the run in one place (``loop._end``: the save, the wait for it, the final
evaluations, ``model/``, ``result.json``, the raise), whatever asked. A hook with a state of its
own (``state_dict``/``load_state_dict``, under its ``key``) has it saved in every checkpoint
with the train state and given back on a resume, never rebuilt from the records.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpucampaign.core.files import replace_bytes
from gpucampaign.core.stoprules import StopRule
from gpucampaign.engine.checkpointer import NEVER, ReadBack
from gpucampaign.recipe.runtime import score_split

if TYPE_CHECKING:
    from pathlib import Path

    import torch

    from gpucampaign.checkpoint.manager import SavedCheckpoint
    from gpucampaign.config import CampaignSpec, ResolvedRun, RunConfig
    from gpucampaign.engine.process_group import Ranks
    from gpucampaign.engine.setup import LiveRun
    from gpucampaign.folder.layout import RunFolder
    from gpucampaign.recipe.contract import Recipe
    from gpucampaign.storage import Store

ProgressFn = Callable[[dict[str, Any]], None]

# NEVER: a step no run reaches: a hook that needs no step (``Hook.next_step``).


@dataclass(frozen=True)
class Ending:
    """What the loop's end did before raising a requested stop: the stop's words may use it.

    Attributes:
        step: The step the run reached.
        saved: Whether that step was saved (and is durable).
        read_back: What reading the checkpoint back found (asked with ``read_back_s``;
            rank 0 only), else None.
    """

    step: int
    saved: bool
    read_back: ReadBack | None = None


def _no_row(ending: Ending) -> dict[str, Any] | None:
    return None


@dataclass(frozen=True, kw_only=True)
class StopRequest:
    """A hook's ask: end the run at the step reached. The loop ends it (``loop._end``).

    Attributes:
        stop: Words the stop to raise (a ``StopRule`` or an ``Interrupted``) from what the end
            did; ``StopRequest.of`` wraps a stop known in advance.
        save: Checkpoint the step reached and wait until it is durable.
        keep_model: Evaluate every split, keep the model reached as the run's evidence
            (``model/``) and record the run in ``result.json`` (not completed, the stop in it).
        read_back_s: Read the checkpoint back from where it is kept, waiting at most this long
            for a spool to empty (the lot's end: is it off the machine?).
        row: The ``metrics.jsonl`` row that records the end, from what the end did (or None).
        interrupted: The interruption a ``resume: inference`` start found (``result.json``).
    """

    stop: Callable[[Ending], BaseException]
    save: bool = True
    keep_model: bool = False
    read_back_s: float | None = None
    row: Callable[[Ending], dict[str, Any] | None] = _no_row
    interrupted: dict[str, Any] | None = None

    @classmethod
    def of(cls, stop: BaseException, **kwargs: Any) -> StopRequest:
        """A request whose stop is known when asked."""
        return cls(stop=lambda _ending: stop, **kwargs)


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


class RunView:
    """A read-only view of the run a hook watches: the frozen run context, the measurements so
    far, and the services a hook may use (``record`` a row, ``scores`` of a split). Hooks never
    hold the mutable run (``setup.LiveRun``)."""

    def __init__(self, r: LiveRun) -> None:
        self._r = r

    # --- the run's context (fixed for the call) -------------------------------------------
    @property
    def spec(self) -> CampaignSpec:
        return self._r.spec

    @property
    def resolved(self) -> ResolvedRun:
        return self._r.resolved

    @property
    def run(self) -> str:
        return self._r.run

    @property
    def run_id(self) -> str:
        return self._r.run_id

    @property
    def config(self) -> RunConfig:
        return self._r.config

    @property
    def run_folder(self) -> RunFolder:
        """The run's folder (``OUT/runs/<run_id>/``; a data-parallel rank's own, inside it)."""
        return self._r.run_folder

    @property
    def planned(self) -> int:
        return self._r.planned

    @property
    def target(self) -> int:
        return self._r.target

    @property
    def steps_per_epoch(self) -> int:
        return self._r.steps_per_epoch

    @property
    def dist(self) -> Ranks:
        return self._r.dist

    @property
    def device(self) -> torch.device:
        return self._r.device

    @property
    def recipe(self) -> Recipe:
        return self._r.recipe

    @property
    def store(self) -> Store:
        return self._r.manager.store

    @property
    def t_call(self) -> float:
        return self._r.t_call

    @property
    def resumed_from(self) -> int | None:
        return self._r.resumed_from

    @property
    def restore_s(self) -> float:
        return self._r.restore_s

    # --- the measurements so far ----------------------------------------------------------
    @property
    def step(self) -> int:
        """The global step reached."""
        return self._r.state.global_step

    @property
    def epoch(self) -> int:
        return self._r.state.epoch

    @property
    def lr(self) -> float:
        return float(self._r.state.optimizer.param_groups[0]["lr"])

    @property
    def step_times(self) -> tuple[float, ...]:
        return tuple(self._r.step_times)

    def step_s(self) -> float | None:
        """Median step time, without the first step (warm-up) when there are others."""
        return self._r.step_s()

    @property
    def last_eval(self) -> tuple[int, dict[str, float]] | None:
        return self._r.last_eval

    @property
    def last_train_row(self) -> dict[str, Any] | None:
        """The last ``train`` row written (its loss fetched)."""
        return self._r.mlog.last_deferred

    @property
    def saves(self) -> tuple[SavedCheckpoint, ...]:
        return tuple(self._r.saver.saves)

    @property
    def save_stalls(self) -> tuple[float, ...]:
        return tuple(self._r.saver.stalls)

    def state_bytes(self) -> int:
        """The model's bytes, three times (weights and two optimizer moments)."""
        model = self._r.state.model
        return 3 * sum(p.numel() * p.element_size() for p in model.parameters())

    # --- services -------------------------------------------------------------------------
    def record(self, row: dict[str, Any]) -> None:
        """Append ``row`` to the run's ``metrics.jsonl`` (after the rows waiting)."""
        self._r.mlog.write(row)

    def scores(self, split: str) -> tuple[list[str], dict[str, list[float]]] | None:
        """The recipe's per-example ``score`` of ``split`` at the step reached (None when the
        recipe gives no such split)."""
        r = self._r
        dataset = r.split(split)
        if dataset is None or len(dataset) == 0:
            return None
        return score_split(r.recipe, r.state.model, dataset, config=r.config, device=r.device)

    def write_file(self, path: Path, data: bytes) -> None:
        """Write ``path`` atomically now, durable (fsynced) before the next checkpoint commits
        and at the end of the call: a crash loses only what the resume from that checkpoint
        writes again. Not an fsync at every call (issue 47: an evaluation's record)."""
        self._r.unsynced.append(replace_bytes(path, data))

    def add_report(self, seconds: float) -> None:
        """Count one report of the live view and its seconds (``timings``: ``reports``,
        ``report_s``): a cost of the loop at the run's own cadence, not of each step."""
        self._r.reports += 1
        self._r.report_s += seconds

    def put_checkpoint_meta(self, key: str, value: Any) -> None:
        """One more field for every later checkpoint's meta (the MLflow run ID)."""
        self._r.checkpoint_meta[key] = value


class Hook:
    """One listener of a training call; every event does nothing unless overridden.

    A hook is built for one call with a view of its run (``HookFactory``), so events carry only
    what is new. A hook with a state to keep across a resume sets ``key`` and overrides
    ``state_dict``/``load_state_dict``.
    """

    #: The name its state is kept under in a checkpoint (None: it keeps nothing).
    key: str | None = None

    def on_start(self) -> StopRequest | None:
        """The loop starts (before the first step of this call)."""
        return None

    def on_train_row(self, row: dict[str, Any]) -> StopRequest | None:
        """A step's ``train`` row with its loss fetched, before it is written."""
        return None

    def on_train_rows(self, rows: list[dict[str, Any]]) -> tuple[int, StopRequest] | None:
        """``on_train_row`` of each ``train`` row of a flush, in order: the first stop asked
        and its row's index. A hook that can check a batch at once overrides this."""
        for i, row in enumerate(rows):
            if row.get("kind") == "train" and (asked := self.on_train_row(row)) is not None:
                return i, asked
        return None

    def on_rows(self, rows: list[dict[str, Any]]) -> None:
        """Rows just written to ``metrics.jsonl`` (every kind, in order)."""

    def after_eval(self, metrics: dict[str, float]) -> StopRequest | None:
        """An evaluation on ``val`` during training gave ``metrics``."""
        return None

    def wants_rows(self) -> bool:
        """Whether the waiting rows must be written before this step's ``after_step``."""
        return False

    def after_step(self) -> StopRequest | None:
        """A step is applied and its save decided."""
        return None

    def next_step(self, step: int) -> int:
        """The next step whose ``wants_rows`` and ``after_step`` this hook needs, asked after
        those of ``step``: ``step + 1`` (every step) unless it knows better. Any other event
        asks again at the next step."""
        return step + 1

    def next_time(self) -> float:
        """The ``time.monotonic()`` from which its ``wants_rows`` and ``after_step`` are
        needed at every step, whatever ``next_step`` said (infinity: never by the clock)."""
        return math.inf

    def after_train(self) -> None:
        """The call's target step is reached and its saves are durable."""

    def at_end(self, metrics: dict[str, float]) -> StopRule | None:
        """The run's final ``metrics`` (on the selection split): the stop they call for."""
        return None

    def on_close(self) -> None:
        """The call ends, however it ended."""

    def state_dict(self) -> dict[str, Any]:
        """The hook's state, kept in each checkpoint (plain values: loaded with
        ``weights_only``)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take back what ``state_dict`` returned, from the restored checkpoint."""


#: Builds a hook for one training call, or None when it has nothing to do there (its rule off).
HookFactory = Callable[[RunView, HookArgs], Hook | None]


def _overrides(hook: Hook, name: str) -> bool:
    return getattr(type(hook), name) is not getattr(Hook, name)


@dataclass
class Hooks:
    """The hooks of one call, called in order by the loop; the first stop asked wins.

    The per-step events (``wants_rows``, ``after_step``) go only to the hooks that override
    one of them, and only at the steps they need (``Hook.next_step``, ``Hook.next_time``): the
    loop asks ``due(step)`` at every step, two comparisons and a clock read. Every other event
    makes them due at the next step, so a hook's decisions are the ones it would make if asked
    at every step.
    """

    hooks: list[Hook] = field(default_factory=list)
    # Asked at every step: due from this step, or from this monotonic time.
    ask_step: int = field(default=0, init=False)
    ask_time: float = field(default=math.inf, init=False)

    def __post_init__(self) -> None:
        self._stepping = [
            h for h in self.hooks if _overrides(h, "wants_rows") or _overrides(h, "after_step")
        ]
        self._checking = [
            h for h in self.hooks if _overrides(h, "on_train_row") or _overrides(h, "on_train_rows")
        ]
        self._steps = [0] * len(self._stepping)  # each stepping hook's next step
        self._times = [math.inf] * len(self._stepping)  # and the time it is due from
        self._asked: list[int] = []  # the stepping hooks asked at this step (their indices)

    @classmethod
    def of(cls, hooks: Iterable[Hook]) -> Hooks:
        return cls(list(hooks))

    def __iter__(self) -> Any:
        return iter(self.hooks)

    def _again(self) -> None:
        """An event: every stepping hook is asked at the next step."""
        self._steps = [0] * len(self._stepping)
        self.ask_step = 0

    def due(self, step: int) -> bool:
        """Whether a hook's ``wants_rows`` and ``after_step`` are to be called at ``step``."""
        return step >= self.ask_step or time.monotonic() >= self.ask_time

    def on_start(self) -> StopRequest | None:
        self._again()
        return _first(h.on_start() for h in self.hooks)

    def on_train_row(self, row: dict[str, Any]) -> StopRequest | None:
        """The first stop asked by the hooks that check rows (the loop hands them every
        ``train`` row at a flush, then ``on_rows``, which makes the stepping hooks due)."""
        for h in self._checking:
            if (asked := h.on_train_row(row)) is not None:
                return asked
        return None

    def on_train_rows(self, rows: list[dict[str, Any]]) -> tuple[int, StopRequest] | None:
        """``on_train_row`` for each ``train`` row of ``rows``, in order: the first stop asked
        and the index of its row (one call per flush; none per row when no hook checks rows)."""
        checking = self._checking
        if not checking:
            return None
        if len(checking) == 1:  # its own batch check (the non-finite rule's: one sum)
            return checking[0].on_train_rows(rows)
        for i, row in enumerate(rows):
            if row.get("kind") == "train":
                for h in checking:
                    if (asked := h.on_train_row(row)) is not None:
                        return i, asked
        return None

    def on_rows(self, rows: list[dict[str, Any]]) -> None:
        self._again()
        for h in self.hooks:
            h.on_rows(rows)

    def after_eval(self, metrics: dict[str, float]) -> StopRequest | None:
        self._again()
        return _first(h.after_eval(metrics) for h in self.hooks)

    def wants_rows(self, step: int) -> bool:
        """Whether a hook due at ``step`` wants the waiting rows written (each one is asked)."""
        now = time.monotonic()
        self._asked = [
            i
            for i, (at, t) in enumerate(zip(self._steps, self._times, strict=True))
            if step >= at or now >= t
        ]
        return any([self._stepping[i].wants_rows() for i in self._asked])

    def after_step(self, step: int) -> StopRequest | None:
        """The ``after_step`` of the hooks due at ``step`` (``wants_rows`` chose them); then
        when each needs to be asked again."""
        asked = _first(self._stepping[i].after_step() for i in self._asked)
        for i in self._asked:
            h = self._stepping[i]
            self._steps[i], self._times[i] = h.next_step(step), h.next_time()
        self.ask_step = min(self._steps, default=NEVER)
        self.ask_time = min(self._times, default=math.inf)
        if asked is not None:
            self._again()
        return asked

    def after_train(self) -> None:
        for h in self.hooks:
            h.after_train()

    def at_end(self, metrics: dict[str, float]) -> StopRule | None:
        """The first stop a hook returns (every hook is asked)."""
        return _first([h.at_end(metrics) for h in self.hooks])

    def on_close(self) -> None:
        """Every hook's ``on_close``, even when one raises (the first error is raised)."""
        error: BaseException | None = None
        for h in self.hooks:
            try:
                h.on_close()
            except BaseException as exc:  # noqa: BLE001 - raised below, after the others
                error = error or exc
        if error is not None:
            raise error

    # --- the checkpoint's part ------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Each keyed hook's state, by key."""
        return {h.key: h.state_dict() for h in self.hooks if h.key is not None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Give each keyed hook its restored state (a hook absent from it starts afresh)."""
        for h in self.hooks:
            if h.key is not None and h.key in state:
                h.load_state_dict(state[h.key])


def _first(answers: Iterable[Any]) -> Any:
    """The first answer that is not None: from a generator, the hooks after it are not asked
    (a stop asked is the last event of the step); from a list, every hook was asked."""
    return next((a for a in answers if a is not None), None)
