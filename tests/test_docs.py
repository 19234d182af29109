"""The README and docs/ stay short, linked and true: the README at most 250 lines, one docs/
page per topic, every relative link (and its #anchor) resolving, and every command block
marked as runnable running as written.

The README's quickstart is the block after ``<!-- quickstart -->``; the docs' blocks that need
no stack are marked ``<!-- runs -->``. The slow test runs them from this very text, in a
temporary folder, with the installed ``campaign`` command: the quickstart first (one demo
campaign), then each marked block in the same folder (they read the quickstart's ``digits/``
and ``demo/``, and the checkout's ``examples/``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 250
#: The topics a newcomer looks for, each its own page, each linked from the README.
TOPICS = (
    "watching.md",
    "recipes.md",
    "stop-rules-and-evidence.md",
    "stack.md",
    "failures.md",
    "data-parallel.md",
    "tracking.md",
    "benchmarks.md",
)
QUICKSTART = "<!-- quickstart -->"
RUNS = "<!-- runs -->"
FENCE = re.compile(r"^```[^\n]*\n.*?^```[ \t]*$", re.M | re.S)
MARKED = re.compile(r"^(<!-- (?:quickstart|runs) -->)\n```bash\n(.*?)^```[ \t]*$", re.M | re.S)
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} +(.+?) *$", re.M)
TAG = re.compile(r"\bR\d{1,2}\b")
OUTSIDE = re.compile(r"\b(?:DESIGN|MISSION|FACTS)\.md\b|\bissue \d+|/issues/", re.I)


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def _prose(text: str) -> str:
    """The text without its fenced blocks and inline code (links and headings live outside)."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_slug(h) for h in HEADING.findall(FENCE.sub("", page.read_text(encoding="utf-8")))}


def _blocks(page: Path, marker: str) -> list[str]:
    text = page.read_text(encoding="utf-8")
    return [body for mark, body in MARKED.findall(text) if mark == marker]


def test_the_readme_is_short_and_links_every_topic() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines"
    linked = set(LINK.findall(README.read_text(encoding="utf-8")))
    for topic in TOPICS:
        assert (DOCS / topic).is_file(), f"docs/{topic} is missing"
        assert f"docs/{topic}" in linked, f"README.md does not link docs/{topic}"


def test_the_docs_index_links_every_page() -> None:
    index = DOCS / "README.md"
    linked = set(LINK.findall(index.read_text(encoding="utf-8")))
    pages = {p.name for p in DOCS.glob("*.md")} - {"README.md"}
    assert pages >= set(TOPICS)
    assert sorted(pages - linked) == []


def test_every_relative_link_resolves() -> None:
    broken = []
    count = 0
    for page in _pages():
        for target in LINK.findall(_prose(page.read_text(encoding="utf-8"))):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http(s), mailto: not ours to check
                continue
            count += 1
            path, _, anchor = target.partition("#")
            found = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(ROOT)}: {target}"
            if not found.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and found.suffix == ".md" and anchor not in _anchors(found):
                broken.append(f"{where} (no heading #{anchor})")
    assert count > 30  # the check really read the links
    assert broken == []


def test_the_docs_speak_of_the_project_alone() -> None:
    found = [
        f"{page.relative_to(ROOT)}:{n}: {line.strip()}"
        for page in _pages()
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1)
        if TAG.search(line) or OUTSIDE.search(line)
    ]
    assert found == []


def test_the_quickstart_is_marked_once_and_uses_the_installed_command() -> None:
    text = README.read_text(encoding="utf-8")
    assert text.count(QUICKSTART) == 1
    (block,) = _blocks(README, QUICKSTART)
    commands = [line.split("#")[0].strip() for line in block.splitlines()]
    commands = [c for c in commands if c]
    assert commands[0].startswith("campaign init ") and len(commands) >= 3
    assert all(c.startswith("campaign ") for c in commands), commands
    assert any(c.startswith("campaign run ") for c in commands)
    # a marker not followed by a bash block is a block that silently never runs
    alone = re.compile(rf"^{re.escape(RUNS)}$", re.M)
    marks = sum(len(alone.findall(p.read_text(encoding="utf-8"))) for p in _pages())
    assert marks == sum(len(_blocks(p, RUNS)) for p in _pages()) and marks >= 4


