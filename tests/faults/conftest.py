"""Shared setup of the fault suite: one counter that the tests feed, printed once at the end.

Tests take the ``faults`` fixture and call ``faults.add("kill_points_tried")`` and the like;
``pytest_terminal_summary`` prints the single line that says what was tried and survived.
"""

from __future__ import annotations

from collections import Counter

import pytest

COUNTS: Counter[str] = Counter()
SUMMARY_KEYS = (
    "signals_sent",
    "kill_points_tried",
    "kill_points_survived",
    "faults_injected",
    "faults_survived",
    "fuzzed_inputs",
    "tracebacks",
    "secrets_leaked",
)


class FaultCounter:
    """What the fault suite did: signals, kill points, injected faults, fuzzed inputs, leaks."""

    def add(self, key: str, n: int = 1) -> None:
        """Add ``n`` to the count ``key`` (one of ``SUMMARY_KEYS``)."""
        assert key in SUMMARY_KEYS, key
        COUNTS[key] += n

    def get(self, key: str) -> int:
        """The count ``key`` so far in this session."""
        return COUNTS[key]


@pytest.fixture
def faults() -> FaultCounter:
    """The session's fault counter."""
    return FaultCounter()


def summary_line() -> str:
    """``faults: signals sent N, kill points tried/survived N/N, ...``"""
    c = COUNTS
    return (
        f"faults: signals sent {c['signals_sent']}, kill points tried/survived "
        f"{c['kill_points_tried']}/{c['kill_points_survived']}, faults injected/survived "
        f"{c['faults_injected']}/{c['faults_survived']}, fuzzed inputs tried {c['fuzzed_inputs']}, "
        f"tracebacks seen {c['tracebacks']}, secrets leaked {c['secrets_leaked']}"
    )


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """One line at the end of the session."""
    terminalreporter.write_line(summary_line())
