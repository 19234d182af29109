"""The close: verdict, budget, forecast vs actual, predictions, figures, report, manifest."""

from gpucampaign.close.closing import close_runs, seal_folder, write_closing_documents
from gpucampaign.close.verdict import decide_verdict

__all__ = ["close_runs", "decide_verdict", "seal_folder", "write_closing_documents"]
