"""The garbage collector is paused while a bulk of objects is built, and left as it was."""

from __future__ import annotations

import gc

from gpucampaign.core.gcpause import without_gc_pauses
from gpucampaign.plan import calendar
from tests.helpers import one_lot_spec


def test_the_collector_is_off_inside_and_as_it_was_after():
    assert gc.isenabled()
    with without_gc_pauses():
        assert not gc.isenabled()
        with without_gc_pauses():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner one leaves it to the outer one
    assert gc.isenabled()
    gc.disable()
    try:
        with without_gc_pauses():
            pass
        assert not gc.isenabled()  # someone else turned it off: it stays off
    finally:
        gc.enable()


def test_planning_leaves_the_collector_on():
    plan = calendar.plan(one_lot_spec({"name": "s", "run": "control"}))
    assert plan.steps and gc.isenabled()
