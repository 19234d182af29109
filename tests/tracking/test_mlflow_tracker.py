"""MLflow tracking against an in-memory client: what is logged, the outbox while the server is
down, a resume that continues the same MLflow run without logging a step twice, and a library
that never needs mlflow while tracking is off."""

from __future__ import annotations

import ast
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from gpucampaign.config import SpecError, spec_sha256
from gpucampaign.core import interrupt
from gpucampaign.core.interrupt import Interrupted
from gpucampaign.folder.layout import MLFLOW_OUTBOX_FILE, MLFLOW_STATE_FILE
from gpucampaign.tracking import mlflow as tracking
from gpucampaign.tracking.campaign import track_close, track_sealed
from gpucampaign.tracking.mlflow import META_KEY, RunTracker, row_records, tracking_uri
from tests.helpers import digits_file, make_spec, run, run_dir  # noqa: F401
from tests.helpers.fake_mlflow import FakeClient

pytest.importorskip("mlflow")  # the entities the client is given (Metric, Param, RunTag)

SRC = Path(__file__).resolve().parents[2] / "src" / "gpucampaign"


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    interrupt.clear_stop()
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("GPUCAMPAIGN_TRACKING", raising=False)
    yield
    interrupt.clear_stop()


@pytest.fixture
def fake(monkeypatch) -> FakeClient:
    client = FakeClient()
    monkeypatch.setattr(tracking, "make_client", lambda uri: client)
    return client


def _tracker(folder: Path, client: FakeClient, **kw: Any) -> RunTracker:
    folder.mkdir(parents=True, exist_ok=True)
    return RunTracker(
        client=client,
        uri="http://127.0.0.1:1",
        experiment="exp",
        campaign_id="c-1",
        run_folder=folder,
        run_id="control-abc",
        tags={"gpucampaign.run_id": "control-abc", "gpucampaign.config_sha256": "ab" * 32},
        params={"lr": "0.01"},
        flush_every_s=3600,  # the tests flush by hand
        **kw,
    )


def _train(step: int, loss: float = 1.0) -> dict[str, Any]:
    return {"kind": "train", "step": step, "loss": loss, "lr": 0.01, "epoch": 0}


def test_rows_become_metrics_by_step():
    assert row_records(_train(3, 0.5), ts=7) == [
        ("train/loss", 0.5, 3, 7),
        ("train/lr", 0.01, 3, 7),
    ]
    ev = {"kind": "eval", "step": 4, "split": "val", "accuracy": 0.9, "eval_s": 0.1, "final": False}
    assert row_records(ev, ts=1) == [("val/accuracy", 0.9, 4, 1)]
    final = {**ev, "final": True, "macro_f1": float("nan")}
    assert row_records(final, ts=1) == [("final/val/accuracy", 0.9, 4, 1)]  # NaN left out
    assert row_records({"kind": "restore", "step": 2, "restore_s": 0.1}, ts=1) == []


def test_a_run_is_created_under_the_campaigns_parent_with_its_ids(tmp_path):
    client = FakeClient()
    t = _tracker(tmp_path / "run", client)
    for s in (1, 2, 3):
        t.write(_train(s))
    assert t.flush(final=False)
    ((rid, child),) = client.child_runs().items()
    assert child["tags"]["gpucampaign.run_id"] == "control-abc"
    assert child["tags"]["gpucampaign.config_sha256"] == "ab" * 32
    parent = client.runs[child["tags"]["mlflow.parentRunId"]]
    assert parent["tags"] == {"gpucampaign.kind": "campaign", "gpucampaign.campaign_id": "c-1"}
    assert child["params"] == {"lr": "0.01"}
    assert client.steps(rid, "train/loss") == [1, 2, 3]
    state = json.loads((tmp_path / "run" / MLFLOW_STATE_FILE).read_text())
    assert state["mlflow_run_id"] == rid and state["sent"]["train/loss"] == 3


