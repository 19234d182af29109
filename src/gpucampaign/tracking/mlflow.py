"""MLflow tracking of a campaign: optional, off by default, never in the way of training.

Where: the spec's ``tracking.mlflow.uri``, else ``MLFLOW_TRACKING_URI``; neither: off.
``GPUCAMPAIGN_TRACKING=off`` switches it off whatever they say (the restart check's children
train runs that are not the campaign's).

What: one MLflow experiment per campaign (``tracking.mlflow.experiment``, else the campaign's
name); in it one parent run per campaign (run name and tag ``gpucampaign.campaign_id``; the
verdict and the budget as tags, the report and the figures as artifacts, at the close:
``track_close`` in ``campaign.py``) and one child run per campaign run (run name = run ID, tags
``gpucampaign.run_id`` and ``gpucampaign.config_sha256``; params: the run config and the
factors it changes from the control; metrics by step: ``train/loss``, ``train/lr``,
``<split>/<metric>`` at every evaluation, ``final/<split>/<metric>`` at the end,
``checkpoint/save_s``).

How (``RunTracker``, fed by the loop's tracker hook): the training thread only queues the
metrics of each ``metrics.jsonl`` row; a sender thread appends them to the run folder's outbox
(``mlflow-outbox.jsonl``) and sends them with ``MlflowClient.log_batch`` every few seconds and
at each evaluation and checkpoint. A server that does not answer costs one warning: the metrics
stay in the outbox and go at the next flush that gets through (a later start of the run, or the
campaign's close, sends what an earlier one left; after a close the server missed, ``campaign
track OUT``: ``track_sealed``, which reads the sealed folder and writes nothing into it; both in
``campaign.py``). ``mlflow.json`` in the run folder keeps the MLflow run ID and, per metric, the
last step sent; the MLflow run ID is also put in every checkpoint's meta (``META_KEY``), so a
resume, on another host too, continues the same MLflow run (whose metric history then tells what
was sent). A fresh output folder on another host takes the campaign ID from the bucket
(``storage/sharedtimeline.py``), so its runs find the same parent run, and their own by tags.
A (metric, step) is sent once: a step retrained after a resume is not logged again.

The client is ``MlflowClient`` (several runs share a process: no fluent global run). Credentials
never go in the spec, params, tags or any file: MLflow reads them from its own environment
variables, and a URI from the environment that holds some is said and kept redacted.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from gpucampaign.config import CampaignSpec, ResolvedRun, SpecError
from gpucampaign.core.files import atomic_write_bytes, json_bytes
from gpucampaign.core.text import redact_logging, redact_secrets
from gpucampaign.folder.layout import MLFLOW_OUTBOX_FILE, MLFLOW_STATE_FILE, RunFolder
from gpucampaign.folder.records import read_campaign_id

log = logging.getLogger(__name__)

META_KEY = "mlflow_run_id"  # in every checkpoint's meta.json
OFF_ENV = "GPUCAMPAIGN_TRACKING"
ENV_URI = "MLFLOW_TRACKING_URI"
# What MLflow sends a server as credentials, read from the environment only.
CREDENTIAL_ENV = (
    "MLFLOW_TRACKING_USERNAME",
    "MLFLOW_TRACKING_PASSWORD",
    "MLFLOW_TRACKING_TOKEN",
    "MLFLOW_TRACKING_AUTH",
    "MLFLOW_TRACKING_AWS_SIGV4",
    "MLFLOW_TRACKING_CLIENT_CERT_PATH",
)
TAG = "gpucampaign."
FLUSH_EVERY_S = 5.0
CLOSE_WAIT_S = 30.0
BATCH_METRICS = 1000  # log_batch takes at most 1000 metrics ...
BATCH_PARAMS = 100  # ... and 100 params per call
MAX_VALUE = 5000  # params and tags are cut to this many characters
_EVAL_FIELDS = {"kind", "step", "epoch", "split", "eval_s", "final"}

Record = tuple[str, float, int, int]  # key, value, step, timestamp (ms)
_WARNED: set[str] = set()  # the servers said to be down in this process


def short_error(exc: BaseException) -> str:
    """A failed request in a few words (MLflow's own message repeats the URL three times)."""
    text = redact_secrets(str(exc))  # before it is cut: a cut URL would hide its password
    for marker, said in (
        ("Connection refused", "connection refused"),
        ("timed out", "timed out"),
        ("Name or service not known", "unknown host"),
    ):
        if marker in text:
            return said
    return f"{type(exc).__name__}: {text[:200]}"


def tracking_off() -> bool:
    """``GPUCAMPAIGN_TRACKING=off`` (or 0, false, no): tracking off whatever else says."""
    return os.environ.get(OFF_ENV, "").strip().lower() in ("off", "0", "false", "no")


def tracking_uri(spec: CampaignSpec) -> str | None:
    """The tracking URI in force: the spec's, else ``MLFLOW_TRACKING_URI``; None: off."""
    if tracking_off():
        return None
    m = spec.tracking.mlflow
    if m is not None and m.uri:
        return m.uri
    return os.environ.get(ENV_URI) or None


def experiment_name(spec: CampaignSpec) -> str:
    """The campaign's MLflow experiment: ``tracking.mlflow.experiment``, else its name."""
    m = spec.tracking.mlflow
    return m.experiment if m is not None and m.experiment else spec.name


def make_client(uri: str) -> Any:
    """An ``MlflowClient`` for ``uri`` (mlflow imported here only).

    Raises:
        SpecError: Tracking is on but mlflow is not installed.
    """
    try:
        from mlflow.tracking import MlflowClient
    except ImportError as exc:
        raise SpecError(
            f"MLflow tracking is on (tracking.mlflow in the spec, or MLFLOW_TRACKING_URI={uri}) "
            "but mlflow is not installed: pip install 'gpucampaign[tracking]', or switch "
            "tracking off (remove tracking.mlflow, unset MLFLOW_TRACKING_URI).",
            field="tracking.mlflow",
        ) from exc
    # Whatever process tracks (the CLI, a worker's flow, a data-parallel rank), no log record
    # of it, mlflow's own included, says a credential of the URI.
    redact_logging()
    # A server that is down answers in seconds, not after MLflow's default minutes of retries.
    # (A failed send is tried again at the next flush: no retries inside one.)
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
    # Ending a run prints its URL to stdout: not in the middle of the campaign's live lines.
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    return MlflowClient(tracking_uri=uri)


def campaign_id_of(root: Path, spec: CampaignSpec) -> str:
    """The campaign ID of output folder ``root`` (``campaign.json``), else the spec's name."""
    return read_campaign_id(root) or spec.name


def row_records(row: Mapping[str, Any], *, ts: int) -> list[Record]:
    """The metrics of one ``metrics.jsonl`` row (finite numbers only)."""
    kind, step = row.get("kind"), row.get("step")
    if not isinstance(step, int):
        return []
    if kind == "train":
        pairs = {"train/loss": row.get("loss"), "train/lr": row.get("lr")}
    elif kind == "eval":
        prefix = ("final/" if row.get("final") else "") + f"{row.get('split')}/"
        pairs = {prefix + k: v for k, v in row.items() if k not in _EVAL_FIELDS}
    elif kind == "checkpoint":
        pairs = {"checkpoint/save_s": row.get("save_s")}
    else:
        return []
    return [
        (k, float(v), step, ts)
        for k, v in pairs.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    ]


def _flat(prefix: str, value: Any, out: dict[str, str]) -> None:
    if isinstance(value, Mapping):
        for k, v in value.items():
            _flat(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        out[prefix] = text[:MAX_VALUE]


def run_identity(spec: CampaignSpec, run: ResolvedRun) -> tuple[dict[str, str], dict[str, str]]:
    """The child run's tags and params: its IDs, its config, the factors changed from the control.

    Returns:
        ``(tags, params)``.
    """
    config = run.config.model_dump(mode="json")
    control = spec.control.model_dump(mode="json") if spec.control is not None else config
    changed = {k: v for k, v in config.items() if control.get(k) != v}
    params: dict[str, str] = {}
    _flat("", config, params)
    _flat("factor", changed, params)
    factor = ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(changed.items()))
    tags = {
        f"{TAG}run_id": run.run_id,
        f"{TAG}run": run.name,
        f"{TAG}config_sha256": run.config_sha256,
        f"{TAG}tier": spec.tier_of(run.name),
        f"{TAG}factor": (factor or "none (the control)")[:MAX_VALUE],
    }
    return tags, params


class RunTracker:
    """The MLflow run of one campaign run, fed from the training thread, sent from its own.

    Args:
        client: An ``MlflowClient`` (or a stand-in with the same methods).
        uri: The tracking URI, for messages and ``mlflow.json``: kept redacted (the client
            has the URI it needs; a credential is never said or written).
        experiment: The experiment's name.
        campaign_id: The campaign's ID (the parent run's name).
        run_folder: The run folder: ``mlflow.json`` and the outbox live there.
        run_id: The campaign run's ID.
        tags: The child run's tags (``run_identity``).
        params: Its params.
        known_run_id: The MLflow run ID a checkpoint recorded, if any.
        restored_step: The step training restarts from (outbox records after it are dropped:
            those steps are trained again); None: keep them all (a replay, no training).
        flush_every_s: Seconds between two flushes of the sender thread.
        sealed: The run folder is sealed (a closed campaign's): nothing is written into it,
            and what the MLflow run already holds is asked of the server, not of the folder,
            so a (metric, step) it has is never sent again, however often this runs.
    """

    def __init__(
        self,
        *,
        client: Any,
        uri: str,
        experiment: str,
        campaign_id: str,
        run_folder: Path,
        run_id: str,
        tags: Mapping[str, str],
        params: Mapping[str, str],
        known_run_id: str | None = None,
        restored_step: int | None = None,
        flush_every_s: float = FLUSH_EVERY_S,
        sealed: bool = False,
    ) -> None:
        self.client = client
        self.sealed = sealed
        self.uri = redact_secrets(uri)
        self.experiment = experiment
        self.campaign_id = campaign_id
        self.folder = Path(run_folder)
        self.run_id = run_id
        self.tags = dict(tags)
        self.params = dict(params)
        state = self._read_state()
        if state.get("uri") not in (None, self.uri):  # another server: its run IDs mean nothing
            state, known_run_id = {}, None
        self.mlflow_run_id: str | None = known_run_id or state.get("mlflow_run_id")
        # Without our own record of what was sent, the server's metric history tells it.
        sent = {} if sealed else state.get("sent", {})
        self._sent: dict[str, int] = {str(k): int(v) for k, v in sent.items()}
        self._history = sealed or (not state and self.mlflow_run_id is not None)
        self._on_server: dict[str, set[int]] = {}  # sealed: the steps each metric has there
        self.status: str | None = state.get("status")
        self.sent_count = 0
        self.down = False
        self.error: str | None = None
        self._connected = False
        outbox = self._read_outbox()
        self._pending = [rec for rec in outbox if restored_step is None or rec[2] <= restored_step]
        if len(self._pending) < len(outbox):  # a dead timeline's steps: trained again, sent then
            self._rewrite_outbox(self._pending)
        self._queue: list[Record] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = False
        self._every = flush_every_s
        self._thread: threading.Thread | None = None

    # --- the training thread ---------------------------------------------------------------
    @classmethod
    def for_run(
        cls,
        spec: CampaignSpec,
        *,
        run: ResolvedRun,
        run_folder: RunFolder,
        restored_meta: Mapping[str, Any] | None,
        restored_step: int,
        client: Any = None,
    ) -> RunTracker | None:
        """The started tracker of a training call, or None when tracking is off."""
        uri = tracking_uri(spec)
        if uri is None:
            return None
        client = client if client is not None else make_client(uri)
        # The campaign ID is the output folder's (a scratch run folder keeps its own).
        root = run_folder.out if run_folder.out is not None else run_folder.path
        tags, params = run_identity(spec, run)
        known = (restored_meta or {}).get(META_KEY)
        t = cls(
            client=client,
            uri=uri,
            experiment=experiment_name(spec),
            campaign_id=campaign_id_of(root, spec),
            run_folder=run_folder.path,
            run_id=run.run_id,
            tags=tags,
            params=params,
            known_run_id=str(known) if known else None,
            restored_step=restored_step,
        )
        t.start()
        return t

    def start(self) -> None:
        """Start the sender thread (it connects, then sends what the outbox holds)."""
        self._write_state()
        self._thread = threading.Thread(
            target=self._loop, name=f"mlflow-{self.run_id}", daemon=True
        )
        self._thread.start()

    def write(self, row: Mapping[str, Any]) -> None:
        """Queue the metrics of a ``metrics.jsonl`` row; an evaluation or a checkpoint flushes."""
        records = row_records(row, ts=int(time.time() * 1000))
        if not records:
            return
        with self._lock:
            self._queue.extend(records)
        if row.get("kind") in ("eval", "checkpoint"):
            self._wake.set()

    def close(self, status: str, *, wait_s: float = CLOSE_WAIT_S) -> dict[str, Any]:
        """Send what is left (waiting at most ``wait_s``), then end the MLflow run with
        ``status`` (FINISHED, FAILED, KILLED); what could not be sent stays in the outbox.

        Returns:
            ``{mlflow_run_id, sent, pending, down, error}``.
        """
        self.status = status
        self._closing = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(wait_s)
        with self._lock:
            pending = len(self._pending) + len(self._queue)
        if pending:  # said as a warning by the caller (``tracking_note``) and by ``flush``
            log.info(
                "MLflow: %d metric values of %s not sent to %s (%s); kept in %s, sent by the "
                "run's next start or the campaign's close",
                pending,
                self.run_id,
                self.uri,
                self.error or "still sending",
                self.folder / MLFLOW_OUTBOX_FILE,
            )
        return {
            "mlflow_run_id": self.mlflow_run_id,
            "sent": self.sent_count,
            "pending": pending,
            "down": self.down,
            "error": self.error,
        }

    # --- the sender thread -----------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            self._wake.wait(self._every)
            self._wake.clear()
            closing = self._closing
            self.flush(final=closing)
            if closing:
                return

    def flush(self, *, final: bool = False) -> bool:
        """Move the queue to the outbox, then send the outbox; ``final``: end the MLflow run
        too. Never raises: a failure is warned once, and the next flush tries again.

        Returns:
            True when everything was sent.
        """
        with self._lock:
            new, self._queue = self._queue, []
        if new:
            self._append_outbox(new)
            self._pending.extend(new)
        try:
            if not self._connected:
                self._connect()
            self._send()
            if final and self.status is not None:
                self.client.set_terminated(self.mlflow_run_id, status=self.status)
                self._write_state(ended=True)
        except Exception as exc:  # noqa: BLE001 - no tracking failure may stop training
            self.error = short_error(exc)
            if not self.down and self.uri not in _WARNED and not self.sealed:
                _WARNED.add(self.uri)  # once per process and server, not once per run
                log.warning(
                    "MLflow: tracking server %s does not answer (%s); training goes on, the "
                    "metrics of %s are kept in %s and sent when it answers",
                    self.uri,
                    self.error,
                    self.run_id,
                    self.folder / MLFLOW_OUTBOX_FILE,
                )
            self.down = True
            return False
        if self.down or self.uri in _WARNED:
            _WARNED.discard(self.uri)
            log.warning("MLflow: tracking server %s answers again (%s)", self.uri, self.run_id)
        self.down, self.error = False, None
        return True

    def _connect(self) -> None:
        """The experiment, the campaign's parent run, and this run's (found or created)."""
        c = self.client
        exp = ensure_experiment(c, self.experiment)
        parent = ensure_parent(c, exp, self.campaign_id)
        if self.mlflow_run_id is None:
            found = c.search_runs(
                [exp],
                filter_string=f"tags.`{TAG}run_id` = '{self.run_id}' and "
                f"tags.`{TAG}campaign_id` = '{self.campaign_id}'",
                max_results=1,
            )
            if found:
                self.mlflow_run_id = found[0].info.run_id
                self._history = not self._sent
        if self.mlflow_run_id is None:
            from mlflow.entities import Param

            created = c.create_run(
                exp,
                run_name=self.run_id,
                tags={
                    **self.tags,
                    f"{TAG}campaign_id": self.campaign_id,
                    "mlflow.parentRunId": parent,
                },
            )
            self.mlflow_run_id = created.info.run_id
            items = [Param(k, v) for k, v in sorted(self.params.items())]
            for i in range(0, len(items), BATCH_PARAMS):
                c.log_batch(self.mlflow_run_id, params=items[i : i + BATCH_PARAMS])
        else:
            c.update_run(self.mlflow_run_id, status="RUNNING")
        self._connected = True
        self._write_state()

    def _sent_step(self, key: str) -> int:
        if key not in self._sent and self._history:
            history = self.client.get_metric_history(self.mlflow_run_id, key)
            self._sent[key] = max((m.step for m in history), default=-1)
        return self._sent.get(key, -1)

    def _steps_on_server(self, key: str) -> set[int]:
        if key not in self._on_server:
            history = self.client.get_metric_history(self.mlflow_run_id, key)
            self._on_server[key] = {int(m.step) for m in history}
        return self._on_server[key]

    def _send(self) -> None:
        """Send the pending records not sent yet, in batches; the outbox keeps the rest."""
        from mlflow.entities import Metric

        last: dict[str, int] = {}
        todo: list[Record] = []
        for rec in self._pending:
            key, step = rec[0], rec[2]
            if self.sealed:  # exactly the (metric, step) pairs the server lacks
                have = self._steps_on_server(key)
                if step not in have:
                    have.add(step)
                    todo.append(rec)
            elif step > last.get(key, self._sent_step(key)):
                last[key] = step
                todo.append(rec)
        for i in range(0, len(todo), BATCH_METRICS):
            chunk = todo[i : i + BATCH_METRICS]
            self.client.log_batch(
                self.mlflow_run_id,
                metrics=[Metric(key, value, ts, step) for key, value, step, ts in chunk],
            )
            for key, _, step, _ in chunk:
                self._sent[key] = max(step, self._sent.get(key, -1))
            self.sent_count += len(chunk)
            self._write_state()
        self._pending = []
        self._rewrite_outbox()

    # --- the run folder ----------------------------------------------------------------------
    def _read_state(self) -> dict[str, Any]:
        try:
            state = json.loads((self.folder / MLFLOW_STATE_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        if not isinstance(state, dict) or state.get("run_id") != self.run_id:
            return {}
        sent = state.get("sent", {})
        if (
            not isinstance(sent, dict)
            or not all(type(v) is int for v in sent.values())
            or not isinstance(state.get("mlflow_run_id"), str | None)
        ):
            return {}  # not a record this tracker wrote: the server's history tells what was sent
        return state

    def _write_state(self, *, ended: bool = False) -> None:
        if self.sealed:
            return
        state = {
            "run_id": self.run_id,
            "uri": self.uri,
            "experiment": self.experiment,
            "campaign_id": self.campaign_id,
            "mlflow_run_id": self.mlflow_run_id,
            "status": self.status,
            "ended": ended,
            "tags": self.tags,
            "params": self.params,
            "sent": self._sent,
        }
        atomic_write_bytes(self.folder / MLFLOW_STATE_FILE, json_bytes(state))

    def _read_outbox(self) -> list[Record]:
        out: list[Record] = []
        try:
            lines = (self.folder / MLFLOW_OUTBOX_FILE).read_text(encoding="utf-8").splitlines()
        except (OSError, ValueError):
            return out
        for line in lines:
            try:
                key, value, step, ts = json.loads(line)
                record = (str(key), float(value), int(step), int(ts))
            except (ValueError, TypeError, OverflowError, RecursionError):
                continue  # a line cut by a crash (or not one this tracker wrote)
            if isinstance(key, str) and math.isfinite(record[1]):  # as the queue takes them
                out.append(record)
        return out

    def _append_outbox(self, records: Iterable[Record]) -> None:
        if self.sealed:
            return
        with open(self.folder / MLFLOW_OUTBOX_FILE, "a", encoding="utf-8") as f:
            f.writelines(json.dumps(list(r)) + "\n" for r in records)

    def _rewrite_outbox(self, records: list[Record] | None = None) -> None:
        """The outbox holding ``records`` only; none: no file (an empty one would fail the
        folder's verification)."""
        if self.sealed:
            return
        path = self.folder / MLFLOW_OUTBOX_FILE
        if not records:
            path.unlink(missing_ok=True)
            return
        atomic_write_bytes(path, "".join(json.dumps(list(r)) + "\n" for r in records).encode())


#: MLflow 3's UI opens an experiment by this tag's value: without it, in the GenAI (traces)
#: view, where a campaign's runs, metrics and charts do not show until a person switches to
#: model training; ``custom_model_development`` opens the model-training view.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"


def ensure_experiment(client: Any, name: str) -> str:
    """The ID of experiment ``name``, created when absent (by another process too), tagged to
    open in MLflow's model-training view (an experiment whose kind someone set keeps it)."""
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if getattr(exp, "lifecycle_stage", "active") == "deleted":
            client.restore_experiment(exp.experiment_id)
        if EXPERIMENT_KIND_TAG not in (getattr(exp, "tags", None) or {}):
            client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        return str(exp.experiment_id)
    try:
        return str(client.create_experiment(name, tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND}))
    except Exception:  # noqa: BLE001 - created meanwhile by another run of the campaign
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return str(exp.experiment_id)


def ensure_parent(client: Any, experiment_id: str, campaign_id: str) -> str:
    """The MLflow run ID of the campaign's parent run, created when absent.

    Two runs starting at once may both create one: the earliest is kept, the other deleted.
    """
    where = f"tags.`{TAG}kind` = 'campaign' and tags.`{TAG}campaign_id` = '{campaign_id}'"

    def oldest() -> str | None:
        runs = client.search_runs(
            [experiment_id], filter_string=where, order_by=["attributes.start_time ASC"]
        )
        return str(runs[0].info.run_id) if runs else None

    found = oldest()
    if found is not None:
        return found
    mine = client.create_run(
        experiment_id,
        run_name=campaign_id,
        tags={f"{TAG}kind": "campaign", f"{TAG}campaign_id": campaign_id},
    ).info.run_id
    first = oldest() or mine
    if first != mine:
        client.delete_run(mine)
    return str(first)


def tracking_note(run_folder: Path) -> str | None:
    """What a training call left unsent to MLflow, said in one line; None when nothing is left
    (or the run is not tracked)."""
    folder = Path(run_folder)
    try:
        state = json.loads((folder / MLFLOW_STATE_FILE).read_text(encoding="utf-8"))
        lines = (folder / MLFLOW_OUTBOX_FILE).read_text(encoding="utf-8").splitlines()
    except (OSError, ValueError):
        return None
    if not lines:
        return None
    return (
        f"MLflow: the tracking server {redact_secrets(str(state.get('uri')))} did not take "
        f"{len(lines)} metric values of {state.get('run_id')}; training went on, they are kept in "
        f"{folder / MLFLOW_OUTBOX_FILE} and sent by the run's next start or the campaign's close"
    )
