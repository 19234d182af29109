"""When a run saves a checkpoint: a fixed step count, or Daly's interval from measured costs.

Without a fixed count, a run saves early (at the pilot's step count) to measure what a save
costs, then every ``min(Daly(save cost, time between interruptions), tolerable lost work)``,
in whole steps of the measured step time; each save re-measures. Saves run in the
background: the cost in Daly's formula is the measured stall of the loop, and the interval is
never shorter than the measured time a save takes to become durable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gpucampaign.core.files import median


def daly_interval(delta_s: float, mtbi_s: float) -> float:
    """Daly's optimal compute time between checkpoints.

    ``tau = sqrt(2 delta M) (1 + sqrt(delta/(2M))/3 + (delta/(2M))/9) - delta`` when
    ``delta < 2M``, else ``M``.

    Args:
        delta_s: Cost of one save (write + upload), seconds.
        mtbi_s: Expected time between interruptions M, seconds.

    Returns:
        The compute time between two saves, seconds.

    Raises:
        ValueError: ``delta_s`` is negative or ``mtbi_s`` is not positive.
    """
    if delta_s < 0 or mtbi_s <= 0:
        raise ValueError(f"need delta_s >= 0 and mtbi_s > 0 (got {delta_s}, {mtbi_s})")
    if delta_s >= 2 * mtbi_s:
        return mtbi_s
    r = delta_s / (2 * mtbi_s)
    return math.sqrt(2 * delta_s * mtbi_s) * (1 + math.sqrt(r) / 3 + r / 9) - delta_s


@dataclass
class SaveInterval:
    """How often to save, and from what.

    ``source``: ``argument`` / ``spec`` (a fixed step count), ``first-save`` (the early save
    at the pilot's step count, before any save was measured) or ``measured`` (Daly from the
    measured save cost, capped by the tolerable lost work, in steps of the measured step time).
    """

    source: str
    every_steps: int | None
    delta_s: float | None = None
    step_s: float | None = None
    mtbi_s: float | None = None
    tolerable_s: float | None = None
    daly_s: float | None = None
    tau_s: float | None = None
    write_s: float | None = None


def choose_save_interval(
    *, delta_s: float, step_s: float, mtbi_s: float, tolerable_s: float, planned_steps: int
) -> SaveInterval:
    """``tau = min(Daly(delta, M), tolerable lost work)``, converted to whole steps.

    Args:
        delta_s: Measured cost of one save, seconds.
        step_s: Measured time of one training step, seconds.
        mtbi_s: Expected time between interruptions, seconds.
        tolerable_s: The most training time a run may lose to one interruption, seconds.
        planned_steps: The run's planned steps (the interval never exceeds them).

    Returns:
        The ``measured`` interval, at least one step.
    """
    daly = daly_interval(delta_s, mtbi_s)
    tau = min(daly, tolerable_s)
    every = planned_steps if step_s <= 0 else int(tau // step_s)
    every = max(1, min(every, planned_steps))
    return SaveInterval("measured", every, delta_s, step_s, mtbi_s, tolerable_s, daly, tau)


@dataclass
class SavePolicy:
    """The current interval and the step of the next save; ``saved`` moves both on."""

    interval: SaveInterval
    next_save: int
    fixed: int | None
    mtbi_s: float
    tolerable_s: float
    planned_steps: int

    @classmethod
    def start(
        cls,
        step: int,
        *,
        fixed: int | None,
        fixed_source: str,
        restored_meta: dict | None,
        first_save: int,
        mtbi_s: float,
        tolerable_s: float,
        planned_steps: int,
    ) -> SavePolicy:
        """The policy of a run (re)starting at ``step``.

        Args:
            step: The step the run starts from (0, or the restored checkpoint's).
            fixed: A fixed interval in steps, or None to measure one.
            fixed_source: Where ``fixed`` comes from (``argument`` or ``spec``).
            restored_meta: The restored checkpoint's meta (its measured costs), if any.
            first_save: The step of the early, measuring save.
            mtbi_s: Expected time between interruptions, seconds.
            tolerable_s: The most training time one interruption may lose, seconds.
            planned_steps: The run's planned steps.
        """
        kw: dict[str, Any] = {
            "fixed": fixed,
            "mtbi_s": mtbi_s,
            "tolerable_s": tolerable_s,
            "planned_steps": planned_steps,
        }
        if fixed:
            interval = SaveInterval(fixed_source, fixed)
            return cls(interval, (step // fixed + 1) * fixed, **kw)
        if restored_meta is not None and restored_meta.get("step_s"):
            stall = restored_meta.get("stall_s")  # absent from checkpoints saved in the loop
            interval = choose_save_interval(
                delta_s=(
                    stall
                    if stall is not None
                    else restored_meta["write_s"] + restored_meta["upload_s"]
                ),
                step_s=restored_meta["step_s"],
                mtbi_s=mtbi_s,
                tolerable_s=tolerable_s,
                planned_steps=planned_steps,
            )
            return cls(interval, step + (interval.every_steps or planned_steps), **kw)
        first = min(first_save, planned_steps)
        interval = SaveInterval("first-save", None, mtbi_s=mtbi_s, tolerable_s=tolerable_s)
        return cls(interval, first if step < first else step + 1, **kw)

    def due(self, step: int, *, last_step: bool) -> bool:
        """True when ``step`` must save: the next save, or the last step of this call."""
        return last_step or step == self.next_save

    def saved(
        self,
        step: int,
        *,
        save_costs: list[float],
        step_s: float | None,
        write_s: float | None = None,
    ) -> None:
        """Move on after a save at ``step``, re-measuring from all saves' costs so far.

        Args:
            step: The step just saved.
            save_costs: What each save so far cost the loop (its stall), seconds.
            step_s: The measured step time, seconds.
            write_s: The measured time a background save takes to become durable; the
                interval is at least that long, so a save rarely waits for the previous one.
        """
        delta_s = median(save_costs)  # None only before any save: the caller passes this one's
        if not self.fixed and step_s and delta_s is not None:
            self.interval = choose_save_interval(
                delta_s=delta_s,
                step_s=step_s,
                mtbi_s=self.mtbi_s,
                tolerable_s=self.tolerable_s,
                planned_steps=self.planned_steps,
            )
            if write_s:
                self.interval.write_s = write_s
                floor = min(self.planned_steps, math.ceil(write_s / step_s))
                self.interval.every_steps = max(self.interval.every_steps or 1, floor)
            self.next_save = step + (self.interval.every_steps or self.planned_steps)
        elif self.fixed:
            self.next_save = (step // self.fixed + 1) * self.fixed