def test_a_server_down_warns_once_keeps_the_metrics_and_sends_them_when_back(tmp_path, caplog):
    client = FakeClient()
    client.down = True
    t = _tracker(tmp_path / "run", client)
    with caplog.at_level(logging.WARNING, logger=tracking.__name__):
        for s in range(1, 5):
            t.write(_train(s))
            assert not t.flush()
    warnings = [r for r in caplog.records if "does not answer" in r.getMessage()]
    assert len(warnings) == 1 and t.down
    outbox = (tmp_path / "run" / MLFLOW_OUTBOX_FILE).read_text().splitlines()
    assert [json.loads(line)[2] for line in outbox if "train/loss" in line] == [1, 2, 3, 4]
    client.down = False
    t.write(_train(5))
    assert t.flush()
    (rid,) = client.child_runs()
    assert client.steps(rid, "train/loss") == [1, 2, 3, 4, 5]
    assert not (tmp_path / "run" / MLFLOW_OUTBOX_FILE).exists()  # all sent
    assert not t.down


def test_a_resume_continues_the_same_run_and_logs_no_step_twice(tmp_path):
    client = FakeClient()
    folder = tmp_path / "run"
    first = _tracker(folder, client)
    for s in range(1, 9):
        first.write(_train(s))
    first.flush()
    (rid,) = client.child_runs()
    # The process dies after step 8, its last checkpoint at step 5: steps 6..8 are trained again.
    again = _tracker(folder, client, known_run_id=rid, restored_step=5)
    for s in range(6, 12):
        again.write(_train(s, loss=2.0))
    again.flush(final=True)
    assert list(client.child_runs()) == [rid]
    assert client.steps(rid, "train/loss") == list(range(1, 12))
    assert client.runs[rid]["status"] == "RUNNING"  # reopened; no status given to end it


def test_a_resume_on_another_host_reads_the_sent_steps_from_the_server(tmp_path):
    client = FakeClient()
    first = _tracker(tmp_path / "a", client)
    for s in range(1, 6):
        first.write(_train(s))
    first.flush()
    (rid,) = client.child_runs()
    elsewhere = _tracker(tmp_path / "b", client, known_run_id=rid, restored_step=3)
    for s in range(4, 8):
        elsewhere.write(_train(s))
    assert elsewhere.flush()
    assert client.steps(rid, "train/loss") == [1, 2, 3, 4, 5, 6, 7]


def test_a_dead_process_outbox_after_the_restored_step_is_dropped(tmp_path):
    client = FakeClient()
    client.down = True
    folder = tmp_path / "run"
    first = _tracker(folder, client)
    for s in range(1, 8):
        first.write(_train(s))
    first.flush()
    client.down = False
    # Restored at step 4: steps 5..7 are trained again and sent then, with their new values.
    again = _tracker(folder, client, restored_step=4)
    kept = (folder / MLFLOW_OUTBOX_FILE).read_text().splitlines()
    assert max(json.loads(line)[2] for line in kept) == 4  # the dead steps left the outbox
    for s in range(5, 7):
        again.write(_train(s, loss=9.0))
    assert again.flush()
    (rid,) = client.child_runs()
    losses = [(s, v) for k, s, v in client.logged[rid] if k == "train/loss"]
    assert losses == [(1, 1.0), (2, 1.0), (3, 1.0), (4, 1.0), (5, 9.0), (6, 9.0)]


def test_a_tracked_run_interrupted_and_resumed_is_one_mlflow_run(tmp_path, digits_file, fake):  # noqa: F811
    spec = make_spec(
        tmp_path,
        digits_file,
        tracking={"mlflow": {"uri": "http://127.0.0.1:9", "experiment": "digits"}},
        checkpoint={"every_steps": 4},
        control={"eval_every": 5},
    )

    def stop(info: dict[str, Any]) -> None:
        if info["step"] >= 10:
            interrupt.request_stop("SIGINT")

    with pytest.raises(Interrupted):
        run(spec, tmp_path, progress=stop)
    interrupt.clear_stop()
    ((rid, child),) = fake.child_runs().items()
    assert child["status"] == "KILLED"
    meta = sorted((tmp_path / "out" / "checkpoints").rglob("meta.json"))[-1]
    assert json.loads(meta.read_text())[META_KEY] == rid
    res = run(spec, tmp_path)
    assert res.completed and res.resumed_from_step is not None
    assert list(fake.child_runs()) == [rid]
    assert fake.runs[rid]["status"] == "FINISHED"
    assert fake.steps(rid, "train/loss") == list(range(1, res.steps_done + 1))
    assert fake.steps(rid, "val/accuracy") == [5, 10, 15, 20]
    assert fake.steps(rid, "final/val/accuracy") == [res.steps_done]
    params = fake.runs[rid]["params"]
    assert params["lr"] == "0.01" and params["recipe"] == "mlp" and params["hidden"] == "[16]"
    assert fake.runs[rid]["tags"]["gpucampaign.factor"] == "none (the control)"
    assert (
        fake.runs[rid]["tags"]["gpucampaign.config_sha256"]
        == spec.resolve_run("control").config_sha256
    )


