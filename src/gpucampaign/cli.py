"""The ``campaign`` command (typer + rich).

Exit codes: 0 success; 2 invalid input; 3 stopped by a stop rule; 4 plan does not fit its
window (plan) or output not verified (verify); 1 unexpected.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import typer
from rich.console import Console

from gpucampaign.spec import SpecError
from gpucampaign.stoprules import StopRule

EXIT_OK, EXIT_UNEXPECTED, EXIT_INVALID, EXIT_STOPPED, EXIT_NOT_FIT = 0, 1, 2, 3, 4

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Training campaigns on a rented GPU lot that end in a decision.",
)
console = Console()
err_console = Console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])


def handle_errors(fn: F) -> F:
    """Map our typed errors to the documented exit codes, without a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SpecError as exc:
            err_console.print(f"[bold red]error:[/] {exc}", soft_wrap=True, highlight=False)
            raise typer.Exit(EXIT_INVALID) from None
        except StopRule as exc:
            err_console.print(f"[bold red]stopped:[/] {exc}", soft_wrap=True, highlight=False)
            raise typer.Exit(EXIT_STOPPED) from None

    return wrapper  # type: ignore[return-value]


def print_json(obj: Any) -> None:
    """One JSON object on stdout, nothing else."""
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


# Commands are defined below, one section per phase of the campaign.


def main() -> None:
    """Entry point of the ``campaign`` script."""
    app()


if __name__ == "__main__":
    main()
