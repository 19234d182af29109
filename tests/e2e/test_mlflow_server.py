"""MLflow tracking on a real tracking server, started as ``infra/stack.sh`` starts it
(``infra/mlflowserver.py``: ``mlflow server --serve-artifacts``, artifacts on the S3 server of
``infra/s3server.py``; the backend is SQLite here, the stack's PostgreSQL there).

A campaign is trained and closed with tracking on: its runs, per-step metrics, params, the
verdict and budget tags and the report's artifacts are read back through ``MlflowClient``; its
control is interrupted and resumed into the same MLflow run with no step logged twice. A second
campaign trains and closes with the server down: it completes, says so, and `campaign track OUT`
sends what it kept once the server is back, reading the sealed folder without changing it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpucampaign.cli import app
from gpucampaign.close.closing import analyse_runs, close_folder, seal_folder, track_closed
from gpucampaign.core import interrupt
from gpucampaign.core.interrupt import Interrupted
from gpucampaign.engine.loop import train_run
from gpucampaign.folder.layout import MLFLOW_OUTBOX_FILE, MLFLOW_STATE_FILE, OutputFolder
from gpucampaign.storage import LocalStore
from gpucampaign.tracking.mlflow import tracking_note
from gpucampaign.verify.checks import seal_problems, verify_output
from infra import mlflowserver
from infra.s3server import start_server as start_s3
from tests.helpers.closing import SPEC_TEMPLATE, start_folder, write_corpus
from tests.helpers.stack import STACK, s3_client

mlflow = pytest.importorskip("mlflow")

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]

TRACKER_LOG = "gpucampaign.tracking.mlflow"


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """The S3 server and an MLflow server whose artifacts go to its bucket; stopped after."""
    base = tmp_path_factory.mktemp("mlflow-stack")
    s3 = start_s3(base / "s3")
    root = base / "mlflow"
    backend = f"sqlite:///{base / 'mlflow.db'}"
    try:
        server = mlflowserver.start_server(
            root, backend=backend, artifacts="s3://gpucampaign/mlflow", env=s3.env()
        )
        yield {"uri": server.uri, "root": root, "backend": backend, "s3": s3}
    finally:
        mlflowserver.stop_server(root)
        s3.stop()


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("GPUCAMPAIGN_TRACKING", raising=False)
    interrupt.clear_stop()
    yield
    interrupt.clear_stop()


def _campaign(base: Path, uri: str, *, name: str) -> tuple[Any, Any, OutputFolder, Path]:
    """The closing tests' two-run campaign, longer, with tracking to ``uri``."""
    src = base / "src"
    src.mkdir(parents=True)
    sha = write_corpus(src / "corpus.csv", n=200)
    data = yaml.safe_load(SPEC_TEMPLATE.format(sha=sha, threshold=0.2, unit="null"))
    data["name"] = name
    data["control"].update({"max_steps": 16, "epochs": 20, "eval_every": 4})
    data["checkpoint"] = {"every_steps": 4}
    data["tracking"] = {"mlflow": {"uri": uri}}
    (src / "campaign.yaml").write_text(yaml.safe_dump(data))
    spec, corpus, folder = start_folder(
        src / "campaign.yaml", corpus_file=src / "corpus.csv", out=base / "out"
    )
    folder.write_json("campaign.json", {"campaign_id": f"{name}-0001"})
    return spec, corpus, folder, src


def _train(spec: Any, corpus: Any, folder: OutputFolder, run: str, **kw: Any) -> Any:
    resolved = spec.resolve_run(run)
    return train_run(
        spec,
        run=resolved,
        corpus=corpus,
        store=LocalStore(folder.root / "checkpoints"),
        run_folder=folder.run(resolved.run_id),
        **kw,
    )


def _close(spec: Any, corpus: Any, folder: OutputFolder, src: Path, cid: str) -> str | None:
    """The close as the campaign's close task runs it: closed, tracked, then sealed."""
    analyses = analyse_runs(spec, root=folder.root, corpus=corpus, runs=spec.run_names())
    closed, _ = close_folder(
        spec, root=folder.root, base_dir=src, campaign_id=cid, analyses=analyses
    )
    line = track_closed(spec, closed, root=folder.root, campaign_id=cid)
    seal_folder(spec, root=folder.root, summary=closed.summary(cid))
    return line


