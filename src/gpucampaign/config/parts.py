"""The parts of a campaign spec: lots, calendar steps, corpus, run configuration, rules and
settings (pydantic v2, frozen, unknown fields refused). ``spec`` assembles them."""

from __future__ import annotations

import json
import math
import re
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_serializer,
    model_validator,
)

from gpucampaign.config.trackinguri import check_tracking_uri
from gpucampaign.core.storageurl import LOCAL, check_url

Tier = Literal["essential", "useful", "exploratory"]

TIERS: tuple[str, ...] = ("essential", "useful", "exploratory")
#: The splits every run is evaluated on at its end (the engine's; the re-forecast counts them).
EVAL_SPLITS: tuple[str, ...] = ("val", "test")
#: The calls of a training's ``progress`` callback at its steps (``engine.live``).
LIVE_REPORTS = 50


def report_every(planned_steps: int) -> int:
    """The steps between two calls of the live view's ``progress`` callback at its steps
    (about 2% of the run; every step of a run under ``LIVE_REPORTS`` steps)."""
    return max(1, planned_steps // LIVE_REPORTS)


NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
# A Prefect limit name may also hold ':' (``gpu:<host>``, one limit per GPU host).
LIMIT_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$"
RECIPE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
# The limits of the spec's counts, sizes and durations: generous for any real campaign, small
# enough that no number overflows what uses it (a timedelta, a Decimal, numpy's seed, a loader).
MAX_BATCH_SIZE = 2**20
MAX_EPOCHS = 1_000_000_000
MAX_STEPS = 10**9
MAX_THREADS = 1024
MAX_WORKERS = 256
MAX_GPUS = 64
MAX_KEEP = 1000
MAX_PEOPLE = 1000
MAX_WIDTH = 2**16
MAX_LAYERS = 64
MAX_SEED = 2**32 - 1
MAX_LOT_DAYS = 3650
MAX_LOTS = 1000
MAX_HOURS = 87_600.0
MAX_USD = 1e9
MAX_WAIT_S = 30 * 86_400
MAX_ROUNDS = 5  # rounds of seeds a campaign may buy beyond its plan
DEFAULT_ROUNDS = 2
#: How long a read of an s3:// store waits for the store to answer again, by default.
DEFAULT_READ_WAIT_S = 900
MAX_LEASE_S = 86_400
# The limits of every list and mapping a spec can grow: each entry is work for the planner and
# the flow, so a count no campaign on a rented lot reaches is refused before anything runs.
MAX_SEEDS = 1000  # replicate seeds of one run
MAX_VARIANTS = 1000
MAX_RUNS = 10_000  # the control, the variants and all their replicates together
MAX_CALENDAR_STEPS = 10_000
MAX_PACKAGES = 100
MAX_INPUTS = 100
MAX_EXPENSES = 1000
MAX_ARGS = 1000  # keys of a recipe's args or of a variant's changes

Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]
Width = Annotated[int, Field(gt=0, le=MAX_WIDTH)]

BUILTIN_RECIPES: dict[str, str] = {
    "mlp": "gpucampaign.builtin.tabular:MLP",
    "cnn": "gpucampaign.builtin.tabular:CNN",
}


class _Frozen(BaseModel):
    # Every float of the spec is finite: NaN and infinities are refused where they are read.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


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


