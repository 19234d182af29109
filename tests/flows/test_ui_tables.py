"""The live table of a run's evaluations in the Prefect UI: one key per run of one campaign
(two campaigns training the same config keep their own rows), numbers rounded as the report
prints them."""

from __future__ import annotations

import json
from pathlib import Path

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
        view = ui.TrainingView("train", RUN, out=str(out), campaign="same")
        view.live_tables({"metric": "accuracy", "metric_step": 2, "planned_steps": 2}, final=True)
        outs.append(out)
    keys = [ui.evaluations_key(RUN, campaign=read_campaign_id(out) or "") for out in outs]
    assert len(set(keys)) == 2 and set(tables) == set(keys)
    first, second = (tables[k] for k in keys)
    assert [r["train_loss"] for r in first] == [2.629, 1.5]
    assert [r["value"] for r in first] == [0.8762, 0.5]
    assert [r["train_loss"] for r in second] == [0.7, 0.1235]
