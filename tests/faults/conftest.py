"""Shared setup of the fault suite: one counter that the tests feed, printed once at the end.

Tests take the ``faults`` fixture and call ``faults.add("kill_points_tried")`` and the like;
``pytest_terminal_summary`` prints the single line that says what was tried and survived.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path

import pytest

COUNTS: Counter[str] = Counter()
#: The variable naming the file a session writes its counts to (no line printed then).
COUNTS_FILE = "GPUCAMPAIGN_FAULT_COUNTS"
SUMMARY_KEYS = (
    "signals_sent",
    "stop_signals_sent",
    "saved_within_grace",
    "kill_points_tried",
    "kill_points_survived",
    "faults_injected",
    "faults_survived",
    "fuzzed_inputs",
    "preflight_refusals",
    "tracebacks",
    "secrets_leaked",
    "links_refused",
    "tampered_verified_without_code",
    "two_writers_refused",
    "stale_locks_taken_over",
    "dead_holders_freed",
    "orphan_servers_left",
    "s3_restarts_survived",
    "credential_forms_tried",
    "code_runs_refused",
    "code_ran",
    "stale_hosts_refused",
    "sealed_objects_rewritten",
)


class FaultCounter:
    """What the fault suite did: signals and saves, kill points, injected faults, inputs, leaks."""

    def add(self, key: str, n: int = 1) -> None:
        """Add ``n`` to the count ``key`` (one of ``SUMMARY_KEYS``)."""
        assert key in SUMMARY_KEYS, key
        COUNTS[key] += n

    def code_attempt(self, *, ran: bool) -> None:
        """One attempt to run code planted in a folder or a store, counted after its check:
        ``code_runs_refused`` when nothing ran, ``code_ran`` when it did (never both)."""
        self.add("code_ran" if ran else "code_runs_refused")

    def sent(self, signal_name: str) -> None:
        """Count one signal sent; SIGINT and SIGTERM (a cancellation's too) ask for a save."""
        self.add("signals_sent")
        if signal_name in ("SIGINT", "SIGTERM"):
            self.add("stop_signals_sent")

    def get(self, key: str) -> int:
        """The count ``key`` so far in this session."""
        return COUNTS[key]


@pytest.fixture
def faults() -> FaultCounter:
    """The session's fault counter."""
    return FaultCounter()


def summary_line() -> str:
    """``faults: signals sent N (N SIGINT/SIGTERM, N SIGKILL), runs saved within the grace
    N/N, kill points tried/survived N/N, ...``"""
    c = COUNTS
    stops = c["stop_signals_sent"]
    return (
        f"faults: signals sent {c['signals_sent']} ({stops} SIGINT/SIGTERM, "
        f"{c['signals_sent'] - stops} SIGKILL), runs saved within the grace "
        f"{c['saved_within_grace']}/{stops}, kill points tried/survived "
        f"{c['kill_points_tried']}/{c['kill_points_survived']}, faults injected/survived "
        f"{c['faults_injected']}/{c['faults_survived']}, fuzzed inputs tried {c['fuzzed_inputs']}, "
        f"preflight refusals {c['preflight_refusals']}, tracebacks seen {c['tracebacks']}, "
        f"secrets leaked {c['secrets_leaked']}, "
        f"links refused {c['links_refused']}, tampered folders verified without running their "
        f"code {c['tampered_verified_without_code']}, two-writer attempts refused "
        f"{c['two_writers_refused']}, stale locks taken over {c['stale_locks_taken_over']}, "
        f"dead holders whose slot came back {c['dead_holders_freed']}, orphan servers left "
        f"{c['orphan_servers_left']}, S3 restarts survived {c['s3_restarts_survived']}, "
        f"credential forms tried {c['credential_forms_tried']}, code-execution attempts "
        f"refused {c['code_runs_refused']} (code run {c['code_ran']}), stale hosts refused "
        f"over a sealed campaign {c['stale_hosts_refused']} (sealed objects rewritten "
        f"{c['sealed_objects_rewritten']})"
    )


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """One line at the end of the session; a session run beside another (``make test``)
    writes its counts to the file ``$GPUCAMPAIGN_FAULT_COUNTS`` instead, for one line over
    both (``python -m tests.faults.conftest FILE...``)."""
    counts_file = os.environ.get(COUNTS_FILE)
    if counts_file:
        Path(counts_file).write_text(json.dumps(COUNTS), encoding="utf-8")
    else:
        terminalreporter.write_line(summary_line())


if __name__ == "__main__":
    for path in map(Path, sys.argv[1:]):
        if path.is_file():  # none from a session that ended before its summary
            COUNTS.update(json.loads(path.read_text(encoding="utf-8")))
    print(summary_line())
