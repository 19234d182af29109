"""The campaign spec: one frozen pydantic object that every phase receives.

A spec is a YAML file. Only ``name``, ``packages``, ``window_hours`` (optional) and
``calendar`` are needed to plan; the training parts (corpus, control, variants, decision
rule...) may be absent until the campaign is run.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path, PurePosixPath
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

Tier = Literal["essential", "useful", "exploratory"]
TIERS: tuple[str, ...] = ("essential", "useful", "exploratory")
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
RECIPE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
BUILTIN_RECIPES: dict[str, str] = {
    "mlp": "gpucampaign.recipes.tabular:MLP",
    "cnn": "gpucampaign.recipes.tabular:CNN",
}


class SpecError(ValueError):
    """Invalid user input: one paragraph that names the field and the fix (CLI exit 2)."""

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(message)
        self.field = field


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Package(_Frozen):
    """One committed lot from the provider's catalog."""

    gpu: str = Field(
        description="GPU model of the lot as named in the catalog, e.g. 'rtx4090' or 'b200'."
    )
    days: int = Field(
        gt=0, description="Duration of the lot in days (3, 7 or 30 in the IteraGPU catalog)."
    )
    count: int = Field(default=1, ge=1, description="How many identical lots are committed.")
    price_usd: float | None = Field(
        default=None,
        gt=0,
        description="Price of ONE lot for its whole duration in USD; taken from the catalog "
        "when absent.",
    )
    order_ref: str | None = Field(
        default=None,
        max_length=80,
        description="The provider's order reference of this lot, shown in the report's budget "
        "to match against the invoice.",
    )

    starts_at: datetime | None = Field(
        default=None,
        description="When the lot starts (ISO 8601, e.g. '2026-03-02T09:00:00Z'; a time "
        "without a zone is read as UTC). Gives the rental's end: starts_at + days.",
    )
    order_ref: str | None = Field(
        default=None,
        max_length=200,
        description="The provider's order reference of the lot (for the expense ledger).",
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
        gt=0, description="Allotted duration in hours (a forecast, not a provider promise)."
    )
    after: tuple[str, ...] = Field(default=(), description="Names of the steps this one waits for.")
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


class CorpusSpec(_Frozen):
    """A fixed corpus file, pinned by its hash."""

    path: str = Field(
        description="Relative to the spec file's folder: a CSV or Parquet table for the built-in "
        "recipes; any file, or a folder pinned by its manifest, for your own recipe."
    )
    sha256: str = Field(
        pattern=r"^[0-9a-f]{64}$",
        description="sha256 the file must have, or of a folder's manifest (lower-case hex).",
    )
    id_column: str = Field(default="id", description="Column with the unique row identifier.")
    label_column: str = Field(default="label", description="Column with the integer class label.")
    split_column: str = Field(
        default="split", description="Column with the split name: train, val or test."
    )

    @field_validator("path")
    @classmethod
    def _inside(cls, v: str) -> str:
        return check_relative_path(v, field="corpus.path")


DATA_PATH_FIELDS: tuple[str, ...] = ("num_workers", "persistent_workers")
# Fields that change no number of a run: they are left out of its ID.
NOT_IN_RUN_ID = frozenset({"resume", *DATA_PATH_FIELDS})


class InputSpec(_Frozen):
    """A pinned input beyond the corpus (a base model, an adapter): a file or a folder."""

    path: str = Field(description="File or folder, relative to the spec file's folder.")
    sha256: str = Field(
        pattern=r"^[0-9a-f]{64}$",
        description="sha256 of the file, or of a folder's manifest (`campaign pin PATH`).",
    )

    @field_validator("path")
    @classmethod
    def _inside(cls, v: str) -> str:
        return check_relative_path(v, field="inputs.path")


