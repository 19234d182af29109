"""Every file and folder name of the output folder (and of a checkpoint in its store) is
spelled once, in ``folder/layout.py``; everywhere else imports it.

What counts as a name: each ``/``-separated part of every upper-case ``str`` (or tuple of
``str``) constant that ``layout`` defines (``runs``, ``result.json``, ``figures``,
``calendar.png``, ``LATEST``, ``step-``...). What counts as a literal copy, read from the
syntax tree of every module under ``src/`` (the library and the Prefect layer) (so
docstrings, comments and the text of messages without a path in them do not count):

- a name with a dot, a dash or a capital (``result.json``, ``LATEST``, ``.lock``): any string
  constant or f-string part with that name as one of its ``/``-separated parts; a name that
  ends with ``-`` (``scores-``, ``step-``) also matches a part that starts with it
  (``scores-*.npz``, ``f"step-{n:09d}"``);
- a plain lower-case word (``runs``, ``model``, ``data``, ``figures``...), which is also an
  ordinary dict key, field name and recipe method: only where it is used as a path, i.e. as
  one part of a string or f-string part that holds a ``/`` (``f"runs/{rid}"``,
  ``"model/x"``), as an operand of ``/`` (``root / "runs"``), or as an argument of
  ``Path``/``PurePosixPath``/``joinpath``.

Docstrings are skipped (the first statement of a module, class or function), and so is a
string with a line break in it (a text template, e.g. ``RELOAD.md``'s, is prose that names
files for a reader). ``NOT_THE_FOLDER`` lists the few same words that name another folder.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from gpucampaign.core import storageurl
from gpucampaign.folder import layout

ROOT = Path(__file__).resolve().parents[1]
OWNER = ROOT / "src" / "gpucampaign" / "folder" / "layout.py"
SCANNED = (ROOT / "src",)
_WORD = re.compile(r"^[a-z]+$")
_PATH_CALLS = {"Path", "PurePosixPath", "PurePath", "joinpath"}
#: ``(module, name)``: a name spelled for a folder that is not the output folder.
NOT_THE_FOLDER = {
    # `campaign init` writes a project folder: its corpus goes to the project's data/.
    ("src/gpucampaign/cli/scaffold.py", "data"),
    ("src/gpucampaign/cli/scaffold_textlm.py", "data"),
    ("src/gpucampaign/cli/commands.py", "data"),
}


def layout_names() -> set[str]:
    """The file and folder names ``folder/layout.py`` defines (each part of its paths)."""
    names: set[str] = set()
    for attr, value in vars(layout).items():
        if not attr.isupper():
            continue
        values = value if isinstance(value, tuple) else (value,)
        for v in values:
            if isinstance(v, str):
                names.update(p for p in v.split("/") if p)
    return names


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring nodes of a module, its classes and functions."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def _path_operands(tree: ast.AST) -> set[int]:
    """ids of string constants used as a path: an operand of ``/`` or an argument of a
    ``Path``-like call."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            out.update({id(node.left), id(node.right)})
        elif isinstance(node, ast.Call):
            f = node.func
            name = (
                f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            )
            if name in _PATH_CALLS:
                out.update(id(a) for a in node.args)
    return out


def _matches(text: str, names: set[str], *, as_path: bool) -> list[str]:
    """The layout names that ``text`` (a string constant or f-string part) spells."""
    parts = text.split("/")
    pathish = as_path or len(parts) > 1
    found = []
    for part in parts:
        for name in names:
            if _WORD.match(name):
                hit = pathish and part == name
            elif name.endswith("-"):
                hit = part.startswith(name)
            else:
                hit = part == name
            if hit:
                found.append(name)
    return found


