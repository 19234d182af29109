"""The provider catalog: which lots exist, how many GPUs each holds, and what one costs.

A lot is rented for a fixed duration at a fixed price. The price covers the whole duration:
this module never divides it by hours, and nothing in the project shows a USD-per-hour
figure. Money is kept as :class:`decimal.Decimal` (two 3-day RTX 4090 lots cost exactly
94.28 USD) and rounded to cents only when presented.

The built-in catalog is the IteraGPU tariff sheet. A B200 lot holds two GPUs; its price is
not in our documents, so it is listed without one and a spec must give ``price_usd``.
Users add lots (or prices) with a YAML catalog file::

    provider: MyCloud            # optional
    lots:
      - {gpu: b200, days: 7, gpus: 2, price_usd: 1234.50}
      - {gpu: h100, days: 3, gpus: 8, price_usd: 2000}

A user lot replaces the built-in lot of the same GPU model and duration.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gpucampaign.config import (
    CampaignSpec,
    Package,
    SpecError,
    format_validation_error,
    read_mapping_file,
    resolve_inside,
)
from gpucampaign.config.parts import MAX_LOT_DAYS, MAX_USD
from gpucampaign.core.errors import ArgumentError

CENT = Decimal("0.01")
MAX_GPUS_PER_LOT = 1024
MAX_LOTS_IN_COMBINATION = 3
_COUNT_WORDS = {1: "one", 2: "two", 3: "three"}


@dataclass(frozen=True)
class LotOffer:
    """One rentable lot: a GPU model, how many GPUs it holds, its duration and its price."""

    gpu: str
    days: int
    gpus: int
    price_usd: Decimal | None
    provider: str = "IteraGPU"

    @property
    def hours(self) -> float:
        """Duration of the lot in hours."""
        return float(self.days * 24)

    def describe(self) -> str:
        """Human-readable name, e.g. ``3-day rtx4090 lot``."""
        return f"{self.days}-day {self.gpu} lot"


@dataclass(frozen=True)
class Catalog:
    """The lots a campaign may commit to."""

    lots: tuple[LotOffer, ...]

    def gpu_models(self) -> list[str]:
        """GPU model names, sorted."""
        return sorted({lot.gpu for lot in self.lots})

    def lots_of(self, gpu: str) -> list[LotOffer]:
        """Lots of one GPU model, shortest first."""
        return sorted((lot for lot in self.lots if lot.gpu == gpu), key=lambda lot: lot.days)

    def find(self, gpu: str, days: int) -> LotOffer | None:
        """The lot of that model and duration, or None."""
        return next((lot for lot in self.lots if lot.gpu == gpu and lot.days == days), None)


BUILTIN_CATALOG = Catalog(
    lots=(
        LotOffer("rtx4090", 3, 1, Decimal("47.14")),
        LotOffer("rtx4090", 7, 1, Decimal("110")),
        LotOffer("rtx4090", 30, 1, Decimal("390")),
        # The provider sells B200 lots of two GPUs; their price is not in our documents.
        LotOffer("b200", 3, 2, None),
        LotOffer("b200", 7, 2, None),
        LotOffer("b200", 30, 2, None),
    )
)


@dataclass(frozen=True)
class ResolvedPackage:
    """A committed package of the spec, completed from the catalog."""

    gpu: str
    days: int
    gpus_per_lot: int
    count: int
    price_usd: Decimal
    price_source: str  # "catalog" or "spec"
    catalog_price_usd: Decimal | None

    @property
    def hours(self) -> float:
        """Duration of one lot in hours."""
        return float(self.days * 24)

    @property
    def lanes(self) -> int:
        """GPU lanes this package gives the planner (GPUs per lot x lots)."""
        return self.gpus_per_lot * self.count

    @property
    def total_usd(self) -> Decimal:
        """Price of all lots of the package (the price is per lot, never per GPU)."""
        return self.price_usd * self.count

    def to_dict(self) -> dict[str, object]:
        """The ``packages[]`` entry of ``campaign plan --json``."""
        return {
            "gpu": self.gpu,
            "days": self.days,
            "gpus": self.gpus_per_lot,
            "count": self.count,
            "price_usd": usd(self.price_usd),
            "total_usd": usd(self.total_usd),
            "price_source": self.price_source,
        }


def usd(amount: Decimal | None) -> float | None:
    """Round to cents for presentation (JSON number); None stays None."""
    return None if amount is None else float(amount.quantize(CENT, rounding=ROUND_HALF_UP))


def format_usd(amount: Decimal | None) -> str:
    """``47.14 USD`` or ``price unknown``."""
    if amount is None:
        return "price unknown"
    return f"{amount.quantize(CENT, rounding=ROUND_HALF_UP)} USD"


def to_decimal(value: float | int | str | Decimal) -> Decimal:
    """Money from YAML/JSON numbers without binary-float noise (47.14 stays 47.14)."""
    return value if isinstance(value, Decimal) else Decimal(str(value))


# --- user catalog files ---------------------------------------------------------------------


class _LotEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    gpu: str = Field(description="GPU model name, e.g. 'b200'.")
    days: int = Field(gt=0, le=MAX_LOT_DAYS, description="Duration of the lot in days.")
    gpus: int = Field(ge=1, le=MAX_GPUS_PER_LOT, description="GPUs in one lot.")
    price_usd: float | None = Field(
        default=None, gt=0, le=MAX_USD, description="Price of one lot for its duration."
    )

    @field_validator("gpu")
    @classmethod
    def _lower(cls, v: str) -> str:
        return v.strip().lower()


class _CatalogFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    provider: str = Field(default="user catalog", description="Who sells these lots.")
    lots: tuple[_LotEntry, ...] = Field(min_length=1, description="The lots.")


def load_catalog(
    extra: str | Path | None = None,
    *,
    spec: CampaignSpec | None = None,
    base_dir: str | Path | None = None,
) -> Catalog:
    """The built-in catalog, extended (or overridden) by a user catalog file.

    Args:
        extra: Path of a YAML catalog file (already resolved).
        spec: A spec whose ``catalog`` field names the file, resolved inside ``base_dir``.
        base_dir: Folder of the spec file (needed when ``spec.catalog`` is set).

    Returns:
        The merged catalog: a user lot replaces the built-in lot with the same GPU and days.

    Raises:
        SpecError: The file is missing, invalid or outside the spec's folder (field ``catalog``).
    """
    if extra is None and spec is not None and spec.catalog is not None:
        if base_dir is None:
            raise SpecError(
                f"field 'catalog': the spec names catalog '{spec.catalog}' but the spec's folder "
                "is unknown; load the spec from its file (or pass base_dir) so the path resolves.",
                field="catalog",
            )
        extra = resolve_inside(base_dir, spec.catalog, field="catalog")
    if extra is None:
        return BUILTIN_CATALOG
    path = Path(extra)
    data = read_mapping_file(
        path,
        field="catalog",
        where="field 'catalog': ",
        missing=f"catalog file '{path}' does not exist; give the path of a YAML "
        "catalog file relative to the spec's folder, or remove 'catalog'.",
        not_mapping="must be a mapping with a 'lots' list; see the tariffs module docstring for "
        "the format.",
    )
    try:
        parsed = _CatalogFile.model_validate(data)
    except ValidationError as exc:
        err = format_validation_error(exc, source=f"catalog '{path}'")
        raise SpecError(f"field 'catalog': {err}", field="catalog") from None
    lots = {(lot.gpu, lot.days): lot for lot in BUILTIN_CATALOG.lots}
    for entry in parsed.lots:
        price = None if entry.price_usd is None else to_decimal(entry.price_usd)
        lots[(entry.gpu, entry.days)] = LotOffer(
            entry.gpu, entry.days, entry.gpus, price, parsed.provider
        )
    return Catalog(lots=tuple(sorted(lots.values(), key=lambda lot: (lot.gpu, lot.days))))


def resolve_package(pkg: Package, catalog: Catalog, *, index: int = 0) -> ResolvedPackage:
    """Complete a spec package with GPUs per lot and price from the catalog.

    Args:
        pkg: The spec's package.
        catalog: The catalog to look the lot up in.
        index: Position of the package in the spec, for error messages.

    Returns:
        The package with its GPUs per lot and a known price per lot.

    Raises:
        SpecError: Unknown GPU model (``packages[i].gpu``), unknown duration
            (``packages[i].days``) or no price anywhere (``packages[i].price_usd``).
    """
    where = f"packages[{index}]"
    lots = catalog.lots_of(pkg.gpu)
    if not lots:
        raise SpecError(
            f"field '{where}.gpu': unknown GPU model '{pkg.gpu}'; use one of "
            f"{catalog.gpu_models()}, or describe its lots (GPUs per lot, days, price) in a "
            "catalog file named by the spec's 'catalog' field.",
            field=f"{where}.gpu",
        )
    lot = catalog.find(pkg.gpu, pkg.days)
    if lot is None:
        days = ", ".join(str(x.days) for x in lots)
        raise SpecError(
            f"field '{where}.days': the catalog has no {pkg.days}-day {pkg.gpu} lot; use one of "
            f"{days} days, or add that lot to a catalog file named by 'catalog'.",
            field=f"{where}.days",
        )
    if pkg.price_usd is not None:
        price, source = to_decimal(pkg.price_usd), "spec"
    elif lot.price_usd is not None:
        price, source = lot.price_usd, "catalog"
    else:
        raise SpecError(
            f"field '{where}.price_usd': the catalog lists the {lot.describe()} ({lot.gpus} GPUs) "
            "without a price; give price_usd, the price you were quoted for one lot for its whole "
            "duration (the planner never invents a price).",
            field=f"{where}.price_usd",
        )
    return ResolvedPackage(
        gpu=pkg.gpu,
        days=pkg.days,
        gpus_per_lot=lot.gpus,
        count=pkg.count,
        price_usd=price,
        price_source=source,
        catalog_price_usd=lot.price_usd,
    )


# --- which lots cover a number of hours ------------------------------------------------------


@dataclass(frozen=True)
class Cover:
    """A lot, or lots of one GPU model back to back, that cover a number of hours."""

    gpu: str
    days: tuple[int, ...]
    gpus_per_lot: int
    total_hours: float
    slack_hours: float
    price_usd: Decimal | None
    requires: str

    def to_dict(self) -> dict[str, object]:
        """JSON form for ``campaign packages --json``."""
        return {
            "gpu": self.gpu,
            "lots": [{"days": d} for d in self.days],
            "gpus_per_lot": self.gpus_per_lot,
            "total_hours": self.total_hours,
            "slack_hours": self.slack_hours,
            "price_usd": usd(self.price_usd),
            "requires": self.requires,
        }


def packages_covering(
    hours: float,
    *,
    gpu: str | None = None,
    catalog: Catalog | None = None,
    restore_s: float | None = None,
) -> list[Cover]:
    """Lots and back-to-back combinations (up to three lots of one GPU model) covering ``hours``.

    Only minimal combinations are listed: removing any lot would leave the hours uncovered.

    Args:
        hours: Hours the calendar needs (its span).
        gpu: Restrict to one GPU model.
        catalog: Catalog to use; the built-in one by default.
        restore_s: The restore time a campaign recorded (``estimates.json``): what each switch
            to the next back-to-back lot costs; None when not yet measured.

    Returns:
        Priced covers cheapest first (then fewest lots, then least slack), followed by covers
        whose price is not in the catalog.

    Raises:
        SpecError: ``hours`` is not a positive number (``--hours``) or the GPU is unknown
            (``--gpu``).
    """
    catalog = catalog or BUILTIN_CATALOG
    if not hours > 0 or hours == float("inf"):
        raise ArgumentError(
            f"field '--hours': {hours} is not a positive number of hours; give the span your "
            "calendar needs, e.g. --hours 78.",
            field="--hours",
        )
    models = catalog.gpu_models()
    if gpu is not None:
        gpu = gpu.strip().lower()
        if gpu not in models:
            raise ArgumentError(
                f"field '--gpu': unknown GPU model '{gpu}'; use one of {models}.", field="--gpu"
            )
        models = [gpu]
    covers: list[Cover] = []
    for model in models:
        lots = catalog.lots_of(model)
        for n in range(1, MAX_LOTS_IN_COMBINATION + 1):
            for combo in itertools.combinations_with_replacement(lots, n):
                total = sum(lot.hours for lot in combo)
                if total < hours or total - min(lot.hours for lot in combo) >= hours:
                    continue  # does not cover, or is not minimal
                covers.append(_cover(combo, hours, restore_s=restore_s))
    priced = sorted(
        (c for c in covers if c.price_usd is not None),
        key=lambda c: (c.price_usd, len(c.days), c.slack_hours, c.gpu),
    )
    unpriced = sorted(
        (c for c in covers if c.price_usd is None),
        key=lambda c: (c.gpu, len(c.days), c.slack_hours),
    )
    return priced + unpriced


def _switch_cost(n_switches: int, *, restore_s: float | None) -> str:
    """What moving to the next lot costs, from the recorded restore time only."""
    if restore_s is None:
        return (
            "each switch costs a restore whose time is not recorded yet (run `campaign "
            "restart-check`, or give --calibrate-from OUT of a closed campaign)"
        )
    return (
        f"{n_switches} switch(es), each costing the recorded restore time of {restore_s:.3g} s "
        "plus moving the state"
    )


def _cover(combo: Sequence[LotOffer], hours: float, *, restore_s: float | None = None) -> Cover:
    first = combo[0]
    total = sum(lot.hours for lot in combo)
    known = all(lot.price_usd is not None for lot in combo)
    price = sum((lot.price_usd for lot in combo if lot.price_usd is not None), Decimal(0))
    gpus = f" ({first.gpus} GPUs per lot)" if first.gpus > 1 else ""
    if len(combo) == 1:
        requires = f"one {first.describe()}{gpus}: the whole calendar inside one rental"
    else:
        days = sorted({lot.days for lot in combo})
        if len(days) == 1:
            what = f"{_COUNT_WORDS[len(combo)]} {first.days}-day {first.gpu} lots"
        else:
            what = " + ".join(f"{lot.days}-day" for lot in combo) + f" {first.gpu} lots"
        requires = (
            f"{what} back to back{gpus}: the state (checkpoints and outputs) moved off each lot "
            "before it ends and a restart from the last checkpoint on the new lot; "
            + _switch_cost(len(combo) - 1, restore_s=restore_s)
        )
    if not known:
        requires += (
            f"; price not in catalog: give price_usd in your catalog (--catalog), where the "
            f"{first.gpu} lot durations are confirmed too: neither is assumed"
        )
    return Cover(
        gpu=first.gpu,
        days=tuple(lot.days for lot in combo),
        gpus_per_lot=first.gpus,
        total_hours=total,
        slack_hours=round(total - hours, 6),
        price_usd=price if known else None,
        requires=requires,
    )
