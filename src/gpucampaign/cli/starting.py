"""The first line of the commands that take seconds before their first output (``campaign
run``, ``campaign restart-check``): what is starting, printed before torch, Prefect or the CLI's
own modules load; then ``campaign run``'s embedded Prefect server's process, started at once so
that it boots while the rest loads. Standard library only: this module runs before everything
else."""

from __future__ import annotations

import atexit
import importlib
import os
import re
import sys
from pathlib import Path
from typing import Any, TextIO

# Measured: a fresh PREFECT_HOME needs ~21 s to start the embedded server (default limit 20 s),
# and the telemetry heartbeat floods stderr with SQLite lock errors. The one home of these
# settings: the CLI, the tests and the benches all take them from here (``cli.runner``).
EMBEDDED_DEFAULTS = {
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
    "PREFECT_LOGGING_LEVEL": "INFO",  # one line per finished phase: what a long run shows
}

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


_FIRST: list[Any] = []  # the server ``start_server_first`` started, until ``run`` takes it


def start_server_first(argv: list[str]) -> None:
    """For ``campaign run`` (``argv`` its arguments; not ``--help``): start the embedded
    server's process right after the first line, before the library, torch and Prefect load
    here and before the spec is checked, so that it boots meanwhile; ``run`` takes it
    (``take_first_server``). A run refused by its checks stops it, as does this process's exit
    before it was adopted."""
    if not argv or argv[0] != "run" or starting_line(argv) is None:
        return
    # `run`'s own default, set before the server's environment is copied from this one.
    os.environ.setdefault(
        "PREFECT_LOGGING_LEVEL", "INFO" if {"-v", "--verbose"} & set(argv) else "WARNING"
    )
    for key, value in EMBEDDED_DEFAULTS.items():
        os.environ.setdefault(key, value)
    # By its installed name (the library never imports the Prefect layer): standard library only.
    early = importlib.import_module("gpucampaign_prefect.flows._embedded").spawn_early()
    if early is not None:
        _FIRST.append(early)
        atexit.register(lambda: None if early.adopted else early.stop())


def take_first_server() -> Any | None:
    """The server ``start_server_first`` started in this process, once; else None."""
    return _FIRST.pop() if _FIRST else None