def test_a_variant_names_the_factor_it_changes(tmp_path, digits_file, fake):  # noqa: F811
    spec = make_spec(
        tmp_path,
        digits_file,
        tracking={"mlflow": {"uri": "http://127.0.0.1:9"}},
        variants=[{"name": "fast", "changes": {"lr": 0.05}}],
    )
    tags, params = tracking.run_identity(spec, spec.resolve_run("fast"))
    assert tags["gpucampaign.factor"] == "lr=0.05"
    assert params["factor.lr"] == "0.05" and params["lr"] == "0.05"


def test_the_close_tags_the_parent_and_logs_the_report(tmp_path, digits_file, fake):  # noqa: F811
    spec = make_spec(tmp_path, digits_file, tracking={"mlflow": {"uri": "http://127.0.0.1:9"}})
    root = tmp_path / "out"
    (root / "figures").mkdir(parents=True)
    (root / "report.md").write_text("# report\n")
    (root / "figures" / "curves.png").write_bytes(b"png")
    line = track_close(
        spec,
        root=root,
        campaign_id="t-1",
        verdict={"kind": "adopt", "run": "fast", "answer": "Adopt fast.", "text": "..."},
        budget={"spent_usd": 12.5, "rental_per_accepted_usd": None},
        files=["report.md", "report.html", "figures/curves.png"],
    )
    assert line is not None and "2 artifacts" in line
    ((pid, parent),) = fake.runs.items()
    assert parent["tags"]["gpucampaign.verdict"] == "adopt"
    assert parent["tags"]["gpucampaign.budget.spent_usd"] == "12.5"
    assert parent["status"] == "FINISHED"
    assert [a for _, a in fake.artifacts[pid]] == [None, "figures"]
    fake.down = True
    down = track_close(spec, root=root, campaign_id="t-1", verdict={}, budget={}, files=[])
    assert down is not None and "did not answer" in down


def test_tracking_is_off_by_default_and_mlflow_is_never_needed(tmp_path, digits_file, monkeypatch):  # noqa: F811
    def refuse(uri: str) -> Any:
        raise AssertionError("no client while tracking is off")

    monkeypatch.setattr(tracking, "make_client", refuse)
    spec = make_spec(tmp_path, digits_file, control={"epochs": 1})
    assert tracking_uri(spec) is None
    assert run(spec, tmp_path).completed
    assert not (run_dir(spec, tmp_path) / MLFLOW_STATE_FILE).exists()
    # mlflow is imported inside functions of the tracking module only.
    for path in SRC.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            names = [a.name for a in getattr(node, "names", [])]
            module = getattr(node, "module", None) or ""
            assert not any(n.startswith("mlflow") for n in [*names, module]), path


def test_the_uri_comes_from_the_spec_else_the_environment(tmp_path, digits_file, monkeypatch):  # noqa: F811
    plain = make_spec(tmp_path, digits_file)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://env:5000")
    assert tracking_uri(plain) == "http://env:5000"
    mine = make_spec(tmp_path, digits_file, tracking={"mlflow": {"uri": "http://spec:5000"}})
    assert tracking_uri(mine) == "http://spec:5000"
    monkeypatch.setenv("GPUCAMPAIGN_TRACKING", "off")
    assert tracking_uri(mine) is None
    assert spec_sha256(plain) == spec_sha256(mine)  # where it is tracked is not the campaign


def test_a_uri_with_credentials_is_refused(tmp_path, digits_file):  # noqa: F811
    with pytest.raises(SpecError, match="MLFLOW_TRACKING_PASSWORD"):
        make_spec(tmp_path, digits_file, tracking={"mlflow": {"uri": "http://u:secret@h:5000"}})