DATA_PATH_FIELDS: tuple[str, ...] = ("num_workers", "persistent_workers", "place_data")
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
        max_length=MAX_ARGS,
        description="Arguments of the recipe (ctx.args); a variant's 'args' merge into these.",
    )
    device: str = Field(
        default="auto",
        pattern=r"^(auto|cpu|cuda|cuda:\d+)$",
        description="'auto' (CUDA when present), 'cpu', 'cuda' or 'cuda:N'.",
    )
    hidden: tuple[Width, ...] = Field(
        default=(64,), max_length=MAX_LAYERS, description="MLP hidden widths / CNN channel widths."
    )
    dropout: float = Field(default=0.0, ge=0, lt=1, description="Dropout probability.")
    optimizer: Literal["adam", "adamw", "sgd"] = Field(default="adam", description="Optimizer.")
    lr: float = Field(default=1e-3, gt=0, description="Peak learning rate.")
    weight_decay: float = Field(default=0.0, ge=0, description="Weight decay.")
    batch_size: int = Field(default=64, gt=0, le=MAX_BATCH_SIZE, description="Training batch size.")
    epochs: int = Field(default=20, gt=0, le=MAX_EPOCHS, description="Planned epochs.")
    max_steps: int | None = Field(
        default=None, gt=0, le=MAX_STEPS, description="Optional cap on optimizer steps."
    )
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        default="fp32", description="Autocast precision."
    )
    scheduler: Literal["none", "cosine", "step"] = Field(
        default="cosine", description="LR schedule."
    )
    seed: int = Field(
        default=0, ge=0, le=MAX_SEED, description="Seed of python/numpy/torch and the data order."
    )
    eval_every: int = Field(
        default=0, ge=0, le=MAX_STEPS, description="Evaluate every N steps; 0 = at each epoch end."
    )
    threads: int = Field(
        default=1,
        ge=1,
        le=MAX_THREADS,
        description="torch CPU threads; pinned because results differ across counts.",
    )
    resume: Literal["training", "inference"] = Field(
        default="training",
        description="After an interruption: 'training' resumes learning from the full saved "
        "state (model, optimizer, data order, RNG); 'inference' only restarts inference from "
        "the last good model: the next start trains no further, keeps the latest verified "
        "checkpoint's model with its evaluation and predictions, and records the run as "
        "interrupted (evidence at that step, never an accepted delivery). Not part of the run "
        "ID: it changes no result of a run that is not interrupted.",
    )
    gpus: int = Field(
        default=1,
        ge=1,
        le=MAX_GPUS,
        description="Processes (one GPU each) that train this one run data-parallel, on ONE "
        "machine (torch.distributed, DistributedDataParallel; 'gloo' on CPU). The global batch "
        "is batch_size, split over the processes. Needs a lane of that many GPUs of one lot: "
        "the plan refuses it across lots. Part of the run ID when above 1.",
    )
    num_workers: int = Field(
        default=0,
        ge=0,
        le=MAX_WORKERS,
        description="DataLoader worker processes (0: load in the loop).",
    )
    persistent_workers: bool = Field(
        default=False, description="Keep the DataLoader workers between epochs."
    )
    place_data: Literal["auto", "device", "host"] = Field(
        default="auto",
        description="Where the training batches are cut. 'device': the train split (a "
        "TensorDataset, no collate_fn) is placed in the device's memory once and batched there, "
        "with the val and test splits when they are TensorDatasets that fit beside it; "
        "'host': batched on the CPU, each batch copied in (from pinned memory, on a side stream "
        "on CUDA); 'auto': 'device' on CUDA when the split takes at most a quarter of the free "
        "device memory, else 'host'. The same batches in the same order either way: not part "
        "of the run ID.",
    )

    seeds: tuple[Seed, ...] = Field(
        default=(),
        max_length=MAX_SEEDS,
        exclude=True,
        description="Replicate seeds of the control: the first is the run itself, each other "
        "runs as its own run ID '<name>.s<seed>'; the verdict uses them all.",
    )

    def identity(self) -> dict[str, Any]:
        """The fields that define the run's numbers: all but the data path's knobs (the
        batches and their order are the same whoever loads them) and the resume mode.

        ``gpus`` enters only above 1: the run IDs of every run written before the field
        existed (one process) stay the same, so their folders and checkpoints still verify.
        """
        return self.model_dump(mode="json", exclude=set(NOT_IN_RUN_ID))

    @model_serializer(mode="wrap")
    def _drop_one_gpu(self, handler: Any) -> dict[str, Any]:
        # gpus: 1 (the default) is left out of every dump: the run ID (``identity``), the spec's
        # sha256 and params.json of every run written before the field existed stay the same,
        # so their folders, checkpoints and manifests still verify.
        data: dict[str, Any] = handler(self)
        if data.get("gpus") == 1:
            del data["gpus"]
        if data.get("place_data") == "auto":  # the same for the data path's default
            del data["place_data"]
        return data

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
        max_length=MAX_ARGS, description="RunConfig fields this variant changes from the control."
    )
    combined: bool = Field(
        default=False,
        description="Set true to declare on purpose that several factors change at once.",
    )
    hypothesis: str = Field(default="", description="Which result would change the decision.")
    seeds: tuple[Seed, ...] = Field(
        default=(),
        max_length=MAX_SEEDS,
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
        default=True,
        description=(
            "Stop a run whose final metric is below the floor (maximize) or above the ceiling "
            "(minimize); its model and metric are kept as evidence for the verdict."
        ),
    )
    quality_floor: float | None = Field(
        default=None, description="Floor for 'below_threshold'; defaults to the decision threshold."
    )
    require_restart: bool = Field(
        default=True, description="Stop when no usable restart is verified."
    )
    futility: bool = Field(
        default=True,
        description=(
            "Stop a variant at an evaluation after the grace when the optimistic end of its "
            "paired interval against the control at the same step cannot clear the "
            "min gain (needs a recipe with score(); never the control, never on a tie, never "
            "before the control's metric moved from its first evaluation); its model is kept "
            "as evidence and its GPU lane goes to the next run."
        ),
    )
    not_learning: bool = Field(
        default=True,
        description=(
            "Stop a variant whose mean training loss, at an evaluation after the grace, is not "
            "below the mean of its first steps (scores or not; never the control nor its "
            "seeds); its model is kept as evidence and its GPU lane goes to the next run."
        ),
    )
    grace: float = Field(
        default=0.25,
        gt=0,
        le=1,
        description=(
            "Share of a run's planned steps before which neither 'futility' nor "
            "'not_learning' stops it (an untrained model predicts one class, or ties)."
        ),
    )

    def grace_step(self, *, planned: int) -> int:
        """The first step at which a run of ``planned`` steps may be stopped as futile or not
        learning: ``grace`` of its planned steps (at least one step)."""
        return max(1, math.ceil(self.grace * planned))


