"""The campaign spec: ``CampaignSpec`` (pydantic, frozen), its parts, and how a file becomes one."""

from gpucampaign.config.lots import Package, Step
from gpucampaign.config.model import (
    CampaignSpec,
    format_validation_error,
    load_spec,
    parse_spec,
    read_mapping_file,
    resolve_inside,
    spec_sha256,
)
from gpucampaign.config.parts import (
    BUILTIN_RECIPES,
    CheckpointSpec,
    CorpusSpec,
    DecisionPointSpec,
    DecisionRule,
    DeliverySpec,
    Expense,
    GpuLockSpec,
    InputSpec,
    MlflowSpec,
    PilotSpec,
    RunConfig,
    StopRules,
    StorageSpec,
    TrackingSpec,
    Variant,
    canonical_json,
)
from gpucampaign.config.resolved import ResolvedRun, RunSize, run_size
from gpucampaign.config.trackinguri import check_tracking_uri
from gpucampaign.core.errors import SpecError

__all__ = [
    "BUILTIN_RECIPES",
    "CampaignSpec",
    "CheckpointSpec",
    "CorpusSpec",
    "DecisionPointSpec",
    "DecisionRule",
    "DeliverySpec",
    "Expense",
    "GpuLockSpec",
    "InputSpec",
    "MlflowSpec",
    "Package",
    "PilotSpec",
    "ResolvedRun",
    "RunConfig",
    "RunSize",
    "SpecError",
    "Step",
    "StopRules",
    "StorageSpec",
    "TrackingSpec",
    "Variant",
    "canonical_json",
    "check_tracking_uri",
    "format_validation_error",
    "load_spec",
    "parse_spec",
    "read_mapping_file",
    "resolve_inside",
    "run_size",
    "spec_sha256",
]
