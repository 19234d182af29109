"""The output folder: every file name and path (``layout``), its typed records, metrics."""

from gpucampaign.folder.layout import OutputFolder, read_manifest
from gpucampaign.folder.metrics import MetricsLog, read_metrics
from gpucampaign.folder.records import RunState, read_plan, read_stops, read_timeline, run_states
from gpucampaign.folder.runresult import RunResult

__all__ = [
    "MetricsLog",
    "OutputFolder",
    "RunResult",
    "RunState",
    "read_manifest",
    "read_metrics",
    "read_plan",
    "read_stops",
    "read_timeline",
    "run_states",
]