def literal_copies(path: Path, names: set[str]) -> Iterator[tuple[int, str, str]]:
    """``(line, name, literal)`` for each layout name spelled in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    skip, as_path = _docstrings(tree), _path_operands(tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or not isinstance(node.value, str):
            continue
        if id(node) in skip or "\n" in node.value:
            continue
        found = _matches(node.value, names, as_path=id(node) in as_path)
        if found:
            yield node.lineno, ", ".join(sorted(set(found))), node.value


def test_layout_defines_the_names_this_test_looks_for() -> None:
    names = layout_names()
    for expected in (
        "campaign.json",
        "restart.json",
        "result.json",
        "ledger.jsonl",
        "in_progress.json",
        "calendar.png",
        "LATEST",
        "meta.json",
        "step-",
        "runs",
        "evals",
        "scores-",
    ):
        assert expected in names


def test_the_scan_finds_a_literal_and_ignores_words_and_docstrings(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        '"""Writes runs/<id>/result.json."""\n'
        "def f(root, rid, d):\n"
        '    """Reads LATEST."""\n'
        '    d["runs"] = call("model")  # result.json\n'
        '    a = root / "runs" / rid\n'
        '    b = f"runs/{rid}/metrics.jsonl"\n'
        '    c = f"step-{rid:09d}"\n'
        '    return "result.json", a, b, c\n',
        encoding="utf-8",
    )
    found = sorted((line, name) for line, name, _ in literal_copies(sample, layout_names()))
    assert found == [
        (5, "runs"),
        (6, "metrics.jsonl"),
        (6, "runs"),
        (7, "step-"),
        (8, "result.json"),
    ]


def _copies() -> list[str]:
    names = layout_names()
    out = []
    for base in SCANNED:
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if path == OWNER:
                continue
            for line, name, literal in literal_copies(path, names):
                if (rel, name) not in NOT_THE_FOLDER:
                    out.append(f"{rel}:{line}: {literal!r} spells {name!r}")
    return sorted(out)


def test_no_output_folder_name_is_spelled_outside_layout() -> None:
    copies = _copies()
    assert not copies, (
        "file and folder names of the output folder are defined once, in "
        "src/gpucampaign/folder/layout.py; import them instead:\n" + "\n".join(copies)
    )


def scheme_tests(path: Path) -> Iterator[int]:
    """Lines of ``path`` that test a storage URL by hand: a comparison with ``'local'`` or a
    ``startswith``/``removeprefix`` of ``'s3://'`` (``core.storageurl`` answers those)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(isinstance(o, ast.Constant) and o.value == storageurl.LOCAL for o in operands):
                yield node.lineno
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("startswith", "removeprefix") and any(
                isinstance(a, ast.Constant) and a.value == storageurl.S3_SCHEME for a in node.args
            ):
                yield node.lineno


def test_only_core_storageurl_knows_the_storage_url_schemes() -> None:
    owner = ROOT / "src" / "gpucampaign" / "core" / "storageurl.py"
    found = [
        f"{path.relative_to(ROOT).as_posix()}:{line}"
        for base in SCANNED
        for path in sorted(base.rglob("*.py"))
        if path != owner
        for line in scheme_tests(path)
    ]
    assert not found, "test a storage URL with gpucampaign.core.storageurl:\n" + "\n".join(found)


def _aliases(tree: ast.Module) -> list[tuple[str, str, int]]:
    """``(alias, name, line)``: a module-level ``ALIAS = NAME`` of a name this module imported
    (a second name for one thing)."""
    imported = {
        (a.asname or a.name).split(".")[0]
        for node in tree.body
        if isinstance(node, ast.ImportFrom | ast.Import)
        for a in node.names
    }
    return [
        (node.targets[0].id, node.value.id, node.lineno)
        for node in tree.body
        if isinstance(node, ast.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Name)
        and node.value.id in imported
    ]


def test_no_name_is_an_alias_of_another() -> None:
    """One name for one thing: no module gives an imported constant or function a second name
    (``checkpoint/layout.py`` once had five)."""
    found = [
        f"{path.relative_to(ROOT)}:{line} {alias} = {name}"
        for path in sorted(p for root in SCANNED for p in root.rglob("*.py"))
        for alias, name, line in _aliases(ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert found == []
    caught = _aliases(ast.parse("from x import A\nfrom y import f\nB = A\nC = 'A'\ng = f\n"))
    assert [(a, n) for a, n, _ in caught] == [("B", "A"), ("g", "f")]
