"""Several machines need one store they all reach: a deployment's run of a spec of several lots
with a local store is refused before anything is written or started.

A flow run of a deployment is where each lot's lanes are meant to run on that lot's machine
(a worker per machine, ``campaign worker --lot K``). Those machines write their runs into one
campaign folder through the store; a local store is a folder of one machine, which the others
cannot reach, so their runs would never meet. ``campaign run`` (the embedded server) keeps
today's way with a local store: every lane a thread of its one process on this machine.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpucampaign.config import CampaignSpec, SpecError
from gpucampaign.core.storageurl import is_s3
from gpucampaign.plan.lots import dated_lots
from gpucampaign.plan.machines import Machine


def refuse_machines_without_store(
    spec: CampaignSpec, *, machines: Sequence[Machine], deployment: bool
) -> None:
    """Refuse a deployment's run of several machines whose store is not ``s3://``.

    Args:
        spec: The campaign's spec (its ``storage.url``).
        machines: The plan's machines (one per lot).
        deployment: True when this run is a flow run of a deployment (its machines' workers
            would run the lanes); False for ``campaign run`` and a flow called directly.

    Raises:
        SpecError: Several machines, a deployment's run and a local store (one paragraph
            naming ``storage.url`` and the fix; nothing was written or started).
    """
    if not deployment or len(machines) < 2 or is_s3(spec.storage.url):
        return
    if dated_lots(spec):  # lots one after another: the lot-end hand-over's, on any store
        return
    names = ", ".join(m.name for m in machines)
    raise SpecError(
        f"field 'storage.url': the spec plans {len(machines)} machines ({names}) and this run "
        "of a deployment would run each lot's lanes on its own machine, but storage.url is "
        f"'{spec.storage.url}', a folder on one machine that the others cannot reach, so their "
        "runs could not meet in one campaign folder; nothing was written or started. Set "
        "`storage.url: s3://BUCKET/PREFIX` (a bucket every machine reaches, its keys in the "
        "environment), or rent one lot (`count: 1` and one package), or run the spec on one "
        "machine with `campaign run`, every lane a lane of its one process.",
        field="storage.url",
    )
