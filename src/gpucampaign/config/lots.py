"""The lots a campaign rents and the steps of its calendar (parts of a campaign spec)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Literal

from pydantic import Field, field_validator, model_validator

from gpucampaign.config.parts import (
    MAX_CALENDAR_STEPS,
    MAX_HOURS,
    MAX_LOT_DAYS,
    MAX_LOTS,
    MAX_USD,
    NAME_PATTERN,
    Tier,
    _Frozen,
)


class Package(_Frozen):
    """One committed lot from the provider's catalog."""

    gpu: str = Field(
        description="GPU model of the lot as named in the catalog, e.g. 'rtx4090' or 'b200'."
    )
    days: int = Field(
        gt=0,
        le=MAX_LOT_DAYS,
        description="Duration of the lot in days (3, 7 or 30 in the IteraGPU catalog).",
    )
    count: int = Field(
        default=1, ge=1, le=MAX_LOTS, description="How many identical lots are committed."
    )
    price_usd: float | None = Field(
        default=None,
        gt=0,
        le=MAX_USD,
        description="Price of ONE lot for its whole duration in USD; taken from the catalog "
        "when absent.",
    )
    order_ref: str | None = Field(
        default=None,
        max_length=200,
        description="The provider's order reference of this lot, shown in the report's budget "
        "to match against the invoice (and in the expense ledger).",
    )

    starts_at: datetime | None = Field(
        default=None,
        description="When the lot starts (ISO 8601, e.g. '2026-03-02T09:00:00Z'; a time "
        "without a zone is read as UTC). Gives the rental's end: starts_at + days.",
    )

    work_queue: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="The work queue of the campaign deployment's work pool whose workers run "
        "on this lot's machines. When an earlier lot ends while this one is open, the flow "
        "run hands the campaign over: it runs its own deployment again on this queue, with "
        "the same parameters and GPUCAMPAIGN_LOT naming this lot, and ends; the new run "
        "resumes from the store (an s3:// storage). Without it, a later lot is trained on by "
        "the same worker, unless that worker is pinned to the lot that ended.",
    )

    @field_validator("gpu")
    @classmethod
    def _lower(cls, v: str) -> str:
        return v.strip().lower()

    @field_validator("starts_at")
    @classmethod
    def _utc(cls, v: datetime | None) -> datetime | None:
        if v is None:
            return None
        return v.replace(tzinfo=UTC) if v.tzinfo is None else v.astimezone(UTC)

    @property
    def ends_at(self) -> datetime | None:
        """When the lot ends (``starts_at`` + ``days``), or ``None`` without ``starts_at``."""
        return None if self.starts_at is None else self.starts_at + timedelta(days=self.days)


class Step(_Frozen):
    """One row of the end-to-end calendar."""

    name: str = Field(
        pattern=NAME_PATTERN, description="Unique step name (letters, digits, '_', '.', '-')."
    )
    kind: Literal["human", "machine"] = Field(
        description="'human': preparation or analysis time of a person; 'machine': the machine "
        "is busy."
    )
    resource: Literal["gpu", "cpu", "none"] | None = Field(
        default=None,
        description="For machine steps: 'gpu' (takes a GPU lane), 'cpu' or 'none' (may overlap "
        "GPU work). Defaults to 'none' for machine steps; must be absent for human steps.",
    )
    hours: float = Field(
        gt=0,
        le=MAX_HOURS,
        description="Allotted duration in hours (a forecast, not a provider promise).",
    )
    after: tuple[str, ...] = Field(
        default=(),
        max_length=MAX_CALENDAR_STEPS,
        description="Names of the steps this one waits for.",
    )
    tier: Tier = Field(default="essential", description="essential | useful | exploratory.")
    run: str | None = Field(
        default=None,
        description="Name of the training run (control or a variant) this step executes; "
        "its hours are re-forecast from the pilot's measurements.",
    )
    phase: Literal["audit", "pilot", "decide", "restart", "predict", "close"] | None = Field(
        default=None,
        description="Campaign phase this step stands for, so its observed time can be compared "
        "with the allotted one.",
    )
    description: str = Field(default="", description="Free text: what the step does.")

    @model_validator(mode="after")
    def _resource(self) -> Step:
        if self.kind == "human" and self.resource not in (None, "none"):
            raise ValueError(
                f"step '{self.name}' is a human step but names resource '{self.resource}': "
                "remove 'resource' or make it a machine step"
            )
        if self.kind == "machine" and self.resource is None:
            object.__setattr__(self, "resource", "none")
        return self
