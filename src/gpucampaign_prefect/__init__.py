"""The Prefect layer of gpucampaign, installed under the project's own name.

``flows`` (the ``@flow``s), ``tasks`` (one ``@task`` module per phase) and ``orchestration``
(what both share: the locks, the embedded server, notifications, the UI's views) live here,
with ``deployments/prefect.yaml``: one path each, in the checkout as in the wheel, so that an
installed ``campaign run`` works from any folder and no bare ``flows`` or ``tasks`` module
lands in site-packages, where it would shadow a user's own. Ranks, lowest first:
orchestration < tasks < flows (``tests/test_layers.py``).
"""

from __future__ import annotations

import importlib
from typing import Any

#: Everything the library's CLI takes from this layer, by name, and the module that defines it:
#: the one seam between them (``gpucampaign.cli.runner.load_flow`` imports this package and
#: calls ``entry``). A module is imported when one of its names is asked for, never before, so
#: importing the package loads no Prefect (``tests/test_layers.py`` checks the table).
ENTRIES: dict[str, str] = {
    "campaign": "flows.campaign",  # the campaign flow (`campaign run`)
    "deploy_project": "flows._deploy",  # `campaign deploy`
    "ensure_work_queues": "flows._deploy",  # `campaign worker`: its queues made on the server
    # The embedded server of `campaign run`:
    "spawn_early": "orchestration.embedded",
    "start_detached": "orchestration.embedded",
    "release": "orchestration.embedded",
    "stop": "orchestration.embedded",
    "preload_flow_start": "orchestration.embedded",
    "reap_stale": "orchestration.embedded",
    "require_named_server": "orchestration.embedded",  # a PREFECT_API_URL that answers
}


def entry(name: str) -> Any:
    """The layer's object ``name`` (one of ``ENTRIES``), its module imported now.

    Raises:
        KeyError: ``name`` is not one of the layer's entries.
    """
    return getattr(importlib.import_module(f"{__name__}.{ENTRIES[name]}"), name)