def _experiment_runs(client: Any, name: str) -> tuple[Any, dict[str, Any]]:
    exp = client.get_experiment_by_name(name)
    runs = client.search_runs([exp.experiment_id])
    parent = [r for r in runs if r.data.tags.get("gpucampaign.kind") == "campaign"]
    assert len(parent) == 1, [r.data.tags for r in runs]
    children = {r.data.tags["gpucampaign.run"]: r for r in runs if r not in parent}
    return parent[0], children


def test_a_campaign_is_tracked_across_an_interruption(servers, tmp_path):
    spec, corpus, folder, src = _campaign(tmp_path, servers["uri"], name="tracked")

    def stop(info: dict[str, Any]) -> None:
        if info["step"] >= 9:
            interrupt.request_stop("SIGINT")

    with pytest.raises(Interrupted):
        _train(spec, corpus, folder, "control", progress=stop)
    interrupt.clear_stop()
    client = mlflow.MlflowClient(tracking_uri=servers["uri"])
    _, children = _experiment_runs(client, "tracked")
    first_id = children["control"].info.run_id
    assert children["control"].info.status == "KILLED"
    done = _train(spec, corpus, folder, "control")
    assert done.completed and done.resumed_from_step is not None
    _train(spec, corpus, folder, "wide")
    line = _close(spec, corpus, folder, src, "tracked-0001")
    assert line is not None and "parent run" in line, line

    parent, children = _experiment_runs(client, "tracked")
    # MLflow 3's UI opens it in the model-training view, where these runs show.
    tags = client.get_experiment_by_name("tracked").tags
    assert tags["mlflow.experimentKind"] == "custom_model_development"
    control = children["control"]
    assert control.info.run_id == first_id  # the resume continued the same MLflow run
    assert control.info.status == "FINISHED"
    assert set(children) == {"control", "wide"}
    run_id = spec.resolve_run("control").run_id
    assert control.data.tags["gpucampaign.run_id"] == run_id
    assert (
        control.data.tags["gpucampaign.config_sha256"] == spec.resolve_run("control").config_sha256
    )
    assert control.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert control.data.params["lr"] == "0.05" and control.data.params["max_steps"] == "16"
    assert children["wide"].data.params["factor.hidden"] == "[16]"
    assert children["wide"].data.tags["gpucampaign.factor"] == "hidden=[16]"
    steps = [m.step for m in client.get_metric_history(first_id, "train/loss")]
    assert sorted(steps) == list(range(1, done.steps_done + 1))
    assert max(Counter(steps).values()) == 1  # no step logged twice
    evals = [m.step for m in client.get_metric_history(first_id, "val/accuracy")]
    assert sorted(evals) == [4, 8, 12, 16]
    assert client.get_metric_history(first_id, "final/val/accuracy")
    verdict = (folder.root / "report.json").read_text()
    assert parent.data.tags["gpucampaign.verdict"] in verdict
    assert "gpucampaign.budget.spent_usd" in parent.data.tags
    names = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"report.md", "report.html", "report.json"} <= names
    assert any(n.endswith(".png") for n in names) or any(
        a.path.endswith(".png") for d in names for a in client.list_artifacts(parent.info.run_id, d)
    )
    # The tracker's files are the folder's like any other: the sealed folder verifies.
    assert (folder.run(run_id).path / MLFLOW_STATE_FILE).is_file()
    assert verify_output(folder.root).verified
    # The artifacts went through the server to its S3 bucket.
    keys = [
        o["Key"] for o in servers["s3"].client().list_objects_v2(Bucket="gpucampaign")["Contents"]
    ]
    assert any(k.startswith("mlflow/") and k.endswith("report.md") for k in keys)


