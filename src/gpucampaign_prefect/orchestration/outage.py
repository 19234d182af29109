"""A store's outage in the flow run's logs and in a notification, once each.

The library says an outage once for the process when it starts and once when it ends
(``gpucampaign.storage.outage``, on the logger ``OUTAGE_LOGGER``) and never imports Prefect;
``relay_outages`` hands those two lines, for as long as a campaign's flow runs, to the flow
run's logs (Prefect's API log handler, told the flow run's ID, so a line said from a thread
without a run context, the spool's uploads, gets there too) and emits
``gpucampaign.storage.down`` / ``gpucampaign.storage.recovered`` (``notify``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from prefect.context import FlowRunContext
from prefect.logging.handlers import APILogHandler

from gpucampaign.core.text import SecretsFilter
from gpucampaign.storage.outage import BACK, DOWN, OUTAGE_LOGGER, OutageNote
from gpucampaign_prefect.orchestration import notify

_log = logging.getLogger(__name__)


class OutageRelay(logging.Handler):
    """The outage lines of ``OUTAGE_LOGGER`` to a flow run's logs, and each as a notification.

    Args:
        flow_run_id: The flow run whose logs get the lines (None: notifications only).
        name: The campaign's name.
        out: Its output folder (its campaign ID is read from there when it is said).
    """

    def __init__(self, *, flow_run_id: str | None, name: str, out: str | Path) -> None:
        super().__init__(level=logging.INFO)
        self.flow_run_id = flow_run_id
        self.campaign_name, self.out = name, str(out)
        self.addFilter(SecretsFilter())
        self._api = APILogHandler()

    def emit(self, record: logging.LogRecord) -> None:
        """One outage line: to the run's logs, then notified."""
        note = getattr(record, "store_outage", None)
        if not isinstance(note, OutageNote):
            return
        try:
            if self.flow_run_id:
                line = logging.makeLogRecord(record.__dict__)
                line.flow_run_id = self.flow_run_id
                self._api.handle(line)
            campaign = notify.campaign_id_of(self.out) or self.campaign_name
            if note.kind == DOWN:
                notify.storage_down(
                    campaign=campaign,
                    name=self.campaign_name,
                    store=note.store,
                    what=note.what,
                    error=note.error,
                )
            elif note.kind == BACK:
                notify.storage_recovered(
                    campaign=campaign,
                    name=self.campaign_name,
                    store=note.store,
                    lasted_s=note.lasted_s,
                )
        except Exception as exc:  # a message never stops a campaign
            _log.debug("the outage line did not reach the run's logs: %s", exc)


@contextmanager
def relay_outages(*, name: str, out: str | Path) -> Iterator[OutageRelay]:
    """For the block's time, the store's outage lines go to the current flow run's logs and
    to the notification target (``OutageRelay``)."""
    ctx = FlowRunContext.get()
    flow_run = ctx.flow_run if ctx is not None else None
    relay = OutageRelay(
        flow_run_id=str(flow_run.id) if flow_run is not None else None, name=name, out=out
    )
    logger = logging.getLogger(OUTAGE_LOGGER)
    logger.addHandler(relay)
    try:
        yield relay
    finally:
        logger.removeHandler(relay)
