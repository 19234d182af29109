"""How `campaign run` ends when its flow ended Cancelled with no stop asked in its process (a
rank of a data-parallel run stopped on its own): exit 3 with the flow's message, never exit 0
with "verdict: none" and a report that was never written."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from prefect.states import Cancelled

from gpucampaign.cli.commands import _end_of_run
from gpucampaign.core.interrupt import clear_stop, stop_requested


def test_a_cancelled_flow_with_no_stop_asked_here_exits_3_with_its_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clear_stop()
    assert stop_requested() is None
    message = "interrupted by stop on another rank at step 7; rerun to resume"
    with pytest.raises(typer.Exit) as ended:
        _end_of_run(Cancelled(message=message), target=tmp_path, question="Does it work?")
    assert ended.value.exit_code == 3
    said = capsys.readouterr()
    assert "stopped:" in said.err and message in said.err
    assert "verdict" not in said.out and "report" not in said.out
