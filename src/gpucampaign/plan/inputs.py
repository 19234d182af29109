"""What the planner reads from the spec, checked: the window, each step's hours, re-forecast
hours, the lots' machines and how many GPU lanes each step takes.

Each check raises :class:`~gpucampaign.config.SpecError` naming the field to fix.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from gpucampaign.config import CampaignSpec, SpecError, run_size
from gpucampaign.core.errors import InputError
from gpucampaign.plan.schedule import EPS, say_hours
from gpucampaign.plan.tariffs import ResolvedPackage, format_usd


def price_warnings(packages: tuple[ResolvedPackage, ...]) -> list[str]:
    """A warning for each lot whose spec price differs from the catalog's."""
    return [
        f"packages[{i}].price_usd {format_usd(p.price_usd)} differs from the catalog's "
        f"{format_usd(p.catalog_price_usd)} for a {p.days}-day {p.gpu} lot; the plan uses "
        "the spec's price."
        for i, p in enumerate(packages)
        if p.price_source == "spec"
        and p.catalog_price_usd is not None
        and p.price_usd != p.catalog_price_usd
    ]


def step_hours(
    spec: CampaignSpec, hours: list[float], overrides: Mapping[str, float], index: Mapping[str, int]
) -> list[float]:
    """Each step's hours, overrides applied; refuses a hour count that is not finite."""
    hours = list(map(float, hours))
    for name, h in overrides.items():
        hours[index[name]] = h
    if not all(map(math.isfinite, hours)):
        i = next(i for i, h in enumerate(hours) if not math.isfinite(h))
        s = spec.calendar[i]
        raise SpecError(
            f"field 'calendar[{i}].hours': step '{s.name}' has {overrides.get(s.name, s.hours)} "
            "hours; give a finite positive number of hours.",
            field=f"calendar[{i}].hours",
        )
    return hours


def window_of(
    spec: CampaignSpec, packages: tuple[ResolvedPackage, ...], warnings: list[str]
) -> float:
    """The window in hours, checked against the lots' durations (a warning when longer)."""
    window = spec.window
    shortest = min(p.hours for p in packages)
    longest = max(p.hours for p in packages)
    if not math.isfinite(window):
        raise SpecError(
            "field 'window_hours': give a finite number of hours, or omit it to use the "
            "shortest lot's duration.",
            field="window_hours",
        )
    if window < shortest - EPS:
        raise SpecError(
            f"field 'window_hours': {say_hours(window)} h is shorter than every committed lot "
            f"(the shortest lasts {say_hours(shortest)} h) and a lot is paid for its whole "
            f"duration; set window_hours to {say_hours(shortest)} (or omit it), or plan on a "
            "shorter lot.",
            field="window_hours",
        )
    if window > longest + EPS:
        warnings.append(
            f"window_hours {say_hours(window)} is longer than the longest committed lot "
            f"({say_hours(longest)} h): the GPU is not rented for the whole window unless lots "
            "follow one another, with a restart from checkpoint on each new lot."
        )
    return float(window)


def check_overrides(
    hours_override: Mapping[str, float] | None, index: Mapping[str, int]
) -> dict[str, float]:
    """The re-forecast hours by step, after checking names and values."""
    overrides = dict(hours_override or {})
    unknown = sorted(set(overrides) - set(index))
    if unknown:
        raise SpecError(
            f"field 'hours_override': unknown step(s) {unknown}; re-forecast only calendar steps.",
            field="hours_override",
        )
    for name, hours in overrides.items():
        if not (isinstance(hours, int | float) and math.isfinite(hours) and hours > 0):
            raise SpecError(
                f"field 'hours_override.{name}': {hours!r} is not a positive finite number of "
                "hours; give the re-forecast duration in hours.",
                field=f"hours_override.{name}",
            )
    return {k: float(v) for k, v in overrides.items()}


def machines_of(packages: tuple[ResolvedPackage, ...]) -> list[list[int]]:
    """The GPU lanes of each machine (one lot), numbered as the planner numbers lanes."""
    machines: list[list[int]] = []
    lane = 0
    for p in packages:
        for _ in range(p.count):
            machines.append(list(range(lane, lane + p.gpus_per_lot)))
            lane += p.gpus_per_lot
    return machines


def too_wide(what: str, width: int, packages: tuple[ResolvedPackage, ...]) -> SpecError:
    """The refusal of a run (``what`` names it) that needs ``width`` GPUs of one machine, more
    than any lot of ``packages`` has (the planner's and the preflight's, one paragraph)."""
    largest = max((p.gpus_per_lot for p in packages), default=0)
    lots = " + ".join(f"{p.count} {p.gpu} lot(s) of {p.gpus_per_lot} GPU(s)" for p in packages)
    return SpecError(
        f"{what}: a data-parallel run needs {width} GPUs of ONE machine, and the spec's lots "
        f"({lots}) have at most {largest} each. Separate lots are separate machines: GPU memory "
        f"and NVLink do not span them, so {width} GPUs of different lots cannot run it. Rent a "
        f"lot with {width} GPUs on one machine (a b200 lot has 2), or set gpus: {largest} for "
        "that run.",
        field="gpus",
    )


def step_widths(
    spec: CampaignSpec,
    names: list[str],
    runs: list[str | None],
    resources: list[str | None],
    packages: tuple[ResolvedPackage, ...],
) -> list[int]:
    """GPU lanes each step takes: its run's ``gpus`` for a GPU step, else 1.

    Raises:
        SpecError: A run needs more GPUs than any one machine (lot) of the spec has.
    """
    gpus: dict[str, int] = {}
    widths = []
    for run, resource in zip(runs, resources, strict=True):
        if resource != "gpu" or run is None or spec.control is None:
            widths.append(1)
            continue
        if run not in gpus:
            try:
                gpus[run] = run_size(spec.run_config(run)).processes
            except InputError:
                gpus[run] = 1  # an unknown run is reported where runs are checked
        widths.append(gpus[run])
    largest = max((p.gpus_per_lot for p in packages), default=0)
    for name, run, width in zip(names, runs, widths, strict=True):
        if width > largest:
            raise too_wide(
                f"calendar step '{name}' runs '{run}' with gpus: {width}", width, packages
            )
    return widths
