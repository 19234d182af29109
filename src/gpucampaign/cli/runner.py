"""Start the Prefect flows from the CLI without the library importing Prefect itself.

The Prefect layer is the package ``gpucampaign_prefect`` (its flows in ``flows``, the embedded
server in ``orchestration.embedded``): set quiet embedded-server defaults, then take what is
needed by name from the layer's one seam (``gpucampaign_prefect.entry``), through ``load_flow``
alone.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import re
import sys
import threading
from collections.abc import Iterator
from typing import Any

from gpucampaign.cli.starting import EMBEDDED_DEFAULTS, embedded_environment, take_held_server
from gpucampaign.config.recipefile import RecipeError
from gpucampaign.core import interrupt
from gpucampaign.core.errors import INPUT_ERRORS, InputError
from gpucampaign.core.stoprules import STOP_RULES, StopRule


def prefect_environment(*, logging_level: str | None = None) -> dict[str, str]:
    """The embedded-server defaults, optionally with another logging level (tests, benches)."""
    env = dict(EMBEDDED_DEFAULTS)
    if logging_level:
        env["PREFECT_LOGGING_LEVEL"] = logging_level
    return env


class ExpectedStops(logging.Filter):
    """Drop Prefect's ERROR lines for outcomes the campaign planned for: a task that ended by a
    stop rule (a futile variant, the quality floor: the flow records the stop, and the progress
    line and the flow's own warning say it), an interruption (Ctrl-C or SIGTERM: the task ends
    Cancelled, the phases waiting on it are left NotReady, and the end of the run says it was
    interrupted and saved), and a refusal of the user's input (one paragraph at the end, exit
    2). An ERROR line for any of them reads as a crash."""

    # A refusal of the user's input (a recipe that raised mid-training among them) is said
    # once, as the run's last paragraph (exit 2): Prefect's tracebacks of it are noise.
    _names = "|".join(
        sorted({*(c.__name__ for c in STOP_RULES.values()), *INPUT_ERRORS, RecipeError.__name__})
    )
    _stop = re.compile(rf"encountered an exception ({_names}):")
    _interrupted = re.compile(r"Finished in state (Cancelled|NotReady)\(")

    def filter(self, record: logging.LogRecord) -> bool:
        """False for the record of a task that ended by a stop rule or an interruption."""
        if record.levelno < logging.ERROR:
            return True
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, StopRule | interrupt.Interrupted | InputError):
            return False
        message = record.getMessage()
        return not (self._stop.search(message) or self._interrupted.search(message))


def quiet_expected_stops() -> None:
    """Keep Prefect's task-run ERROR lines for stop rules and interruptions out of the
    terminal."""
    for name in ("prefect.task_runs", "prefect.flow_runs"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, ExpectedStops) for f in logger.filters):
            logger.addFilter(ExpectedStops())


def load_flow(name: str) -> Any:
    """The Prefect layer's object ``name`` through its one seam, ``gpucampaign_prefect.entry``
    (its table ``ENTRIES`` says which module defines each name): the CLI's one way into the
    layer (a test replaces it to see that a command would start Prefect)."""
    embedded_environment()
    return importlib.import_module("gpucampaign_prefect").entry(name)


def load_embedded(name: str) -> Any:
    """The object ``name`` of the embedded server's module (``orchestration.embedded``)."""
    return load_flow(name)


def start_server_early() -> Any | None:
    """The embedded server's process, booting while Prefect and the flows load here: the one
    held since the first line (let go now), else one started now; ``interruptible_run`` adopts
    it. None when the environment names a server. Stop it (``.stop()``) when the run ends
    before that."""
    held = take_held_server()
    if held is not None:
        held.go()
        early = held
    else:
        early = load_embedded("spawn_early")()
    return early


def warm_up() -> None:
    """What the first training step would otherwise import in series: ``torch._dynamo`` (torch
    imports it in the first optimizer a process builds). A failure here only leaves it to load
    when used."""
    # Only torch._dynamo: none of the ~800 modules it imports is among those the flow's start
    # imports meanwhile in the main thread (Prefect's engine, fastapi's encoders; both sets
    # recorded on 2026-12-05), so no import in one thread meets a module half-made by the other.
    with contextlib.suppress(Exception):
        import torch

        torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))])


@contextlib.contextmanager
def interruptible_run(
    *, grace_s: float = interrupt.DEFAULT_GRACE_S, early: Any | None = None
) -> Iterator[None]:
    """Run a flow in this process so that SIGINT and SIGTERM stop it gracefully.

    The embedded server starts first, in its own session (the terminal's Ctrl-C must not
    reach it), after the servers of earlier killed runs are ended. It stops at the
    interpreter's exit, after Prefect has sent its last logs and events to it, or at once when
    the grace runs out or on a second Ctrl-C; a lifeline ends it when this process is killed.
    The signals become a stop request the training honours at its next step. ``early``: the
    server's process from ``start_server_early``, adopted once it answers.

    ``warm_up`` starts first, in a thread: it runs while this process waits for the server's
    answer and for the flow's first API calls. Started earlier (with the server's ``go``), it
    took the CPU from Prefect's import instead, which is in series before the first step. The
    flow's own first imports (``preload_flow_start``) load during that wait too.
    """
    threading.Thread(target=warm_up, name="warm-up", daemon=True).start()
    start, stop = load_embedded("start_detached"), load_embedded("stop")
    release = load_embedded("release")
    preload_flow_start = load_embedded("preload_flow_start")
    reaped = load_embedded("reap_stale")()
    if reaped:
        sys.stderr.write(
            f"note: ended {len(reaped)} Prefect server(s) left running by an earlier killed "
            f"`campaign run` (PID {', '.join(map(str, reaped))})\n"
        )
    interrupt.clear_stop()
    preload_flow_start()
    with interrupt.graceful_signals(grace_s=grace_s):
        server = start(early)
        interrupt.on_force(lambda: stop(server, wait=False))
        try:
            yield
        finally:
            release(server)