def test_the_server_command_line_holds_no_backend_uri():
    from infra.mlflowserver import command

    cmd = command(port=5000, artifacts="s3://gpucampaign/mlflow")
    assert cmd[1:3] == ["server", "--host"] and "--serve-artifacts" in cmd
    assert not any("backend" in part or "postgresql" in part for part in cmd)


def test_a_sealed_folder_is_sent_later_once_and_never_written(tmp_path, digits_file, fake):  # noqa: F811
    """`campaign track`'s work: what the close could not send goes later, exactly the (metric,
    step) pairs the server lacks, and nothing is written into the sealed folder."""
    spec = make_spec(
        tmp_path,
        digits_file,
        tracking={"mlflow": {"uri": "http://127.0.0.1:1", "experiment": "exp"}},
    )
    root = tmp_path / "out"
    t = _tracker(root / "runs" / "control-abc", fake)
    for s in range(1, 4):
        t.write(_train(s))
    assert t.flush()  # steps 1..3 reached the server, then it went down to the close
    fake.down = True
    for s in range(4, 9):
        t.write(_train(s))
    t.status = "FINISHED"
    assert not t.flush(final=True)
    (root / "report.md").write_text("# report\n")
    (rid,) = fake.child_runs()
    fake.logged[rid].append(("train/loss", 6, 0.5))  # one value of the outage got there anyway
    sealed = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    assert root / "runs" / "control-abc" / MLFLOW_OUTBOX_FILE in sealed
    manifest = {
        "campaign_id": "c-1",
        "verdict": {"kind": "adopt", "run": "wide"},
        "budget": {"spent_usd": 3.5},
        "files": [{"path": "report.md"}, {"path": "runs/control-abc/metrics.jsonl"}],
    }
    fake.down = False
    line, done = track_sealed(spec, root=root, manifest=manifest, client=fake, folder_uri=True)
    assert done and "9 metric values sent late" in line, line  # 5 train/lr, 4 train/loss
    assert sorted(fake.steps(rid, "train/loss")) == list(range(1, 9))  # each step once
    assert sorted(fake.steps(rid, "train/lr")) == list(range(1, 9))
    assert fake.runs[rid]["status"] == "FINISHED"
    parent = fake.runs[fake.runs[rid]["tags"]["mlflow.parentRunId"]]
    assert parent["tags"]["gpucampaign.verdict"] == "adopt"
    assert parent["tags"]["gpucampaign.budget.spent_usd"] == "3.5"
    assert [a for _, a in fake.artifacts[fake.runs[rid]["tags"]["mlflow.parentRunId"]]] == [None]
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == sealed
    line, done = track_sealed(spec, root=root, manifest=manifest, client=fake, folder_uri=True)
    assert done and "sent late" not in line
    assert sorted(fake.steps(rid, "train/loss")) == list(range(1, 9))
    fake.down = True
    line, done = track_sealed(spec, root=root, manifest=manifest, client=fake, folder_uri=True)
    assert not done and "did not answer (" in line
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == sealed


def test_the_experiment_opens_in_mlflows_model_training_view():
    """MLflow 3 opens an experiment without ``mlflow.experimentKind`` in its GenAI view, where
    the campaign's runs do not show: created, it is tagged for model training; an existing one
    without the tag gets it; a kind someone chose is kept."""
    from gpucampaign.tracking.mlflow import EXPERIMENT_KIND_TAG, ensure_experiment

    client = FakeClient()
    eid = ensure_experiment(client, "fresh")
    assert client.experiment_tags[eid] == {EXPERIMENT_KIND_TAG: "custom_model_development"}
    old = client.create_experiment("old")
    assert ensure_experiment(client, "old") == old
    assert client.experiment_tags[old][EXPERIMENT_KIND_TAG] == "custom_model_development"
    chosen = client.create_experiment("chosen", tags={EXPERIMENT_KIND_TAG: "finetuning"})
    ensure_experiment(client, "chosen")
    assert client.experiment_tags[chosen][EXPERIMENT_KIND_TAG] == "finetuning"