def test_make_demo_runs_the_quickstart_campaign(tmp_path: Path) -> None:
    """``make demo`` (the checkout's first command) plans and runs the spec the quickstart's
    ``campaign init`` writes, into ``demo``: the test of the quickstart covers it too."""
    if shutil.which("make") is None:
        pytest.skip("no make here")
    dry = subprocess.run(  # -n: prints the recipe, runs nothing (no install, no campaign)
        ["make", "-n", "demo"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert dry.returncode == 0, dry.stderr
    said = [line.strip() for line in dry.stdout.splitlines()]
    spec = "examples/digits/campaign.yaml"
    assert any(line.endswith(f"/campaign plan {spec}") for line in said), said
    assert any(line.endswith(f"/campaign run {spec} --out demo") for line in said), said

    from typer.testing import CliRunner

    from gpucampaign.cli import app

    made = CliRunner().invoke(app, ["init", str(tmp_path / "digits")])
    assert made.exit_code == 0, made.output
    written = (tmp_path / "digits" / "campaign.yaml").read_bytes()
    assert written == (ROOT / spec).read_bytes()


def _bin_with_campaign(tmp: Path) -> Path:
    """A folder with ``campaign`` and ``python`` of this interpreter, first on PATH."""
    here = tmp / "bin"
    here.mkdir()
    installed = Path(sys.executable).parent / "campaign"
    campaign = (
        f'exec "{installed}" "$@"'
        if installed.is_file()
        else (f'exec "{sys.executable}" -m gpucampaign.cli "$@"')
    )
    for name, line in (("campaign", campaign), ("python", f'exec "{sys.executable}" "$@"')):
        (here / name).write_text(f"#!/bin/sh\n{line}\n")
        (here / name).chmod(0o755)
    return here


def _run_block(body: str, *, cwd: Path, env: dict[str, str], timeout: int) -> None:
    script = "set -euo pipefail\n" + body
    done = subprocess.run(
        ["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, (
        f"exit {done.returncode} of\n{body}\n--- stdout\n{done.stdout[-4000:]}\n"
        f"--- stderr\n{done.stderr[-4000:]}"
    )


@pytest.mark.slow
@pytest.mark.process
@pytest.mark.timeout(900)
def test_the_quickstart_and_the_docs_commands_run_as_written(tmp_path: Path) -> None:
    """The README's quickstart (one demo campaign), then every ``<!-- runs -->`` block."""
    work = tmp_path / "work"
    work.mkdir()
    shutil.copytree(ROOT / "examples", work / "examples")  # as in a checkout
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(_bin_with_campaign(tmp_path)), os.environ.get("PATH", "")]),
        "PYTHONPATH": os.pathsep.join(
            [str(ROOT / "src"), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
        ),
        "PREFECT_HOME": str(tmp_path / "prefect-home"),  # its own, and no server named
    }
    env.pop("PREFECT_API_URL", None)
    (quickstart,) = _blocks(README, QUICKSTART)
    _run_block(quickstart, cwd=work, env=env, timeout=600)
    assert (work / "demo" / "manifest.json").is_file()
    # The demo ends in a decision, with the round of seeds it bought in the lot on the
    # timeline and in the budget (issue 43).
    report = json.loads((work / "demo" / "report.json").read_text())
    assert report["verdict"]["kind"] in {"adopt", "negative"}, report["verdict"]
    bought = [r for r in report["rounds"] if r["bought"]]
    assert bought and all(r["runs"] and r["gpu_hours"] > 0 for r in bought), report["rounds"]
    timeline = (work / "demo" / "timeline.jsonl").read_text()
    assert "buy round 1 of" in timeline
    trained = {json.loads(line).get("run") for line in timeline.splitlines()}
    assert any(str(run).startswith(tuple(bought[0]["runs"])) for run in trained), trained
    assert "### Rounds of seeds beyond the plan" in (work / "demo" / "report.md").read_text()
    ran = 0
    for page in _pages():
        for body in _blocks(page, RUNS):
            _run_block(body, cwd=work, env=env, timeout=300)
            ran += 1
    assert ran >= 4