class PilotSpec(_Frozen):
    """The short pilot of each essential run."""

    steps: int = Field(
        default=20, gt=0, le=MAX_STEPS, description="Optimizer steps of each pilot run."
    )


class CheckpointSpec(_Frozen):
    """Save policy."""

    every_steps: int | None = Field(
        default=None,
        gt=0,
        le=MAX_STEPS,
        description="Fixed save interval in steps; absent = derived from measurements.",
    )
    keep: int = Field(
        default=3, ge=1, le=MAX_KEEP, description="How many good checkpoints to keep."
    )
    interruption_hours: float = Field(
        default=24.0,
        gt=0,
        le=MAX_HOURS,
        description="Expected time between interruptions M (hours), for Daly's interval.",
    )
    tolerable_loss_minutes: float = Field(
        default=30.0,
        gt=0,
        le=MAX_HOURS * 60,
        description="Most training time you accept to lose to an interruption.",
    )
    lot_end_margin_minutes: float = Field(
        default=0.0,
        ge=0,
        le=MAX_HOURS * 60,
        description="Minutes added to the margin a run keeps before its lot ends (lots with "
        "starts_at): the run saves, checks its checkpoint is off the machine and stops that "
        "long before the end, besides the margin measured from its own save, upload and "
        "read-back times.",
    )
    max_relaunches: int = Field(
        default=3,
        ge=0,
        le=100,
        description="How many times the stack relaunches a campaign whose flow run crashed "
        "(its machine or process died) on another worker, resuming from the store; 0: never "
        "(a relaunched run then refuses to start).",
    )


