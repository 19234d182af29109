"""``campaign predict OUT RUN --input PATH --to CSV``: a run's model, reloaded with its recipe,
predicts new input (registered on the one ``app`` of ``cli/common.py`` when ``cli`` imports
this module)."""

from __future__ import annotations

from pathlib import Path

import typer

from gpucampaign.cli.common import OutFolder, app, esc, handle_errors, say
from gpucampaign.core.errors import FolderError


@app.command("predict")
@handle_errors
def predict_cmd(
    out: OutFolder,
    run: str = typer.Argument(..., help="The run's name in the spec (control, a variant) or ID."),
    input_path: Path | None = typer.Option(  # noqa: B008
        None,
        "--input",
        metavar="PATH",
        help="New input of the corpus's kind (a file, or a folder the recipe reads); without "
        "it, the campaign's own decision split.",
    ),
    to: str = typer.Option("-", "--to", metavar="CSV", help="The CSV to write ('-': stdout)."),
    split: list[str] = typer.Option(  # noqa: B008
        [], "--split", help="Only these splits the recipe makes of --input."
    ),
    trust_folder_code: bool = typer.Option(
        False,
        "--trust-folder-code",
        help="Import the recipe copy kept in the folder (a folder you made, or whose manifest "
        "`campaign verify OUT --expect SHA256` checked).",
    ),
    recipes: list[Path] = typer.Option(  # noqa: B008
        [],
        "--recipes",
        metavar="DIR",
        help="A folder of your recipe files (the spec's folder): imported when the recipe's "
        "file has the sha256 recorded with the model.",
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing --to file."),
) -> None:
    """Reload a run's model with its recipe and write its predictions, one row per example
    keyed by ID (the recipe's own predict; class and confidence for the built-in recipes)."""
    from gpucampaign.close.predictions import predict_command

    if not out.is_dir():
        raise FolderError(f"'{out}' is not a folder: give a campaign's output folder.", field="OUT")
    rows = predict_command(
        out,
        run,
        to=to,
        input_path=input_path,
        splits=split or None,
        trust_folder_code=trust_folder_code,
        recipes=recipes,
        force=force,
    )
    if to != "-":
        say(f"{rows} prediction(s) of run {esc(run)} written to {esc(to)}")
