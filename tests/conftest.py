"""Shared test setup: a quiet, isolated Prefect, and one Prefect test server per session.

The environment is set here, before any test module imports prefect: settings are read then.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

from gpucampaign.cli.runner import prefect_environment

# A private PREFECT_HOME: tests never touch ~/.prefect, a profile, or a server the user
# exported (after `make stack-up`, PREFECT_API_URL points at the real stack).
_PREFECT_HOME = tempfile.mkdtemp(prefix="gpucampaign-prefect-home-")
atexit.register(shutil.rmtree, _PREFECT_HOME, ignore_errors=True)
os.environ["PREFECT_HOME"] = _PREFECT_HOME
os.environ.pop("PREFECT_API_URL", None)
os.environ.pop("PREFECT_PROFILE", None)
os.environ.update(
    prefect_environment(logging_level=os.environ.get("PREFECT_LOGGING_LEVEL", "WARNING"))
)

import pytest  # noqa: E402

# The real stack and the campaign run on it, defined once here so tests/e2e and tests/faults
# share one stack per session (a fixture defined in two conftests would start two).
from tests.helpers import fuzzing  # noqa: E402
from tests.helpers.stack_fixtures import finished_campaign, short_dead_run_window, stack  # noqa: E402, F401


def pytest_configure(config):
    """The fast run (slow tests deselected) draws fewer property-test examples (``fuzzing``)."""
    fuzzing.FAST_RUN = fuzzing.deselects_slow(config.getoption("markexpr", ""))


@pytest.fixture(scope="session")
def prefect_harness():
    """One Prefect test server (temporary SQLite) for the whole session; ~15-20 s to start.

    Tests that run flows or use the GPU lock take this fixture; give each test its own
    names (limits, output folders) since the database is shared.
    """
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=None):
        yield


@pytest.fixture(scope="session")
def closed(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A clean closed output folder, built once per session (``build_closed_folder``: seconds
    of training and a close); read it, or change a private copy (``out``)."""
    from tests.helpers import build_closed_folder

    return build_closed_folder(tmp_path_factory.mktemp("closed"))


@pytest.fixture
def out(closed: dict, tmp_path):
    """A private copy of the ``closed`` folder for one test to change."""
    from pathlib import Path

    return Path(shutil.copytree(closed["out"], tmp_path / "out"))


def pytest_collection_modifyitems(config, items):
    """A test that takes the Prefect server fixture starts a server: mark it so."""
    for item in items:
        if "prefect_harness" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.server)
