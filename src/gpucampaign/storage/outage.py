"""A store's outage, said once for the whole process: once when the store stops answering,
once when it answers again, however many stores, tasks and threads meet it.

Every store object of a campaign's process (each task opens its own) reports here: a read that
waits (``readwait.ReadWait``) or an upload the spool takes instead (``spool.SpoolingStore``)
says the store is down, the next read or upload it answers says it is back. Only the first
report of an outage and the one that ends it are said, on the logger ``OUTAGE_LOGGER``, each
record carrying an ``OutageNote`` (attribute ``store_outage``) that the Prefect layer turns into
the flow run's log line and a notification (``orchestration/notify.py``). No credential is
said: the store by its URL, the error redacted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpucampaign.core.text import redact_secrets

OUTAGE_LOGGER = "gpucampaign.storage.outage"
log = logging.getLogger(OUTAGE_LOGGER)

DOWN = "down"
BACK = "back"


@dataclass(frozen=True)
class OutageNote:
    """What a record of ``OUTAGE_LOGGER`` said, as facts.

    Attributes:
        kind: ``DOWN`` (the store stopped answering) or ``BACK`` (it answers again).
        store: The store's URL (``s3://bucket/prefix``).
        what: What met the outage (``DOWN``: the read or upload that found it).
        error: What the store answered (``DOWN``), redacted.
        lasted_s: How long the outage lasted (``BACK``).
    """

    kind: str
    store: str
    what: str = ""
    error: str = ""
    lasted_s: float = 0.0


class Outages:
    """The open outages of this process, by store URL.

    Args:
        clock: Monotonic seconds.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._since: dict[str, float] = {}  # store URL -> when it stopped answering

    def is_down(self, store: str) -> bool:
        """True while an outage of ``store`` is open (said, not yet over)."""
        with self._lock:
            return store in self._since

    def down(self, store: str, *, what: str, error: object, then: str) -> bool:
        """``store`` did not answer ``what``: said when this opens its outage, else nothing.

        Args:
            store: The store's URL.
            what: What met the outage (``reading s3://.../LATEST``, ``uploading ...``).
            error: What the store answered.
            then: What happens meanwhile (the sentence's end: the read waits, the upload
                waits in the spool).

        Returns:
            True when this call said it (the first report of the outage).
        """
        with self._lock:
            if store in self._since:
                return False
            self._since[store] = self._clock()
        said = redact_secrets(str(error))
        note = OutageNote(kind=DOWN, store=store, what=what, error=said)
        log.warning(
            "store %s does not answer (%s): %s %s. Said once for this outage; the next line "
            "about this store says when it answers again",
            store,
            said,
            what,
            then,
            extra={"store_outage": note},
        )
        return True

    def back(self, store: str) -> bool:
        """``store`` answered: said when this ends its outage, else nothing (cheap: every
        answered request calls it).

        Returns:
            True when this call said it (the outage was open).
        """
        with self._lock:
            since = self._since.pop(store, None)
        if since is None:
            return False
        lasted = max(0.0, self._clock() - since)
        note = OutageNote(kind=BACK, store=store, lasted_s=lasted)
        log.warning(
            "store %s answers again after %s: the outage is over; reads go on and the spool "
            "uploads what waits in it",
            store,
            say_s(lasted),
            extra={"store_outage": note},
        )
        return True


#: The outages of this process: every store object reports here (tests pass their own).
OUTAGES = Outages()


def say_s(seconds: float) -> str:
    """A duration as said in a line: seconds below two minutes, minutes above."""
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"
