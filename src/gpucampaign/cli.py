"""The ``campaign`` command (typer + rich).

Exit codes: 0 success; 2 invalid input; 3 stopped by a stop rule; 4 plan does not fit its
window (plan) or output not verified (verify); 1 unexpected.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
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


# --- run: the whole campaign --------------------------------------------------------------


@app.command("run")
@handle_errors
def run_cmd(
    spec: Path = typer.Argument(..., help="Campaign YAML file."),
    out: Path | None = typer.Option(None, "--out", help="Output folder (default: out/<name>)."),
    decision: str | None = typer.Option(
        None, "--decision", help="Override decision_point.mode: 'auto' or 'ask' (Prefect UI)."
    ),
) -> None:
    """Run the whole campaign in this process (embedded Prefect, local storage); rerun to resume."""
    from gpucampaign._runner import load_flow
    from gpucampaign.spec import load_spec

    cs = load_spec(spec)
    if decision not in (None, "auto", "ask"):
        raise SpecError(f"option '--decision': '{decision}' is not a mode; use 'auto' or 'ask'.")
    target = out or Path("out") / cs.name
    flow = load_flow("campaign", "campaign")
    state = flow(spec=str(spec), out=str(target), decision_mode=decision, return_state=True)
    summary = state.result(raise_on_failure=False)
    if isinstance(summary, BaseException):
        raise summary
    verdict = (summary or {}).get("verdict") or {}
    console.print(f"[bold]verdict:[/] {verdict.get('text', 'none')}", soft_wrap=True)
    console.print(f"output folder: {target}  (report: {target / 'report.md'})")
    if state.is_failed():
        err_console.print(f"[bold red]stopped:[/] {state.message}", soft_wrap=True)
        raise typer.Exit(EXIT_STOPPED)
    if verdict.get("kind") == "re-pose":
        raise typer.Exit(EXIT_STOPPED)


def main() -> None:
    """Entry point of the ``campaign`` script."""
    app()


if __name__ == "__main__":
    main()
