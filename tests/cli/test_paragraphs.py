"""Failures a user meets, each one paragraph and exit 2 instead of a traceback."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpucampaign.cli import app
from gpucampaign.cli.scaffold import init_campaign


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_run_with_prefect_api_url_at_a_server_that_is_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    spec = init_campaign(tmp_path / "p")
    out = tmp_path / "out"
    url = f"http://127.0.0.1:{_closed_port()}/api"
    monkeypatch.setenv("PREFECT_API_URL", url)
    with temporary_settings(updates={PREFECT_API_URL: url}):
        result = CliRunner().invoke(app, ["run", str(spec), "--out", str(out)])
    text = " ".join(result.output.split())
    assert result.exit_code == 2, (text, result.exception)
    assert "Traceback" not in text
    assert f"the Prefect server at PREFECT_API_URL {url} does not answer" in text
    assert "unset PREFECT_API_URL" in text
    assert not out.exists()


def test_calibrate_from_with_a_corpus_that_is_not_a_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The textlm example's corpus is a pinned text file its recipe reads: the calibration
    counts the control's train examples as the recipe builds them (it used to split a table
    that is not there: AttributeError)."""
    import json

    import gpucampaign.preflight
    from gpucampaign.cli.scaffold_textlm import init_textlm
    from gpucampaign.preflight import Preflight

    # The recipe's own checks are the preflight tests' (seconds of CPU): not this test's.
    monkeypatch.setattr(gpucampaign.preflight, "preflight", lambda *a, **k: Preflight(()))

    spec = init_textlm(tmp_path / "textlm")
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    pilot = {"batch_size": 8, "n_train": 100, "load_s": 1.0, "step_s": 0.5, "planned_steps": 50}
    measured = {"load_s": 1.0, "step_s": 0.5, "eval_s": 1.0, "save_s": 1.0, "restore_s": None}
    (earlier / "estimates.json").write_text(
        json.dumps({"campaign_id": "old-1", "measured": measured, "pilot": {"control": pilot}})
    )
    result = CliRunner().invoke(
        app, ["plan", str(spec), "--json", "--calibrate-from", str(earlier)]
    )
    assert result.exit_code in (0, 4), (result.output, result.exception)
    assert "old-1" in json.loads(result.stdout)["calibrated"]["train-control"]


def test_a_recipe_that_raised_is_no_prefect_traceback_in_the_terminal() -> None:
    """The run's last paragraph says a recipe that raised (exit 2): Prefect's ERROR lines and
    tracebacks of it, of its task and of the flow, are dropped; a crash's stay."""
    import logging

    from gpucampaign.cli.runner import ExpectedStops
    from gpucampaign.recipe.contract import RecipeError

    def log_record(msg: str, exc: BaseException | None = None) -> logging.LogRecord:
        info = (type(exc), exc, None) if exc is not None else None
        return logging.LogRecord("prefect.task_runs", logging.ERROR, __file__, 1, msg, None, info)

    keep = ExpectedStops().filter
    raised = RecipeError("m:R", "loss() at step 3 (m.py, line 9)", "raised ValueError: boom")
    assert not keep(log_record("Task run failed with exception", raised))
    assert not keep(log_record("Encountered exception during execution", raised))
    failed = "Finished in state Failed('Task run encountered an exception RecipeError: recipe')"
    assert not keep(log_record(failed))
    assert keep(log_record("Task run failed with exception", RuntimeError("boom")))
