"""The first line of the commands that take seconds before their first output (``campaign
run``, ``campaign restart-check``): what is starting, printed before torch, Prefect or the CLI's
own modules load. Standard library only: this module runs before everything else.

Right after that line ``campaign run`` starts its embedded server's process, held: it imports
Prefect's server modules (seconds) on the second core while this process loads torch and checks
the spec, and serves only once the checks pass (``take_held_server``, then ``go``). A run the
checks refuse ends it before it served or wrote anything.
"""

from __future__ import annotations

import atexit
import importlib
import os
import re
import sys
from pathlib import Path
from typing import Any, TextIO

#: Prefect's settings for the embedded server of ``campaign run`` (defaults: what the
#: environment sets wins). Measured: a fresh PREFECT_HOME needs ~21 s to start the embedded
#: server (default limit 20 s), and the telemetry heartbeat floods stderr with SQLite lock
#: errors. The one home of these settings: the CLI, the tests and the benches take them here.
EMBEDDED_DEFAULTS = {
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
    "PREFECT_LOGGING_LEVEL": "INFO",  # one line per finished phase: what a long run shows
}
_HELD: list[Any] = []  # the held server of this ``campaign run``, until taken

# The options of those commands that take a value (their value is not the spec file).
_VALUED = frozenset(
    {"--out", "--decision", "--grace", "--progress-every", "--run", "--steps", "--at"}
)
_NAME = re.compile(r"^name:\s*['\"]?([A-Za-z0-9_.-]+)", re.MULTILINE)


def _arguments(args: list[str]) -> tuple[list[str], dict[str, str]]:
    """The positional arguments and the valued options of a command line (``--x=y`` too)."""
    positional, options = [], {}
    it = iter(args)
    for arg in it:
        if arg.startswith("--") and "=" in arg:
            key, _, value = arg.partition("=")
            options[key] = value
        elif arg in _VALUED:
            options[arg] = next(it, "")
        elif not arg.startswith("-"):
            positional.append(arg)
    return positional, options


def _campaign_name(spec: str) -> str | None:
    """The spec's ``name``, read without YAML (the first line that sets it), or None."""
    try:
        with open(spec, encoding="utf-8", errors="replace") as f:
            found = _NAME.search(f.read(64 * 1024))
    except OSError:
        return None
    return found.group(1) if found else None


def starting_line(argv: list[str]) -> str | None:
    """What ``campaign <argv>`` is starting, or None for a command that answers at once (and
    for ``--help``)."""
    if not argv or argv[0] not in ("run", "restart-check") or {"--help", "-h"} & set(argv):
        return None
    positional, options = _arguments(argv[1:])
    if not positional:
        return None
    spec = positional[0]
    if argv[0] == "run":
        name = _campaign_name(spec)
        out = options.get("--out") or str(Path("out") / name if name else "out/<name>")
        what = f"campaign '{name}'" if name else "the campaign"
        return (
            f"starting {what} ({spec} -> {out}): checking the spec, loading torch, "
            "starting the Prefect server"
        )
    run = options.get("--run") or "control"
    if options.get("--out"):
        return (
            f"restart check of run '{run}' from the latest checkpoint in "
            f"{options['--out']}: loading torch, then resuming it in a new process"
        )
    return (
        f"restart check of run '{run}' of {spec}: loading torch, training it, interrupting it "
        "mid-epoch and resuming it in a new process"
    )


def say_starting(argv: list[str], *, file: TextIO | None = None) -> None:
    """Print ``starting_line`` on stderr (stdout stays the command's: ``--json``), at once."""
    line = starting_line(argv)
    if line is not None:
        out = file or sys.stderr
        out.write(line + "\n")
        out.flush()


def embedded_environment(*, verbose: bool | None = None) -> None:
    """Set the embedded server's defaults in this process's environment (what is set wins).

    ``verbose``: for ``campaign run``, Prefect's own INFO lines only when asked for (the
    progress lines say what runs); None keeps ``EMBEDDED_DEFAULTS``' level.
    """
    if verbose is not None:
        os.environ.setdefault("PREFECT_LOGGING_LEVEL", "INFO" if verbose else "WARNING")
    for key, value in EMBEDDED_DEFAULTS.items():
        os.environ.setdefault(key, value)


def spawn_held_server(argv: list[str]) -> None:
    """For ``campaign run``: start the embedded server's process now, held until the spec's
    checks pass (``take_held_server``); stopped at this process's exit unless adopted."""
    if not argv or argv[0] != "run" or starting_line(argv) is None:  # not --help, a spec named
        return
    embedded_environment(verbose=bool({"-v", "--verbose"} & set(argv)))
    try:
        layer = importlib.import_module("gpucampaign_prefect")  # its one seam: ``entry``
        held = layer.entry("spawn_early")(hold=True)
    except (ImportError, OSError):  # no Prefect layer here: the run starts its server later
        return
    if held is not None:
        _HELD.append(held)
        atexit.register(lambda: held.adopted or held.stop())


def take_held_server() -> Any | None:
    """The server ``spawn_held_server`` started (still held: call its ``go``), or None."""
    return _HELD.pop() if _HELD else None
