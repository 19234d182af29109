"""The e2e modules share the session's stack (tests/helpers/stack_fixtures.py).

A module that waits for the dead-run detector with runs that send a heartbeat every 30 s has
the stack's window shortened to a minute while it runs (``short_dead_run_window``), instead of
the stack's 300 s: minutes of waiting off the CI run, and nothing it checks changes.
"""

from __future__ import annotations

import pytest

#: The modules (by file name) whose runs wait for the detector and beat every 30 s.
WAIT_FOR_THE_DETECTOR = {"test_relaunch"}


@pytest.fixture(scope="module", autouse=True)
def _dead_run_window(request: pytest.FixtureRequest) -> None:
    if request.module.__name__.rsplit(".", 1)[-1] in WAIT_FOR_THE_DETECTOR:
        request.getfixturevalue("short_dead_run_window")
