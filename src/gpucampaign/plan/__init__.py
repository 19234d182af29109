"""The plan: tariffs, the rental window, the calendar (scheduler, options), the decision point."""

from gpucampaign.plan.calendar import Plan, plan
from gpucampaign.plan.decision import Decision, Reforecast, decide_after_pilot
from gpucampaign.plan.rental import Rental, rental_of
from gpucampaign.plan.tariffs import Catalog, format_usd, load_catalog, resolve_package

__all__ = [
    "Catalog",
    "Decision",
    "Plan",
    "Reforecast",
    "Rental",
    "plan",
    "decide_after_pilot",
    "format_usd",
    "load_catalog",
    "rental_of",
    "resolve_package",
]
