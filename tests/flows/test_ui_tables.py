"""The live table of a run's evaluations in the Prefect UI: one key per run of one campaign
(two campaigns training the same config keep their own rows), numbers rounded as the report
prints them."""

from __future__ import annotations

import json
from pathlib import Path

from gpucampaign.folder.layout import RunFolder
from gpucampaign.folder.records import fix_campaign_id, read_campaign_id

RUN = "control-0123456789"


def _folder(root: Path, *, losses: list[float]) -> Path:
    run_dir = root / "runs" / RUN
    run_dir.mkdir(parents=True)
    rows = []
    for step, loss in enumerate(losses, start=1):
        rows.append({"kind": "train", "step": step, "loss": loss, "step_s": 0.1})
        rows.append({"kind": "eval", "step": step, "split": "val", "accuracy": loss / 3})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def test_two_campaigns_training_one_config_keep_their_own_tables(monkeypatch, tmp_path):
    from gpucampaign_prefect.orchestration import ui

    tables: dict[str, list[dict]] = {}
    monkeypatch.setattr(ui, "create_progress_artifact", lambda **kw: "artifact-id")
    monkeypatch.setattr(
        ui, "create_table_artifact", lambda *, table, key, description: tables.update({key: table})
    )
    outs = []
    for n, losses in enumerate(([2.628716966999111, 1.5], [0.7, 0.123456789])):
        out = _folder(tmp_path / f"out{n}", losses=losses)
        fix_campaign_id(out, name="same", spec_sha256=f"{n}" * 64)
        view = ui.TrainingView("train", run_folder=RunFolder.of(out, RUN), campaign="same")
        view.live_tables({"metric": "accuracy", "metric_step": 2, "planned_steps": 2}, final=True)
        view.close()  # its thread ends here, not in a later test's patches
        outs.append(out)
    keys = [ui.evaluations_key(RUN, campaign=read_campaign_id(out) or "") for out in outs]
    assert len(set(keys)) == 2 and set(tables) == set(keys)
    first, second = (tables[k] for k in keys)
    assert [r["train_loss"] for r in first] == [2.629, 1.5]
    assert [r["value"] for r in first] == [0.8762, 0.5]
    assert [r["train_loss"] for r in second] == [0.7, 0.1235]


def test_the_training_hands_its_updates_over_and_goes_on(monkeypatch, tmp_path):
    """The live view's API calls run on its own thread, in order: making the view and each
    update return while the API has not answered, and ``finish`` waits for the full bar."""
    import threading
    import time

    from gpucampaign_prefect.orchestration import ui

    answer = threading.Event()
    calls: list[tuple[str, float]] = []

    def create(**kw):
        answer.wait(30)
        calls.append(("create", kw["progress"]))
        return "artifact-id"

    def update(*, artifact_id, progress, description):
        assert artifact_id == "artifact-id"
        calls.append(("update", progress))

    monkeypatch.setattr(ui, "create_progress_artifact", create)
    monkeypatch.setattr(ui, "update_progress_artifact", update)
    monkeypatch.setattr(ui, "create_table_artifact", lambda **kw: calls.append(("table", 0.0)))
    out = _folder(tmp_path / "out", losses=[1.5, 0.7])
    t0 = time.monotonic()
    view = ui.TrainingView("train", run_folder=RunFolder.of(out, RUN), campaign="c")
    assert not view.created  # nothing is written before the training runs (the GPU lock's
    view.drain()  # acquisition comes next, and SQLite takes one writer at a time)
    view.last -= ui.PROGRESS_EVERY_S  # an update is due
    view({"step": 1, "planned_steps": 2, "metric": "accuracy", "metric_step": 1})
    assert time.monotonic() - t0 < 10 and calls == []  # the API has not answered yet
    answer.set()
    view.drain()
    assert calls == [("create", 0.0), ("update", 50.0), ("table", 0.0)]
    view.finish()
    assert calls == [
        ("create", 0.0),
        ("update", 50.0),
        ("table", 0.0),
        ("update", 100.0),
        ("table", 0.0),
    ]
    view.close()  # again: it only waits


def test_the_first_update_is_due_two_seconds_into_the_training_not_after_the_wait(
    monkeypatch, tmp_path
):
    """A view made before its call waited for the GPU slot as long as ``PROGRESS_EVERY_S``:
    ``start`` (the slot held) sets its clock, so the training's first steps make no artifact
    (main: the first progress after such a wait made it, API round trips beside the first
    steps of a call that may last less than a second); 2 s into the training, the update."""
    from gpucampaign_prefect.orchestration import ui

    calls: list[str] = []
    monkeypatch.setattr(ui, "create_progress_artifact", lambda **kw: calls.append("create"))
    monkeypatch.setattr(ui, "update_progress_artifact", lambda **kw: calls.append("update"))
    monkeypatch.setattr(ui, "create_table_artifact", lambda **kw: calls.append("table"))
    out = _folder(tmp_path / "out", losses=[1.5, 0.7])
    view = ui.TrainingView("train", run_folder=RunFolder.of(out, RUN), campaign="c")
    view.last -= ui.PROGRESS_EVERY_S  # made before a wait for the slot as long
    view.start()
    info = {"step": 1, "planned_steps": 4, "metric": "accuracy", "metric_step": 1}
    view(info)
    view.drain()
    assert calls == [] and not view.created
    view.last -= ui.PROGRESS_EVERY_S  # 2 s into the training
    view({**info, "step": 2})
    view.drain()
    assert calls[0] == "create" and view.created
    view.close()


def test_a_live_view_that_cannot_reach_the_api_never_stops_the_training(monkeypatch, tmp_path):
    """The progress artifact is refused: the updates are skipped and the training goes on."""
    from gpucampaign_prefect.orchestration import ui

    def refused(**kw):
        raise ConnectionError("the API is down")

    monkeypatch.setattr(ui, "create_progress_artifact", refused)
    monkeypatch.setattr(ui, "update_progress_artifact", refused)
    monkeypatch.setattr(ui, "create_table_artifact", refused)
    out = _folder(tmp_path / "out", losses=[1.5])
    view = ui.TrainingView("train", run_folder=RunFolder.of(out, RUN))
    view.last -= ui.PROGRESS_EVERY_S
    view({"step": 1, "planned_steps": 1})
    view.finish()
    assert view.id is None and not view.calls._thread.is_alive()
