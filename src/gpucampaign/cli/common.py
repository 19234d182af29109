"""What the ``campaign`` commands share: the typer app, the consoles, the exit codes, the
arguments several commands take, and the mapping of typed errors to exit codes.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from gpucampaign.core.errors import InputError
from gpucampaign.core.stoprules import StopRule
from gpucampaign.core.text import redact_logging, redact_secrets, strip_ansi

EXIT_OK, EXIT_UNEXPECTED, EXIT_INVALID, EXIT_STOPPED, EXIT_NOT_FIT = 0, 1, 2, 3, 4

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Training campaigns on a rented GPU lot that end in a decision.",
)


class _Redacted:
    """The process's stdout or stderr (whichever is current: a test swaps them) with every
    credential redacted from what is written (``redact_secrets``): every line a command prints
    goes through it, whatever printed it."""

    def __init__(self, name: str) -> None:
        self._name = name

    def write(self, text: str) -> int:
        """Write ``text`` redacted; the length given (what a caller counts)."""
        getattr(sys, self._name).write(redact_secrets(text))
        return len(text)

    def __getattr__(self, attr: str) -> Any:  # flush, isatty, fileno, encoding: the stream's
        return getattr(getattr(sys, self._name), attr)


console = Console(file=_Redacted("stdout"))  # type: ignore[arg-type]
err_console = Console(file=_Redacted("stderr"))  # type: ignore[arg-type]

F = TypeVar("F", bound=Callable[..., Any])

# Arguments and options several commands share.
SpecFile = Annotated[Path, typer.Argument(help="Campaign YAML file.")]
OutFolder = Annotated[Path, typer.Argument(help="Output folder of a campaign.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of text.")]


def handle_errors(fn: F) -> F:
    """Map our typed errors to the documented exit codes, without a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        redact_logging()  # no credential in what any library logs while the command runs
        try:
            return fn(*args, **kwargs)
        except InputError as exc:
            err_console.print(f"[bold red]error:[/] {_said(exc)}", soft_wrap=True, highlight=False)
            raise typer.Exit(EXIT_INVALID) from None
        except StopRule as exc:
            err_console.print(
                f"[bold red]stopped:[/] {_said(exc)}", soft_wrap=True, highlight=False
            )
            raise typer.Exit(EXIT_STOPPED) from None

    return wrapper  # type: ignore[return-value]


def _said(exc: Exception) -> str:
    """An error's message as printed: no URL password, no terminal escape, no markup."""
    return esc(redact_secrets(strip_ansi(str(exc))))


def esc(value: object) -> str:
    """User or folder text as it may go inside rich markup: a ``[/]`` in it is text, not a tag."""
    return escape(str(value))


def print_json(obj: Any) -> None:
    """One JSON object on stdout, nothing else."""
    sys.stdout.write(json.dumps(_redacted(obj), indent=2, sort_keys=False, default=str) + "\n")


def _redacted(obj: Any) -> Any:
    """``obj`` with every string in it redacted (the JSON stays JSON)."""
    if isinstance(obj, str):
        return redact_secrets(obj)
    if isinstance(obj, dict):
        return {k: _redacted(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_redacted(v) for v in obj]
    return obj


def say(text: str) -> None:
    """One message on stdout, wrapped by the terminal rather than by rich."""
    console.print(text, soft_wrap=True, highlight=False)
