"""`resume: training|inference` in a run config: no new run ID, and the restart check and the
report say which restart applies."""

from __future__ import annotations

import pytest

from gpucampaign.close.report import _resume_md
from gpucampaign.config import SpecError, parse_spec
from gpucampaign.restartcheck.compare import RestartReport

BASE = {
    "name": "x",
    "packages": [{"gpu": "rtx4090", "days": 3}],
    "calendar": [{"name": "prep", "kind": "human", "hours": 1}],
    "control": {"recipe": "mlp", "hidden": [16], "epochs": 1},
}


def test_resume_changes_no_run_id_and_rejects_other_values():
    training = parse_spec(BASE)
    inference = parse_spec({**BASE, "control": {**BASE["control"], "resume": "inference"}})
    assert training.run_config("control").resume == "training"
    assert inference.run_config("control").resume == "inference"
    assert training.resolve_run("control").run_id == inference.resolve_run("control").run_id
    with pytest.raises(SpecError, match="resume"):
        parse_spec({**BASE, "control": {**BASE["control"], "resume": "sometimes"}})


def test_the_restart_check_and_the_report_say_which_restart_applies():
    report = RestartReport(
        identical=True,
        compared_steps=4,
        max_abs_diff=0.0,
        save_s=None,
        restore_s=None,
        total_s=1.0,
        k=2,
        n=4,
        threads=1,
        resume="inference",
    )
    assert "restarts inference from the last good model" in report.applies
    assert report.to_dict()["resume"] == "inference"
    md = "\n".join(
        _resume_md(
            {
                "runs": [
                    {"run": "control", "run_id": "control-0123456789", "resume": "training"},
                    {"run": "wide", "run_id": "wide-0123456789", "resume": "inference"},
                ]
            }
        )
    )
    assert "## Restart after an interruption" in md
    assert "control (`control-0123456789`): resume: training" in md
    assert "wide (`wide-0123456789`): resume: inference" in md
