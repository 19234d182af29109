"""A command's checks without its campaign: ``load_flow`` raises instead of starting Prefect."""

from __future__ import annotations

from typing import Any

import pytest

import gpucampaign.cli.runner


class PrefectWouldStart(Exception):
    """Raised instead of starting Prefect: the command got past every check of its input."""


def refuse_prefect(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``campaign run`` (and any command that loads a flow) raise ``PrefectWouldStart``."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise PrefectWouldStart()

    monkeypatch.setattr(gpucampaign.cli.runner, "load_flow", refuse)