class RunConfig(_Frozen):
    """Everything that defines one training run; any change gives a new run ID."""

    recipe: str = Field(
        default="mlp",
        description="'mlp' or 'cnn' (built in, over a feature table), or your own recipe by "
        "import path 'module.path:ClassName' (a gpucampaign.Recipe; the spec's folder is on "
        "sys.path first).",
    )
    args: dict[str, Any] = Field(
        default_factory=dict,
        description="Arguments of the recipe (ctx.args); a variant's 'args' merge into these.",
    )
    device: str = Field(
        default="auto",
        pattern=r"^(auto|cpu|cuda|cuda:\d+)$",
        description="'auto' (CUDA when present), 'cpu', 'cuda' or 'cuda:N'.",
    )
    hidden: tuple[int, ...] = Field(
        default=(64,), description="MLP hidden widths / CNN channel widths."
    )
    dropout: float = Field(default=0.0, ge=0, lt=1, description="Dropout probability.")
    optimizer: Literal["adam", "adamw", "sgd"] = Field(default="adam", description="Optimizer.")
    lr: float = Field(default=1e-3, gt=0, description="Peak learning rate.")
    weight_decay: float = Field(default=0.0, ge=0, description="Weight decay.")
    batch_size: int = Field(default=64, gt=0, description="Training batch size.")
    epochs: int = Field(default=20, gt=0, description="Planned epochs.")
    max_steps: int | None = Field(
        default=None, gt=0, description="Optional cap on optimizer steps."
    )
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        default="fp32", description="Autocast precision."
    )
    scheduler: Literal["none", "cosine", "step"] = Field(
        default="cosine", description="LR schedule."
    )
    seed: int = Field(default=0, ge=0, description="Seed of python/numpy/torch and the data order.")
    eval_every: int = Field(
        default=0, ge=0, description="Evaluate every N steps; 0 = at each epoch end."
    )
    threads: int = Field(
        default=1,
        ge=1,
        description="torch CPU threads; pinned because results differ across counts.",
    )
    resume: Literal["training", "inference"] = Field(
        default="training",
        description="After an interruption: 'training' resumes learning from the full saved "
        "state (model, optimizer, data order, RNG); 'inference' only restarts inference from "
        "the last good model. Not part of the run ID: it changes no result.",
    )
    num_workers: int = Field(
        default=0, ge=0, description="DataLoader worker processes (0: load in the loop)."
    )
    persistent_workers: bool = Field(
        default=False, description="Keep the DataLoader workers between epochs."
    )

    seeds: tuple[int, ...] = Field(
        default=(),
        exclude=True,
        description="Replicate seeds of the control: the first is the run itself, each other "
        "runs as its own run ID '<name>.s<seed>'; the verdict uses them all.",
    )

    def identity(self) -> dict[str, Any]:
        """The fields that define the run's numbers: all but the data path's knobs (the
        batches and their order are the same whoever loads them) and the resume mode."""
        return self.model_dump(mode="json", exclude=set(NOT_IN_RUN_ID))

    @field_validator("recipe")
    @classmethod
    def _recipe_name(cls, v: str) -> str:
        if v in BUILTIN_RECIPES or re.match(RECIPE_PATTERN, v):
            return v
        raise ValueError(
            f"recipe '{v}' is neither a built-in recipe {sorted(BUILTIN_RECIPES)} nor an import "
            "path 'module.path:ClassName'"
        )

    @property
    def builtin(self) -> bool:
        """True for the built-in table recipes (``mlp``, ``cnn``)."""
        return self.recipe in BUILTIN_RECIPES

    def steps_per_epoch(self, n_train: int) -> int:
        """Optimizer steps of one epoch over ``n_train`` rows (the last batch may be short)."""
        return -(-n_train // self.batch_size)

    def planned_steps(self, n_train: int) -> int:
        """Planned optimizer steps: ``epochs`` epochs over ``n_train`` rows, capped by
        ``max_steps``."""
        steps = self.epochs * self.steps_per_epoch(n_train)
        return min(steps, self.max_steps) if self.max_steps is not None else steps


class Variant(_Frozen):
    """A variant of the control: the factors it changes and why."""

    name: str = Field(pattern=NAME_PATTERN, description="Unique run name.")
    tier: Tier = Field(default="useful", description="essential | useful | exploratory.")
    changes: dict[str, Any] = Field(
        description="RunConfig fields this variant changes from the control."
    )
    combined: bool = Field(
        default=False,
        description="Set true to declare on purpose that several factors change at once.",
    )
    hypothesis: str = Field(default="", description="Which result would change the decision.")
    seeds: tuple[int, ...] = Field(
        default=(),
        description="Replicate seeds: the first is the run itself, each other runs as its own "
        "run ID '<name>.s<seed>'; the verdict uses them all.",
    )

    @field_validator("changes")
    @classmethod
    def _known(cls, v: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(v) - set(RunConfig.model_fields))
        if unknown:
            raise ValueError(
                f"unknown run setting(s) {unknown}; use some of {sorted(RunConfig.model_fields)}"
            )
        return v


class DecisionRule(_Frozen):
    """The rule that closes the campaign."""

    metric: str = Field(
        default="accuracy",
        pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$",
        description="Metric: 'accuracy', 'macro_f1' or 'loss' for the built-in recipes; any "
        "name your recipe's evaluate() returns.",
    )
    direction: Literal["maximize", "minimize"] = Field(
        default="maximize", description="Better is higher or lower."
    )
    threshold: float = Field(description="A run must reach this value to be acceptable.")
    min_gain: float = Field(
        default=0.0, ge=0, description="Gain over the control a variant needs to be adopted."
    )
    select_split: Literal["val", "test"] = Field(
        default="val", description="Split the winner is chosen on (never the report split)."
    )
    report_split: Literal["val", "test"] = Field(
        default="test", description="Split the chosen run's gain is reported and confirmed on."
    )

    @model_validator(mode="before")
    @classmethod
    def _no_single_split(cls, data: Any) -> Any:
        if isinstance(data, dict) and "split" in data:
            raise ValueError(
                "decision_rule.split: one split for choosing and reporting makes the reported "
                "gain optimistic; remove 'split' and use select_split (default val) and "
                "report_split (default test)"
            )
        return data

    @model_validator(mode="after")
    def _distinct_splits(self) -> DecisionRule:
        if self.select_split == self.report_split:
            raise ValueError(
                f"decision_rule: select_split and report_split are both '{self.report_split}'; "
                "choose on 'val' and report on 'test'"
            )
        return self

    def better(self, a: float, b: float) -> bool:
        """True when value ``a`` is strictly better than ``b`` under this rule."""
        return a > b if self.direction == "maximize" else a < b

    def meets(self, value: float) -> bool:
        """True when ``value`` reaches the threshold."""
        return value >= self.threshold if self.direction == "maximize" else value <= self.threshold


class StopRules(_Frozen):
    """Stop rules written before the experiments."""

    non_finite_loss: bool = Field(
        default=True, description="Stop a run whose loss is NaN or infinite."
    )
    below_threshold: bool = Field(
        default=True, description="Stop a run whose final metric misses the floor."
    )
    quality_floor: float | None = Field(
        default=None, description="Floor for 'below_threshold'; defaults to the decision threshold."
    )
    require_restart: bool = Field(
        default=True, description="Stop when no usable restart is verified."
    )


class PilotSpec(_Frozen):
    """The short pilot of each essential run."""

    steps: int = Field(default=20, gt=0, description="Optimizer steps of each pilot run.")


class CheckpointSpec(_Frozen):
    """Save policy."""

    every_steps: int | None = Field(
        default=None,
        gt=0,
        description="Fixed save interval in steps; absent = derived from measurements.",
    )
    keep: int = Field(default=3, ge=1, description="How many good checkpoints to keep.")
    interruption_hours: float = Field(
        default=24.0,
        gt=0,
        description="Expected time between interruptions M (hours), for Daly's interval.",
    )
    tolerable_loss_minutes: float = Field(
        default=30.0, gt=0, description="Most training time you accept to lose to an interruption."
    )


class StorageSpec(_Frozen):
    """Where checkpoints go; credentials never live here (environment only)."""

    url: str = Field(
        default="local",
        description="'local' (inside the output folder) or 's3://bucket/prefix' (endpoint and "
        "keys from the environment: GPUCAMPAIGN_S3_ENDPOINT, AWS_ACCESS_KEY_ID, "
        "AWS_SECRET_ACCESS_KEY).",
    )

    @field_validator("url")
    @classmethod
    def _scheme(cls, v: str) -> str:
        if v != "local" and not re.match(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$", v):
            raise ValueError(
                "use 'local' or 's3://bucket/prefix' (credentials go in the environment)"
            )
        return v


class DecisionPointSpec(_Frozen):
    """How the decision after the pilot is taken."""

    mode: Literal["auto", "ask"] = Field(
        default="auto", description="'auto', or 'ask' a person in the UI."
    )
    timeout_s: int = Field(
        default=600, gt=0, description="With 'ask': seconds before the automatic choice."
    )


class Expense(_Frozen):
    """An expense really incurred, kept apart from the rental price."""

    name: str = Field(description="What was paid for.")
    usd: float = Field(ge=0, description="Amount in USD, as paid.")
    note: str = Field(default="", description="Receipt or order reference.")


class DeliverySpec(_Frozen):
    """What counts as one delivery for the budget close."""

    unit: str | None = Field(
        default=None,
        description="Name of one delivered unit (e.g. 'corpus'); absent for a research decision.",
    )


class GpuLockSpec(_Frozen):
    """The Prefect global concurrency limit all GPU phases share."""

    name: str = Field(
        default="gpu", pattern=NAME_PATTERN, description="Global concurrency limit name."
    )
    timeout_s: float = Field(default=3600, gt=0, description="Longest wait for a GPU slot.")
    lease_s: int = Field(
        default=60,
        ge=60,
        description="Lease of a held slot; a dead holder's slot returns after it.",
    )


class CampaignSpec(_Frozen):
    """A training campaign that must end in a decision."""

    name: str = Field(
        pattern=NAME_PATTERN, description="Campaign name, used in IDs and folder names."
    )
    question: str = Field(default="", description="The decision the campaign must reach.")
    packages: tuple[Package, ...] = Field(min_length=1, description="Committed lots.")
    window_hours: float | None = Field(
        default=None,
        gt=0,
        description="Rental window; defaults to the shortest committed lot's duration.",
    )
    people: int = Field(default=1, ge=1, description="Number of human lanes.")
    calendar: tuple[Step, ...] = Field(
        min_length=1, description="End-to-end steps, human and machine."
    )
    catalog: str | None = Field(
        default=None, description="Extra catalog YAML, relative to the spec file."
    )
    corpus: CorpusSpec | None = Field(default=None, description="The fixed corpus.")
    inputs: dict[str, InputSpec] = Field(
        default_factory=dict,
        description="More pinned inputs by name (e.g. a base model), given to recipes as "
        "ctx.inputs[name].",
    )
    control: RunConfig | None = Field(default=None, description="The control run's configuration.")
    variants: tuple[Variant, ...] = Field(
        default=(), description="Variants, each changing few factors."
    )
    decision_rule: DecisionRule | None = Field(
        default=None, description="Metric, direction, threshold."
    )
    stop_rules: StopRules = Field(default_factory=StopRules, description="Stop rules.")
    pilot: PilotSpec = Field(default_factory=PilotSpec, description="Pilot settings.")
    checkpoint: CheckpointSpec = Field(
        default_factory=CheckpointSpec,
        description="Save policy: interval, checkpoints kept, interruptions.",
    )
    storage: StorageSpec = Field(default_factory=StorageSpec, description="Checkpoint storage.")
    decision_point: DecisionPointSpec = Field(
        default_factory=DecisionPointSpec, description="Decision point."
    )
    deliveries: DeliverySpec = Field(default_factory=DeliverySpec, description="Delivery unit.")
    expenses: tuple[Expense, ...] = Field(default=(), description="Other expenses really incurred.")
    gpu_lock: GpuLockSpec = Field(default_factory=GpuLockSpec, description="GPU lock settings.")

    @field_validator("catalog")
    @classmethod
    def _catalog_inside(cls, v: str | None) -> str | None:
        return None if v is None else check_relative_path(v, field="catalog")

    @model_validator(mode="after")
    def _consistent(self) -> CampaignSpec:
        _check_links(self.calendar)
        run_names = ["control"] + [v.name for v in self.variants]
        dup_runs = sorted({n for n in run_names if run_names.count(n) > 1})
        if dup_runs:
            raise ValueError(
                f"variants: duplicate run name(s) {dup_runs}; give every run a unique name"
            )
        for run, seeds in [("control", self.control.seeds if self.control else ())] + [
            (v.name, v.seeds) for v in self.variants
        ]:
            if len(set(seeds)) != len(seeds) or any(k < 0 for k in seeds):
                raise ValueError(
                    f"seeds of '{run}': {list(seeds)} repeats a seed or has a negative one; "
                    "give distinct seeds >= 0"
                )
        if self.variants and self.control is None:
            raise ValueError(
                "variants need a 'control' run configuration to change from; add 'control'"
            )
        for v in self.variants:
            assert self.control is not None
            try:
                merge_changes(self.control, v.changes)
            except ValidationError as exc:
                err = exc.errors()[0]
                raise ValueError(
                    f"variant '{v.name}': change {'.'.join(map(str, err['loc']))} is invalid: "
                    f"{err['msg']}"
                ) from None
        for s in self.calendar:
            if s.run is not None and s.run not in run_names:
                raise ValueError(
                    f"calendar step '{s.name}': run '{s.run}' is neither 'control' nor a "
                    "variant name"
                )
        return self

    # --- derived values -------------------------------------------------------------------
    @property
    def window(self) -> float:
        """The rental window in hours (explicit, or the shortest committed lot)."""
        if self.window_hours is not None:
            return self.window_hours
        return float(min(p.days for p in self.packages) * 24)

    def base_names(self) -> list[str]:
        """Control first, then variants in spec order (no replicates)."""
        return (["control"] if self.control is not None else []) + [v.name for v in self.variants]

    def seeds_of(self, run: str) -> tuple[int, ...]:
        """The replicate seeds a base run asks for (empty: one run, its own seed)."""
        if run == "control":
            return self.control.seeds if self.control is not None else ()
        return next((v.seeds for v in self.variants if v.name == run), ())

    def replicate_of(self, run: str) -> tuple[str, int] | None:
        """``(base run, seed)`` of a replicate run name ``<base>.s<seed>``; None otherwise."""
        base, sep, seed = run.rpartition(".s")
        if sep and seed.isdigit() and int(seed) in self.seeds_of(base)[1:]:
            return base, int(seed)
        return None

    def run_names(self) -> list[str]:
        """Control first, then variants in spec order, each followed by its replicates."""
        return [
            name
            for base in self.base_names()
            for name in [base, *(f"{base}.s{k}" for k in self.seeds_of(base)[1:])]
        ]

    def tier_of(self, run: str) -> str:
        """Tier of a run: the control is always essential; a replicate has its base's tier,
        except the control's replicates, which are useful (a missing one stops nothing)."""
        rep = self.replicate_of(run)
        if rep is not None:
            return "useful" if rep[0] == "control" else self.tier_of(rep[0])
        if run == "control":
            return "essential"
        return next(v.tier for v in self.variants if v.name == run)

    @property
    def decision_split(self) -> str:
        """The split the decision is reported on (the test split without a decision rule)."""
        return self.decision_rule.report_split if self.decision_rule else "test"

    @property
    def selection_split(self) -> str:
        """The split the winner is chosen on (val without a decision rule)."""
        return self.decision_rule.select_split if self.decision_rule else "val"

    def essential_runs(self) -> list[str]:
        """The runs without which the campaign cannot decide (the control first)."""
        return [r for r in self.run_names() if self.tier_of(r) == "essential"]

    def runs_by_tier(self) -> list[str]:
        """Every run, essential first, then useful, then exploratory (spec order within a tier)."""
        return sorted(self.run_names(), key=lambda r: TIERS.index(self.tier_of(r)))

    def run_config(self, run: str) -> RunConfig:
        """The resolved configuration of a run (control, or control + a variant's changes)."""
        if self.control is None:
            raise SpecError(
                "the spec has no 'control': add a control run configuration", field="control"
            )
        rep = self.replicate_of(run)
        if rep is not None:
            return self.run_config(rep[0]).model_copy(update={"seed": rep[1]})
        seeds = self.seeds_of(run)
        if run == "control":
            return self.control.model_copy(update={"seed": seeds[0]}) if seeds else self.control
        for v in self.variants:
            if v.name == run:
                cfg = merge_changes(self.control, v.changes)
                return cfg.model_copy(update={"seed": seeds[0]}) if seeds else cfg
        raise SpecError(f"no run named '{run}': use one of {self.run_names()}", field="run")

    def run_id(self, run: str) -> str:
        """``<name>-<10 hex of sha256(canonical JSON of the resolved run config)>``."""
        return f"{run}-{self.run_sha256(run)[:10]}"

    def run_sha256(self, run: str) -> str:
        """Full sha256 over the run's payload: config, pinned corpus and recipe file."""
        return run_payload_sha256(
            self.run_config(run), corpus_sha256=self.corpus.sha256 if self.corpus else None,
            inputs={k: v.sha256 for k, v in self.inputs.items()},
        )

    def needs_table(self) -> bool:
        """True when a run uses a built-in recipe, which reads the corpus as a feature table."""
        return any(self.run_config(r).builtin for r in self.run_names()) or self.control is None


def merge_changes(control: RunConfig, changes: dict[str, Any]) -> RunConfig:
    """The control with a variant's ``changes``; ``args`` merge key by key into the control's."""
    data = {**control.model_dump(), **changes}
    if "args" in changes:
        data["args"] = {**control.args, **(changes["args"] or {})}
    return RunConfig.model_validate(data)


def run_payload_sha256(
    config: RunConfig, *, corpus_sha256: str | None = None, inputs: dict[str, str] | None = None
) -> str:
    """sha256 of what defines a run: the config, the pinned corpus and the recipe's file.

    The recipe file's hash enters only for recipes given by import path, so editing that code
    gives a new run ID while the built-in recipes keep theirs.
    """
    payload: dict[str, Any] = {"config": config.identity(), "corpus_sha256": corpus_sha256}
    if inputs:
        payload["inputs"] = dict(inputs)
    if not config.builtin:
        from gpucampaign.recipe import recipe_file_sha256

        payload["recipe_sha256"] = recipe_file_sha256(config.recipe)
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()


def make_run_id(name: str, config: RunConfig, *, corpus_sha256: str | None = None) -> str:
    """Run ID: any change to the config, the pinned corpus or the recipe file gives a new ID."""
    return f"{name}-{run_payload_sha256(config, corpus_sha256=corpus_sha256)[:10]}"


def canonical_json(obj: Any) -> str:
    """Sorted keys, no spaces: the form every hash in the project is taken over."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def check_relative_path(value: str, *, field: str) -> str:
    """Refuse a path that is absolute or climbs out of its folder."""
    p = PurePosixPath(value.replace("\\", "/"))
    if not value or p.is_absolute() or ".." in p.parts or re.match(r"^[A-Za-z]:", value):
        raise ValueError(
            f"path '{value}' must stay inside the spec's folder: give a relative path without '..'"
        )
    return value


def _check_links(calendar: tuple[Step, ...]) -> None:
    """Unique step names, ``after`` links to known steps, and no cycle."""
    names = [s.name for s in calendar]
    dup = sorted(n for n, k in Counter(names).items() if k > 1)  # linear: calendars can be long
    if dup:
        raise ValueError(f"calendar: duplicate step name(s) {dup}; give every step a unique name")
    known = set(names)
    for s in calendar:
        missing = [a for a in s.after if a not in known]
        if missing:
            raise ValueError(
                f"calendar step '{s.name}': 'after' names unknown step(s) {missing}; "
                f"use names of steps in the calendar"
            )
    cycle = _find_cycle({s.name: s.after for s in calendar})
    if cycle:
        raise ValueError(
            "calendar: the 'after' links form a cycle "
            + " -> ".join(cycle)
            + "; remove one of these links"
        )


def _find_cycle(graph: dict[str, tuple[str, ...]]) -> list[str]:
    color: dict[str, int] = {}
    for root in graph:
        if color.get(root):
            continue
        stack: list[tuple[str, int]] = [(root, 0)]
        path: list[str] = []
        while stack:
            node, i = stack.pop()
            if i == 0:
                color[node] = 1
                path.append(node)
            deps = graph[node]
            if i < len(deps):
                stack.append((node, i + 1))
                nxt = deps[i]
                if color.get(nxt) == 1:
                    return path[path.index(nxt) :] + [nxt]
                if not color.get(nxt):
                    stack.append((nxt, 0))
            else:
                color[node] = 2
                path.pop()
    return []


_FIXES = {
    "extra_forbidden": "remove it or check its spelling (see `campaign schema`)",
    "missing": "add it",
    "greater_than": "give a positive number",
    "greater_than_equal": "give a larger number",
    "literal_error": "use one of the allowed values",
    "string_pattern_mismatch": "use letters, digits, '_', '.' or '-' (hashes: 64 lower-case hex)",
    "too_short": "give at least one entry",
}


def format_validation_error(exc: ValidationError, *, source: str) -> SpecError:
    """Turn pydantic's report into one paragraph that names the field and the fix."""
    parts = []
    first_field = ""
    errors = exc.errors()
    locs = [tuple(e["loc"]) for e in errors]
    # A container's "too short" is only the echo of its invalid item: keep the deeper error.
    errors = [
        e
        for e, loc in zip(errors, locs, strict=True)
        if not any(o != loc and o[: len(loc)] == loc for o in locs)
    ]
    for err in errors[:3]:
        loc = ".".join(str(x) for x in err["loc"] if not str(x).startswith("function-after"))
        loc = re.sub(r"\.(\d+)", r"[\1]", loc)
        msg = err["msg"].removeprefix("Value error, ")
        if not loc:
            # Cross-field checks start their message with the field they concern.
            first_field = first_field or msg.split(":")[0].split(" ")[0]
        first_field = first_field or loc
        fix = _FIXES.get(err["type"])
        given = err.get("input")
        shown = (
            ""
            if err["type"] in ("missing",) or isinstance(given, dict | list)
            else f" (got {given!r})"
        )
        head = f"field '{loc}': " if loc else ""
        parts.append(f"{head}{msg}{shown}" + (f"; fix: {fix}" if fix else ""))
    more = len(errors) - 3
    tail = f" ({more} more problem(s) after these)" if more > 0 else ""
    return SpecError(
        f"Invalid campaign spec {source}: " + "; ".join(parts) + tail + ".", field=first_field
    )


def parse_spec(data: Any, *, source: str = "<spec>") -> CampaignSpec:
    """Validate a mapping into a CampaignSpec, raising SpecError on bad input."""
    if not isinstance(data, dict):
        raise SpecError(
            f"Invalid campaign spec {source}: the top level must be a mapping of fields."
        )
    try:
        return CampaignSpec.model_validate(data)
    except ValidationError as exc:
        raise format_validation_error(exc, source=source) from None


def load_spec(path: str | Path) -> CampaignSpec:
    """Read and validate a YAML (or JSON) spec file."""
    p = Path(path)
    if not p.is_file():
        raise SpecError(
            f"Spec file '{p}' does not exist: give the path of a campaign YAML file.", field="SPEC"
        )
    from gpucampaign.recipe import use_recipe_dir

    use_recipe_dir(p.resolve().parent)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise SpecError(
            f"Spec file '{p}' is not valid YAML ({exc}); fix the syntax at that line."
        ) from None
    except UnicodeDecodeError as exc:
        raise SpecError(f"Spec file '{p}' is not UTF-8 text ({exc}); save it as UTF-8.") from None
    return parse_spec(data, source=f"'{p}'")


def resolve_inside(base: str | Path, relative: str, *, field: str) -> Path:
    """Resolve ``relative`` under ``base``; raise SpecError when it would escape ``base``."""
    root = Path(base).resolve()
    try:
        check_relative_path(relative, field=field)
    except ValueError as exc:
        raise SpecError(f"field '{field}': {exc}.", field=field) from None
    target = (root / relative).resolve()
    if target != root and root not in target.parents:
        raise SpecError(
            f"field '{field}': '{relative}' resolves outside '{root}' (through a link?); "
            "keep the file inside the spec's folder.",
            field=field,
        )
    return target


def spec_sha256(spec: CampaignSpec) -> str:
    """Hash of the validated spec's canonical JSON."""
    return hashlib.sha256(canonical_json(spec.model_dump(mode="json")).encode()).hexdigest()
