"""The ``campaign`` command."""

from gpucampaign.cli.commands import app, main

__all__ = ["app", "main"]
