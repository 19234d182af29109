"""User-facing text speaks of the project alone: no requirement tags, no outside documents."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpucampaign.cli import app
from gpucampaign.config import parse_spec
from gpucampaign.plan import calendar

SRC = Path(__file__).resolve().parents[1] / "src"
TAG = re.compile(r"\bR\d{1,2}\b")
OUTSIDE_DOCS = re.compile(r"\b(?:DESIGN|MISSION|FACTS)\.md\b")
runner = CliRunner()


def test_the_schema_has_no_requirement_tag() -> None:
    result = runner.invoke(app, ["schema"])
    assert result.exit_code == 0
    assert '"description"' in result.stdout
    assert TAG.findall(result.stdout) == []


@pytest.mark.parametrize(
    "command",
    [
        [],
        ["schema"],
        ["plan"],
        ["packages"],
        ["init"],
        ["restart-check"],
        ["run"],
        ["verify"],
        ["report"],
    ],
)
def test_the_cli_help_has_no_requirement_tag(command: list[str]) -> None:
    result = runner.invoke(app, [*command, "--help"], terminal_width=200)
    assert result.exit_code == 0 and "Usage" in result.stdout
    assert TAG.findall(result.stdout) == []


def test_plan_warnings_have_no_requirement_tag() -> None:
    spec = parse_spec(
        {
            "name": "t",
            "packages": [{"gpu": "rtx4090", "days": 3}],
            "control": {"lr": 0.001},
            "variants": [
                {"name": "same", "changes": {}},
                {"name": "two", "changes": {"lr": 0.01, "epochs": 3}},
            ],
            "calendar": [{"name": "train", "kind": "machine", "resource": "gpu", "hours": 2}],
        }
    )
    warnings = calendar.plan(spec).warnings
    assert any("no loading step" in w for w in warnings)  # the case is really warned about
    assert any("'two' changes 2 factors" in w for w in warnings)
    assert [w for w in warnings if TAG.search(w)] == []


def test_no_source_file_refers_to_documents_outside_the_repository() -> None:
    files = sorted(SRC.rglob("*.py"))
    assert len(files) > 10
    found = [
        f"{path.relative_to(SRC)}:{n}: {line.strip()}"
        for path in files
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if OUTSIDE_DOCS.search(line)
    ]
    assert found == []
