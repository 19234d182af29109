"""The campaign's parent run in MLflow, at the close (``track_close``) or later, from a sealed
folder (``track_sealed``, ``campaign track OUT``); the runs' MLflow runs are in ``mlflow.py``.

At the close, what the run folders' outboxes still hold is sent (``replay``: the metrics a
server outage kept), the runs a process that died left RUNNING (a lost machine's, not trained
on since) are ended KILLED, then the verdict and the budget go as tags on the campaign's parent
run, and the report and the figures as its artifacts. Neither ever raises for the server: a
failure is the line returned.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import gpucampaign.tracking.mlflow as runs  # make_client looked up when called
from gpucampaign.config import CampaignSpec
from gpucampaign.core.errors import ArgumentError, FolderError, InputError
from gpucampaign.core.text import redact_secrets
from gpucampaign.folder.layout import (
    FIGURES_DIR,
    MLFLOW_OUTBOX_FILE,
    MLFLOW_STATE_FILE,
    REPORT_HTML,
    REPORT_JSON,
    REPORT_MD,
    RUNS_DIR,
)
from gpucampaign.tracking.mlflow import (
    CREDENTIAL_ENV,
    ENV_URI,
    MAX_VALUE,
    TAG,
    RunTracker,
    campaign_id_of,
    ensure_experiment,
    ensure_parent,
    experiment_name,
    short_error,
    tracking_off,
    tracking_uri,
)


def replay(folder: Path, *, client: Any, uri: str, sealed: bool = False) -> dict[str, Any] | None:
    """Send what a run folder's outbox still holds and end its MLflow run as recorded (the
    close's catch-up after a server outage); None when the folder was never tracked or is done.
    ``sealed``: read the folder only (``RunTracker``'s ``sealed``).
    """
    try:
        state = json.loads((folder / MLFLOW_STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if state.get("ended") and not (folder / MLFLOW_OUTBOX_FILE).exists():
        return None
    t = RunTracker(
        client=client,
        uri=uri,
        experiment=str(state["experiment"]),
        campaign_id=str(state["campaign_id"]),
        run_folder=folder,
        run_id=str(state["run_id"]),
        tags=state.get("tags") or {},
        params=state.get("params") or {},
        sealed=sealed,
    )
    t.status = t.status or "FINISHED"
    ok = t.flush(final=True)
    return {"run_id": t.run_id, "sent": t.sent_count, "ok": ok, "error": t.error}


def track_close(
    spec: CampaignSpec,
    *,
    root: str | Path,
    campaign_id: str,
    verdict: Mapping[str, Any],
    budget: Mapping[str, Any],
    files: Iterable[str],
    client: Any = None,
) -> str | None:
    """At the close: send what run outboxes still hold, then put the verdict and the budget as
    tags on the campaign's parent run and the report and figures as its artifacts.

    Never raises for the server: a failure is the line returned.

    Args:
        spec: The campaign.
        root: Its output folder.
        campaign_id: Its ID.
        verdict: ``Verdict.to_dict()``.
        budget: The closing budget.
        files: Paths relative to ``root`` to log as artifacts (absent ones are skipped).
        client: An ``MlflowClient`` (made from the spec's URI when None).

    Returns:
        One line saying what was tracked, or why not; None when tracking is off.
    """
    uri = tracking_uri(spec)
    if uri is None:
        return None
    line, _ = _track_close(
        spec,
        uri=uri,
        root=Path(root),
        campaign_id=campaign_id,
        verdict=verdict,
        budget=budget,
        files=files,
        client=client,
        sealed=False,
    )
    return line


def tag_manifest(
    spec: CampaignSpec, *, campaign_id: str, sha256: str, client: Any = None
) -> str | None:
    """After the seal: put the manifest's sha256 as the tag ``gpucampaign.manifest_sha256`` of
    the campaign's parent run, a record of it kept outside the folder (``verify --expect``).

    Never raises for the server: a failure is the line returned.

    Returns:
        One line saying where it was kept, or why not; None when tracking is off.
    """
    uri = tracking_uri(spec)
    if uri is None:
        return None
    try:
        client = client if client is not None else runs.make_client(uri)
        exp = ensure_experiment(client, experiment_name(spec))
        parent = ensure_parent(client, exp, campaign_id)
        from mlflow.entities import RunTag

        client.log_batch(parent, tags=[RunTag(f"{TAG}manifest_sha256", sha256)])
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - the close goes on without the tracking server
        return f"MLflow: the manifest's sha256 was not tagged ({short_error(exc)})"
    return f"MLflow: the manifest's sha256 is the tag {TAG}manifest_sha256 of the parent run"


def track_sealed(
    spec: CampaignSpec,
    *,
    root: str | Path,
    manifest: Mapping[str, Any],
    uri: str | None = None,
    folder_uri: bool = False,
    client: Any = None,
) -> tuple[str, bool]:
    """The close's tracking, later (``campaign track OUT``): for a sealed folder whose close the
    tracking server missed, send what the runs' outboxes hold, end their MLflow runs as
    recorded, and tag the parent run with the verdict and budget the manifest sealed, with the
    report and figures as its artifacts (``track_close``'s work). Nothing is written into the
    folder, and only the (metric, step) pairs the server lacks are sent: running it again sends
    nothing twice. The caller checks the folder against its manifest first.

    The server is the one the user chose (``uri``, else ``MLFLOW_TRACKING_URI``); the one the
    folder's spec names only with ``folder_uri``, and then without the credentials of the
    environment unless they are for that same server (``credentials_for``).

    Args:
        spec: The campaign (the folder's ``spec.yaml``).
        root: The sealed output folder.
        manifest: Its ``manifest.json``.
        uri: The tracking server the user gave; None: ``MLFLOW_TRACKING_URI``.
        folder_uri: Send to the server the folder's spec names (the user asked for it).
        client: An ``MlflowClient`` (made from the URI when None).

    Returns:
        ``(line, done)``: what was tracked or why not, and whether everything was sent.

    Raises:
        SpecError: No tracking server is named, or no run of the folder was tracked.
    """
    root = Path(root)
    uri = sealed_tracking_uri(spec, root=root, uri=uri, folder_uri=folder_uri)
    files = [
        str(f["path"])
        for f in manifest.get("files") or []
        if f.get("path") in _CLOSE_ARTIFACTS or str(f.get("path", "")).startswith(f"{FIGURES_DIR}/")
    ]
    send_credentials = not folder_uri or credentials_for(uri)
    with nullcontext() if send_credentials else withheld_credentials():
        line, done = _track_close(
            spec,
            uri=uri,
            root=root,
            campaign_id=str(manifest.get("campaign_id") or campaign_id_of(root, spec)),
            verdict=manifest.get("verdict") or {},
            budget=manifest.get("budget") or {},
            files=files,
            client=client,
            sealed=True,
        )
    if not send_credentials:
        meant = os.environ.get(ENV_URI)
        line += (
            "; sent without the MLflow credentials of the environment (they are for "
            f"{redact_secrets(meant) if meant else 'the server MLFLOW_TRACKING_URI would name'})"
        )
    return line, done


def end_left_running(client: Any, *, experiment_id: str, parent: str) -> list[str]:
    """End KILLED the campaign's runs still RUNNING at its close: a process that died (its
    machine lost) left them so, and no later start trained them on. (A resumed run goes on in
    its own MLflow run and ends it itself.)

    Returns:
        The names of the runs ended.
    """
    left = client.search_runs(
        [experiment_id],
        filter_string=f"tags.`mlflow.parentRunId` = '{parent}' and attributes.status = 'RUNNING'",
    )
    for run in left:
        client.set_terminated(run.info.run_id, status="KILLED")
    return [str(run.info.run_name or run.info.run_id) for run in left]


def sealed_tracking_uri(
    spec: CampaignSpec, *, root: str | Path, uri: str | None = None, folder_uri: bool = False
) -> str:
    """The tracking server that ``track_sealed`` sends a folder's kept metrics to: ``uri``
    (the user's), else ``MLFLOW_TRACKING_URI``; the folder spec's ``tracking.mlflow.uri`` only
    with ``folder_uri`` (a folder may come from anyone: where it says to send is not taken
    unasked).

    Raises:
        SpecError: No tracking server is named, or no run of the folder was tracked.
    """
    root = Path(root)
    named = folder_tracking_uri(spec)
    if folder_uri:
        if named is None:
            raise ArgumentError(
                f"--folder-uri: the spec of '{root}' names no tracking server "
                "(no tracking.mlflow.uri); give --uri or set MLFLOW_TRACKING_URI.",
                field="--folder-uri",
            )
        found: str | None = named
    else:
        found = uri or (None if tracking_off() else os.environ.get(ENV_URI) or None)
    if found is None:
        also = (
            f" (its spec names {named}: --folder-uri sends there, your credentials only if "
            "MLFLOW_TRACKING_URI names that server)"
            if named
            else ""
        )
        raise ArgumentError(
            f"no MLflow tracking server for '{root}'{also}: set MLFLOW_TRACKING_URI or give "
            "--uri (GPUCAMPAIGN_TRACKING=off switches the environment's off).",
            field="--uri",
        )
    if not any((root / RUNS_DIR).glob(f"*/{MLFLOW_STATE_FILE}")):
        raise FolderError(
            f"no run of '{root}' was tracked (no runs/*/{MLFLOW_STATE_FILE}): the campaign ran "
            "with tracking off, so nothing was kept to send.",
            field="OUT",
        )
    return found


def folder_tracking_uri(spec: CampaignSpec) -> str | None:
    """The tracking server a (folder's) spec names, None when it names none."""
    m = spec.tracking.mlflow
    return m.uri if m is not None and m.uri else None


def credentials_for(uri: str) -> bool:
    """Whether the environment's MLflow credentials are meant for ``uri``'s server: the one
    ``MLFLOW_TRACKING_URI`` names (same scheme, host and port)."""
    env = os.environ.get(ENV_URI)
    return env is not None and _server(env) == _server(uri)


def _server(uri: str) -> tuple[str, str, int | None]:
    parts = urlsplit(uri.strip())
    try:
        port = parts.port
    except ValueError:
        port = -1
    default = {"http": 80, "https": 443}.get(parts.scheme.lower())
    return parts.scheme.lower(), (parts.hostname or "").lower(), port or default


@contextmanager
def withheld_credentials() -> Iterator[None]:
    """MLflow without the environment's credentials while it lasts: its variables unset, and
    its credentials file (``~/.mlflow/credentials``) and the netrc HTTP clients read out of
    reach (a home without them)."""
    saved = {k: os.environ.pop(k) for k in (*CREDENTIAL_ENV, "NETRC") if k in os.environ}
    home = os.environ.get("HOME")
    with tempfile.TemporaryDirectory(prefix="gpucampaign-nocreds-") as empty:
        os.environ["HOME"] = empty
        try:
            yield
        finally:
            if home is None:
                os.environ.pop("HOME", None)
            else:
                os.environ["HOME"] = home
            os.environ.update(saved)


_CLOSE_ARTIFACTS = (REPORT_MD, REPORT_HTML, REPORT_JSON)  # with figures/*: the close's


def _track_close(
    spec: CampaignSpec,
    *,
    uri: str,
    root: Path,
    campaign_id: str,
    verdict: Mapping[str, Any],
    budget: Mapping[str, Any],
    files: Iterable[str],
    client: Any,
    sealed: bool,
) -> tuple[str, bool]:
    """``track_close``'s work on ``uri``; ``sealed``: the folder is read only."""
    try:
        client = client if client is not None else runs.make_client(uri)
        replays = [
            r
            for d in sorted((root / RUNS_DIR).glob("*/"))
            if (r := replay(d, client=client, uri=uri, sealed=sealed)) is not None
        ]
        exp = ensure_experiment(client, experiment_name(spec))
        parent = ensure_parent(client, exp, campaign_id)
        ended = end_left_running(client, experiment_id=exp, parent=parent)
        from mlflow.entities import RunTag

        tags = {
            f"{TAG}verdict": verdict.get("kind"),
            f"{TAG}verdict.run": verdict.get("run"),
            f"{TAG}verdict.answer": verdict.get("answer"),
            f"{TAG}verdict.text": verdict.get("text"),
            f"{TAG}question": spec.question,
            **{
                f"{TAG}budget.{k}": v
                for k, v in budget.items()
                if isinstance(v, str | int | float) and not isinstance(v, bool)
            },
        }
        client.log_batch(
            parent,
            tags=[RunTag(k, str(v)[:MAX_VALUE]) for k, v in tags.items() if v not in (None, "")],
        )
        logged = []
        for rel in files:
            path = root / rel
            if path.is_file():
                parent_dir = str(Path(rel).parent)
                client.log_artifact(parent, str(path), None if parent_dir == "." else parent_dir)
                logged.append(rel)
        client.set_terminated(parent, status="FINISHED")
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - the close goes on without the tracking server
        return (
            f"MLflow: tracking server {redact_secrets(uri)} did not answer"
            f"{'' if sealed else ' at the close'} ({short_error(exc)}); the verdict and "
            "report are not in "
            "MLflow, metrics not sent stay in runs/*/" + MLFLOW_OUTBOX_FILE
        ), False
    late = sum(r["sent"] for r in replays)
    failed = [r["run_id"] for r in replays if not r["ok"]]
    line = (
        f"MLflow: campaign {campaign_id} tracked at {redact_secrets(uri)}, experiment "
        f"'{experiment_name(spec)}', parent run {parent}: verdict and budget tags, "
        f"{len(logged)} artifacts"
    )
    if late:
        line += f"; {late} metric values sent late (kept while the server was down)"
    if ended:
        line += f"; ended KILLED, left RUNNING by a process that died: {', '.join(ended)}"
    if failed:
        line += f"; still unsent: {', '.join(failed)} (kept in their {MLFLOW_OUTBOX_FILE})"
    return line, not failed
