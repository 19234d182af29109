"""The fault line counts what its checks showed: an attempt to run planted code is counted as
refused only when nothing ran (after the check), as code run otherwise, never both."""

from __future__ import annotations


def test_a_refusal_is_counted_only_when_nothing_ran(faults) -> None:
    refused, ran = faults.get("code_runs_refused"), faults.get("code_ran")
    faults.code_attempt(ran=True)
    assert (faults.get("code_runs_refused"), faults.get("code_ran")) == (refused, ran + 1)
    faults.code_attempt(ran=False)
    assert (faults.get("code_runs_refused"), faults.get("code_ran")) == (refused + 1, ran + 1)
    # This test's own attempts are not the suite's: taken back.
    faults.add("code_runs_refused", -1)
    faults.add("code_ran", -1)