class StorageSpec(_Frozen):
    """Where checkpoints go; credentials never live here (environment only)."""

    url: str = Field(
        default=LOCAL,
        description="'local' (inside the output folder) or 's3://bucket/prefix' (endpoint and "
        "keys from the environment: AWS_ENDPOINT_URL (or AWS_ENDPOINT_URL_S3), "
        "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_DEFAULT_REGION, "
        "AWS_PROFILE; request timeouts GPUCAMPAIGN_S3_CONNECT_TIMEOUT_S (default 5) and "
        "GPUCAMPAIGN_S3_READ_TIMEOUT_S (default 25)).",
    )
    read_wait_s: int = Field(
        default=DEFAULT_READ_WAIT_S,
        ge=0,
        le=MAX_WAIT_S,
        description="With s3://: how long a read (a run's LATEST, a checkpoint, a mirrored "
        "folder) waits, retrying with backoff, for a store that does not answer, before the "
        "campaign stops (resumable: run it again once the store answers); never past the "
        "rental's end when the lots carry starts_at. 0: no waiting. Writes never wait: they "
        "go to the spool.",
    )

    @field_validator("url")
    @classmethod
    def _scheme(cls, v: str) -> str:
        return check_url(v)


class DecisionPointSpec(_Frozen):
    """How the decision after the pilot is taken."""

    mode: Literal["auto", "ask"] = Field(
        default="auto", description="'auto', or 'ask' a person in the UI."
    )
    timeout_s: int = Field(
        default=600,
        gt=0,
        le=MAX_WAIT_S,
        description="With 'ask': seconds before the automatic choice.",
    )
    rounds: int = Field(
        default=DEFAULT_ROUNDS,
        ge=0,
        le=MAX_ROUNDS,
        description="Rounds of seeds beyond the plan the campaign may buy while its verdict is "
        "inconclusive: each trains more seeds of the chosen variant and the control, when they "
        "fit the lot's spare time, and decides again (its error spent across the looks); 0 "
        "turns it off.",
    )


class Expense(_Frozen):
    """An expense really incurred, kept apart from the rental price."""

    name: str = Field(description="What was paid for.")
    usd: float = Field(ge=0, le=MAX_USD, description="Amount in USD, as paid.")
    note: str = Field(default="", description="Receipt or order reference.")


class DeliverySpec(_Frozen):
    """What counts as one delivery for the budget close."""

    unit: str | None = Field(
        default=None,
        description="Name of one delivered unit (e.g. 'corpus'); absent for a research decision.",
    )


class MlflowSpec(_Frozen):
    """Where a campaign's runs are tracked in MLflow (off unless set, or MLFLOW_TRACKING_URI)."""

    uri: str | None = Field(
        default=None,
        max_length=2000,
        description="Tracking server URI (http(s)://host:port); absent: MLFLOW_TRACKING_URI. "
        "Credentials go in the environment only (MLFLOW_TRACKING_USERNAME, "
        "MLFLOW_TRACKING_PASSWORD, MLFLOW_TRACKING_TOKEN), never in the spec.",
    )
    experiment: str | None = Field(
        default=None,
        min_length=1,
        max_length=500,
        description="MLflow experiment name; absent: the campaign's name.",
    )

    @field_validator("uri")
    @classmethod
    def _no_credentials(cls, v: str | None) -> str | None:
        # Checked, and kept, as normalized: a leading space must not hide a password.
        return None if v is None else check_tracking_uri(v)


class TrackingSpec(_Frozen):
    """Experiment tracking: off by default."""

    mlflow: MlflowSpec | None = Field(
        default=None, description="MLflow tracking: {uri, experiment}."
    )


class GpuLockSpec(_Frozen):
    """The Prefect global concurrency limit all GPU phases share."""

    name: str = Field(
        default="gpu",
        pattern=LIMIT_NAME_PATTERN,
        description="Global concurrency limit name ('gpu', or 'gpu:<host>' per GPU host).",
    )
    timeout_s: float = Field(
        default=3600, gt=0, le=MAX_WAIT_S, description="Longest wait for a GPU slot."
    )
    lease_s: int = Field(
        default=60,
        ge=60,
        le=MAX_LEASE_S,
        description="Lease of a held slot; a dead holder's slot returns after it.",
    )


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
