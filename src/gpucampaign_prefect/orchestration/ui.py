"""What the Prefect UI shows of a training while it runs: its progress artifact and its table
of evaluations, and the one notification when checkpoint files stop leaving the machine."""

from __future__ import annotations

import logging
import math
import time
from typing import Any, cast
from uuid import UUID

from prefect.artifacts import (
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)

from gpucampaign.core.text import say_number
from gpucampaign.folder.layout import RunFolder
from gpucampaign.folder.metrics import read_metrics
from gpucampaign.folder.progress import evaluation_table, read_progress, render_line
from gpucampaign.storage import spooled_keys
from gpucampaign_prefect.orchestration import notify
from gpucampaign_prefect.orchestration.background import UiCalls
from gpucampaign_prefect.orchestration.phases import artifact_key

PROGRESS_EVERY_S = 2.0
#: The longest a training call's end waits for its live view's last updates to reach the API.
CLOSE_WAIT_S = 30.0


def evaluations_key(run_id: str, *, campaign: str) -> str:
    """The key of a run's evaluation table artifact: one per run of one campaign (its campaign
    ID), a new version per update. The run ID alone is a hash of the run's config, the same in
    two campaigns that train it: their rows would mix under one key."""
    return artifact_key("evaluations", campaign, run_id)


def rounded(x: Any) -> Any:
    """A number of the table to the digits the report prints (``say_number``), still a number;
    anything else as it is."""
    if isinstance(x, float) and math.isfinite(x):
        return float(say_number(x))
    return x


class TrainingView:
    """A training call's live view in the UI, updated once per PROGRESS_EVERY_S at most
    (short runs would otherwise spend more time reporting than training): the progress
    artifact (its description: loss, the last evaluation, the ETA), the run's table of
    evaluations (a new version under one key per run whenever a new evaluation is seen), and
    one notification when checkpoint files stop leaving the machine.

    Its API calls run on a thread of their own (``UiCalls``), in order: the training hands
    each update over and goes on. The artifact is made with the first update, once the
    training runs: never before its first step, nor beside the GPU lock's acquisition (see
    ``UiCalls.drain``). ``drain`` waits for the updates handed over; ``close`` (or
    ``finish``) ends the thread.

    It reads the run's folder through the ``RunFolder`` value it is given (its metrics, its
    progress record) and the campaign's through ``run_folder.out`` (the campaign ID, the
    spool): never a path joined again.
    """

    def __init__(
        self, phase: str, *, run_folder: RunFolder, campaign: str = "", store: Any = None
    ) -> None:
        run_id = run_folder.run_id
        self.id: UUID | None = None  # the progress artifact, once the UI's thread made it
        self.last = time.monotonic()
        self.description = f"{phase} of {run_id}"
        self.run_folder, self.run_id, self.campaign = run_folder, run_id, campaign
        self.store = store  # the checkpoint store: its URL and last refusal name the outage
        self.table_step: int | None = None  # the newest evaluation in the table artifact
        self.told_spool = False
        self.key = artifact_key(phase, run_id)
        self.calls = UiCalls(f"live view of {run_id}")
        self.created = False  # the artifact's creation handed over

    def start(self) -> None:
        """The training starts (its GPU slot held): the first update is due ``PROGRESS_EVERY_S``
        from now, not from the view's making. A call that waited that long for the slot would
        otherwise make the artifact at its first steps, API round trips beside them in a call
        too short to be shown at all."""
        self.last = time.monotonic()

    def _submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> None:
        if not self.created:
            self.created = True
            self.calls.submit(self._create)
        self.calls.submit(fn, *args, **kwargs)

    def _create(self) -> None:
        # sync_compatible: called from sync code, it returns the UUID, not a coroutine.
        self.id = cast(
            UUID, create_progress_artifact(progress=0.0, key=self.key, description=self.description)
        )

    def __call__(self, info: dict[str, Any]) -> None:
        if time.monotonic() - self.last < PROGRESS_EVERY_S:
            return
        self.last = time.monotonic()
        done = 100.0 * info["step"] / max(1, info["planned_steps"])
        self._submit(self._show, dict(info), progress=min(100.0, done))

    def _show(self, info: dict[str, Any], *, progress: float) -> None:
        # The description carries what the bar cannot: loss, the last evaluation, the ETA.
        self.description = render_line(info)
        if self.id is not None:
            update_progress_artifact(
                artifact_id=self.id, progress=progress, description=self.description
            )
        self.live_tables(info)

    def finish(self) -> None:
        """The full bar with the run's final live line (its last evaluation), and the last
        version of the evaluation table; then the UI's thread ends (``close``)."""
        self._submit(self._last)
        self.close()

    def _last(self) -> None:
        record = read_progress(self.run_folder.path)
        description = render_line(record) if record else f"{self.run_id}: done"
        if self.id is not None:
            update_progress_artifact(artifact_id=self.id, progress=100.0, description=description)
        self.live_tables(record or {}, final=True)

    def drain(self) -> None:
        """Wait (at most ``CLOSE_WAIT_S``) for the updates handed over so far."""
        self.calls.drain(timeout_s=CLOSE_WAIT_S)

    def close(self) -> None:
        """Wait (at most ``CLOSE_WAIT_S``) for the updates handed over, then end the UI's
        thread; called again, it only waits."""
        self.calls.close(timeout_s=CLOSE_WAIT_S)

    def live_tables(self, info: dict[str, Any], *, final: bool = False) -> None:
        """A new version of the evaluation table when a new evaluation is seen (always at the
        ``final`` call, after the last evaluation), then the spool check."""
        try:  # a live view is never worth stopping a training for
            seen = info.get("metric_step")
            if final or (seen is not None and seen != self.table_step):
                self.publish_table(info)
            if self.run_folder.out is not None and not self.told_spool:
                self.check_spool()
        except Exception as exc:
            logging.getLogger(__name__).debug("live tables of %s: %s", self.run_id, exc)

    def publish_table(self, info: dict[str, Any]) -> None:
        """A new version of the run's evaluation table (every evaluation so far, from
        metrics.jsonl, so a resumed run's table holds its earlier evaluations too)."""
        out = self.run_folder.out
        if out is None:
            return
        rows = read_metrics(self.run_folder.metrics)
        planned = int(info.get("planned_steps") or max((r.get("step", 0) for r in rows), default=0))
        table = evaluation_table(rows, metric=info.get("metric"), planned_steps=planned)
        if not table:
            return
        self.table_step = table[-1]["step"]
        campaign = notify.campaign_id_of(out) or self.campaign
        create_table_artifact(
            table=[{k: rounded(v) for k, v in row.items()} for row in table],
            key=evaluations_key(self.run_id, campaign=campaign),
            description=f"Evaluations of {self.run_id} on val"
            + (f": {render_line(info)}" if info else ""),
        )

    def check_spool(self) -> None:
        """Say once (a notification event) that the store stopped taking uploads, with the
        files now only on this machine and where they wait: what is at risk if the machine goes
        (``gpucampaign.storage.down`` says the outage itself, once for the campaign)."""
        out = self.run_folder.out
        pending = spooled_keys(out) if out is not None else []
        if out is not None and pending:
            self.told_spool = True
            notify.storage_unreachable(
                campaign=notify.campaign_id_of(out) or self.campaign,
                name=self.campaign,
                run_id=self.run_id,
                pending=len(pending),
                out=str(out),
                store=str(getattr(self.store, "url", "") or ""),
                error=str(getattr(self.store, "last_error", "") or ""),
            )