def _file_hashes(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _history(client: Any, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


def test_a_server_down_never_stops_the_campaign(servers, tmp_path, caplog):
    """The server is down from the first step to the seal: the campaign completes and says so,
    and the metrics it kept are sent by `campaign track OUT` once the server is back; the
    sealed folder is only read, and a second `campaign track` sends nothing twice."""
    spec, corpus, folder, src = _campaign(tmp_path, servers["uri"], name="outage")
    control_id = spec.resolve_run("control").run_id
    mlflowserver.stop_server(servers["root"])
    try:
        with caplog.at_level(logging.WARNING, logger=TRACKER_LOG):
            res = _train(spec, corpus, folder, "control")
            wide = _train(spec, corpus, folder, "wide")
        assert res.completed and wide.completed
        assert any("does not answer" in r.getMessage() for r in caplog.records)
        note = tracking_note(folder.run(control_id).path)
        assert note is not None and "kept in" in note
        down = _close(spec, corpus, folder, src, "outage-0001")  # tracked (down), then sealed
        assert down is not None and "did not answer" in down
        assert (
            folder.run(control_id).path / MLFLOW_OUTBOX_FILE
        ).is_file()  # kept, sealed with the rest
        sealed = _file_hashes(folder.root)
        still = CliRunner().invoke(app, ["track", str(folder.root), "--uri", servers["uri"]])
        assert still.exit_code == 1, still.output
        assert "did not answer" in still.stdout and "run `campaign track" in still.stdout
    finally:
        back = mlflowserver.start_server(
            servers["root"],
            backend=servers["backend"],
            artifacts="s3://gpucampaign/mlflow",
            env=servers["s3"].env(),
        )
    assert back.uri == servers["uri"]  # the same port: MLFLOW_TRACKING_URI stays valid
    sent = CliRunner().invoke(app, ["track", str(folder.root), "--uri", servers["uri"]])
    assert sent.exit_code == 0, sent.output
    assert "sent late" in sent.stdout and "parent run" in sent.stdout, sent.stdout

    client = mlflow.MlflowClient(tracking_uri=servers["uri"])

    def every_step_once() -> Any:
        parent, children = _experiment_runs(client, "outage")
        assert set(children) == {"control", "wide"}
        for run, done in (("control", res), ("wide", wide)):
            rid = children[run].info.run_id
            steps = _history(client, rid, "train/loss")
            assert steps == list(range(1, done.steps_done + 1)), (run, steps)  # each once
            assert _history(client, rid, "val/accuracy") == [4, 8, 12, 16]
            assert len(client.get_metric_history(rid, "final/val/accuracy")) == 1
            assert children[run].info.status == "FINISHED"
            assert children[run].data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert children["control"].data.params["lr"] == "0.05"
        return parent

    parent = every_step_once()
    manifest = json.loads((folder.root / "manifest.json").read_text())
    assert parent.data.tags["gpucampaign.verdict"] == manifest["verdict"]["kind"]
    assert "gpucampaign.budget.spent_usd" in parent.data.tags
    assert parent.info.status == "FINISHED"
    names = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"report.md", "report.html", "report.json"} <= names
    # The sealed folder was read, never written: it still verifies as sealed.
    assert _file_hashes(folder.root) == sealed
    assert seal_problems(folder.root) == []

    again = CliRunner().invoke(app, ["track", str(folder.root), "--uri", servers["uri"]])
    assert again.exit_code == 0, again.output
    assert "sent late" not in again.stdout  # nothing was missing
    every_step_once()
    assert _file_hashes(folder.root) == sealed


def test_the_stack_runs_an_mlflow_server_on_its_postgres_and_s3(stack, tmp_path):
    """`make stack-up`'s MLflow server: its URI in the env file a user sources, its backend on
    the stack's PostgreSQL (a database of its own), its artifacts in the stack's bucket."""
    env = dict(
        line.removeprefix("export ").split("=", 1)
        for line in (stack["dir"] / "env").read_text().splitlines()
    )
    uri = env["MLFLOW_TRACKING_URI"]
    assert uri.startswith("http://127.0.0.1:")
    status = subprocess.run(
        ["bash", str(STACK), "status"], env=stack["env"], capture_output=True, text=True
    )
    assert f"MLflow tracking server at {uri}" in status.stdout, status.stdout
    client = mlflow.MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("stack-check")
    run = client.create_run(exp, run_name="check").info.run_id
    client.log_batch(run, metrics=[mlflow.entities.Metric("loss", 0.5, 0, 3)])
    (tmp_path / "note.txt").write_text("from the test\n")
    client.log_artifact(run, str(tmp_path / "note.txt"))
    assert [m.step for m in client.get_metric_history(run, "loss")] == [3]
    assert [a.path for a in client.list_artifacts(run)] == ["note.txt"]
    keys = [o["Key"] for o in s3_client(stack).list_objects_v2(Bucket="gpucampaign")["Contents"]]
    assert any(k.startswith("mlflow/") and k.endswith("note.txt") for k in keys)
    # Its database: the stack's PostgreSQL; the password never on a command line or in its log.
    password = (stack["dir"] / "postgres.password").read_text().strip()
    pid = int(json.loads((stack["dir"] / "mlflow" / "mlflow.json").read_text())["pid"])
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode()
    assert "mlflow" in cmdline and password not in cmdline
    assert password not in (stack["dir"] / "mlflow" / "mlflow.log").read_text()
    environ = Path(f"/proc/{pid}/environ").read_bytes().decode()
    assert "MLFLOW_BACKEND_STORE_URI=postgresql+psycopg2://" in environ
