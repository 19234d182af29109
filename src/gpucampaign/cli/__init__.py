"""The ``campaign`` command."""

from __future__ import annotations

import sys
from typing import Any

from gpucampaign.cli.starting import say_starting, spawn_held_server

__all__ = ["app", "main"]


def main() -> None:
    """Entry point of the ``campaign`` script: a slow command says what starts, then runs."""
    say_starting(sys.argv[1:])
    spawn_held_server(sys.argv[1:])
    # typer, rich and what the commands import (torch) load after that first line
    from gpucampaign.cli.commands import main as run_command

    run_command()


def __getattr__(name: str) -> Any:
    if name == "app":  # the typer app, loaded when asked for (not by ``main``'s first line)
        from gpucampaign.cli.commands import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
