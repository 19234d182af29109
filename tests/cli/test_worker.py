"""`campaign worker --lot K`: the `prefect worker start` line it builds, shows and becomes."""

from __future__ import annotations

import os
import socket
from typing import Any

import pytest
from typer.testing import CliRunner

from gpucampaign.cli import app
from gpucampaign.cli import runner as runner_module
from gpucampaign.cli import worker as worker_module
from gpucampaign.cli.worker import shown_line, worker_line

runner = CliRunner()


def test_the_line_names_the_pool_the_lots_queue_and_a_worker_of_this_host() -> None:
    assert worker_line(2, pool="gpucampaign") == [
        "prefect",
        "worker",
        "start",
        "--pool",
        "gpucampaign",
        "--work-queue",
        "lot-2",
        "--type",
        "process",
        "--name",
        f"{socket.gethostname()}-lot-2",
    ]
    # The first lot's worker polls the default queue too: campaign/main lands there.
    line = worker_line(1, pool="p", queue="cheap", name="box a")
    assert shown_line(line, lot=1) == (
        "GPUCAMPAIGN_LOT=1 prefect worker start --pool p --work-queue cheap --work-queue default "
        "--type process --name 'box a'"
    )


def test_the_command_prints_the_line_and_becomes_the_worker_with_its_lot_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran: dict[str, Any] = {}

    def execve(program: str, args: list[str], env: dict[str, str]) -> None:
        ran.update(program=program, args=args, env=env)

    monkeypatch.setattr(worker_module.os, "execve", execve)
    made: list[dict[str, Any]] = []

    def ensure_work_queues(**kw: Any) -> list[str]:
        made.append(kw)
        return list(kw["queues"])

    monkeypatch.setattr(runner_module, "load_flow", {"ensure_work_queues": ensure_work_queues}.get)
    # A credential in the server's URL stays in the environment, never on the line shown.
    monkeypatch.setenv("PREFECT_API_URL", "http://user:s3cret@host:4200/api")
    monkeypatch.delenv("GPUCAMPAIGN_LOT", raising=False)
    result = runner.invoke(app, ["worker", "--lot", "2", "--name", "w2"])
    assert result.exit_code == 0, result.output
    assert result.output.strip().splitlines() == [
        "running: GPUCAMPAIGN_LOT=2 prefect worker start --pool gpucampaign --work-queue lot-2 "
        "--type process --name w2",
        # A worker polls none of its queues while one is missing: they are made first.
        "made work queue(s) lot-2 of pool gpucampaign on the server",
    ]
    assert made == [{"pool": "gpucampaign", "queues": ["lot-2"]}]
    assert os.path.basename(ran["program"]) == "prefect"
    assert ran["args"][1:] == worker_line(2, pool="gpucampaign", name="w2")[1:]
    assert ran["env"]["GPUCAMPAIGN_LOT"] == "2" and ran["env"]["GPUCAMPAIGN_WORKER"] == "w2"
    assert ran["env"]["PREFECT_API_URL"] == "http://user:s3cret@host:4200/api"
    assert "s3cret" not in result.output


def test_a_lot_below_one_is_refused_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_module.os, "execve", pytest.fail)
    result = runner.invoke(app, ["worker", "--lot", "0"])
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert "--lot 0" in text and "numbered from 1" in text and "--lot 1" in text
