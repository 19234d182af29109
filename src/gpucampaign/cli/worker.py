"""``campaign worker --lot K``: one machine's worker, one command.

A thin wrapper over Prefect's process worker: it builds the ``prefect worker start`` line for
the campaign's work pool and lot K's work queue, prints it (what a user would type, with no
credential in it), and replaces this process with it, ``GPUCAMPAIGN_LOT=K`` set, so that every
flow run the worker starts knows which lot's machine it runs on (its lot's end; its records
name the lot), and ``GPUCAMPAIGN_WORKER`` set to the worker's name (the records name it too).
Signals go to the worker itself: Ctrl-C stops it as it stops ``prefect worker start``.

It is registered on the one ``app`` of ``cli/common.py`` when ``cli`` imports this module.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import sys
from collections.abc import Mapping
from pathlib import Path

import typer

from gpucampaign.cli.common import app, esc, handle_errors, say
from gpucampaign.core.errors import ArgumentError
from gpucampaign.core.text import redact_secrets
from gpucampaign.plan.lots import LOT_ENV, WORKER_ENV
from gpucampaign.plan.machines import LOT_QUEUE

#: The work pool of the campaign's deployments (``deployments/prefect.yaml``, ``campaign deploy``).
DEFAULT_POOL = "gpucampaign"
#: The pool's queue of a deployment that names none (``campaign/main``): lot 1's worker polls it.
DEFAULT_QUEUE = "default"


def worker_line(
    lot: int, *, pool: str, queue: str | None = None, name: str | None = None
) -> list[str]:
    """The ``prefect worker start`` arguments of lot ``lot``'s machine.

    Args:
        lot: The lot's number among the spec's lots (from 1: ``campaign plan`` names it).
        pool: The work pool of the campaign's deployments.
        queue: The lot's work queue (default ``lot-<lot>``: the plan's ``machines[].work_queue``).
            Lot 1's worker polls the pool's ``default`` queue too, where ``campaign/main``
            and ``restart-verification/scheduled`` land: the first machine runs the
            campaign's own flow run.
        name: The worker's name, shown in the UI beside each flow run it starts (default
            ``<host>-lot-<lot>``).

    Raises:
        ArgumentError: ``lot`` is below 1.
    """
    if lot < 1:
        raise ArgumentError(
            f"--lot {lot}: a lot is numbered from 1, in the order of the spec's packages (a "
            "package of count: 2 is lots 1 and 2); `campaign plan SPEC --json` lists them under "
            "'machines'. Give --lot 1 for the first machine.",
            field="--lot",
        )
    queues = [queue or LOT_QUEUE.format(number=lot)]
    if lot == 1:  # the campaign's own flow run and its scheduled checks land on the default queue
        queues.append(DEFAULT_QUEUE)
    return [
        "prefect",
        "worker",
        "start",
        "--pool",
        pool,
        *(arg for q in queues for arg in ("--work-queue", q)),
        "--type",
        "process",
        "--name",
        name or f"{socket.gethostname()}-lot-{lot}",
    ]


def shown_line(args: list[str], *, lot: int) -> str:
    """The line as printed: the environment it sets, then the command, quoted for a shell and
    with any credential redacted."""
    return redact_secrets(f"{LOT_ENV}={lot} {shlex.join(args)}")


def worker_environment(lot: int, *, name: str, env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with ``GPUCAMPAIGN_LOT`` set to ``lot`` and ``GPUCAMPAIGN_WORKER`` to the
    worker's ``name``: the worker's flow runs inherit both, and their records name them."""
    return {**env, LOT_ENV: str(lot), WORKER_ENV: name}


def _prefect_program() -> str:
    """The ``prefect`` program of this environment (beside this Python), else on ``PATH``."""
    beside = Path(sys.executable).with_name("prefect")
    if beside.is_file():
        return str(beside)
    found = shutil.which("prefect")
    if found is None:
        raise ArgumentError(
            "campaign worker: no 'prefect' program beside this Python or on PATH: install the "
            "tool with its Prefect (pip install gpucampaign) in this environment.",
            field="prefect",
        )
    return found


@app.command("worker")
@handle_errors
def worker_cmd(
    lot: int = typer.Option(..., "--lot", help="The lot (machine) this host is, from 1."),
    pool: str = typer.Option(DEFAULT_POOL, "--pool", help="The campaign's work pool."),
    queue: str | None = typer.Option(
        None, "--queue", help="The lot's work queue (default lot-K; a package's work_queue)."
    ),
    name: str | None = typer.Option(None, "--name", help="Worker name (default <host>-lot-K)."),
) -> None:
    """Start this machine's Prefect worker: the campaign's pool, lot K's queue, GPUCAMPAIGN_LOT=K.

    Prints the `prefect worker start ...` line it runs, then becomes that worker (Ctrl-C stops
    it). Run it on each rented machine, from the environment the tool is installed in, in any
    folder; PREFECT_API_URL names the server (exit 2 when --lot is below 1). Lot 1's worker
    also polls the pool's default queue, where campaign/main lands.
    """
    args = worker_line(lot, pool=pool, queue=queue, name=name)
    say(f"running: {esc(shown_line(args, lot=lot))}")
    program = _prefect_program()
    env = worker_environment(lot, name=args[args.index("--name") + 1], env=os.environ)
    queues = [v for k, v in zip(args, args[1:], strict=False) if k == "--work-queue"]
    _ensure_queues(pool=pool, queues=queues)
    sys.stdout.flush()
    os.execve(program, [program, *args[1:]], env)


def _ensure_queues(*, pool: str, queues: list[str]) -> None:
    """Make the worker's pool and queues on the server when missing: a Prefect worker polls
    none of its queues while one of them does not exist. Best effort: without a server's URL,
    or with the server out, the worker starts as it is and says why it cannot poll."""
    if not os.environ.get("PREFECT_API_URL"):
        return  # never an ephemeral server of this process's own
    from gpucampaign.cli.runner import load_flow

    try:
        made = load_flow("ensure_work_queues")(pool=pool, queues=queues)
    except Exception as exc:  # the worker's own messages say more about a server out
        say(f"could not check the work queues on the server ({type(exc).__name__}); starting")
        return
    if made:
        say(f"made work queue(s) {', '.join(made)} of pool {pool} on the server")
