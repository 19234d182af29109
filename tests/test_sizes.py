"""Size limits of the project's code: no function over 90 lines, no module over 650 lines.

Checked in ``src/`` (the library and the Prefect layer). A
function's length runs from its ``def`` line to its last line (decorators excluded); a nested
function or a method counts on its own (and inside the function that holds it).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("src",)
MAX_FUNCTION_LINES = 90
MAX_MODULE_LINES = 650


def _modules() -> list[Path]:
    return sorted(
        path
        for folder in FOLDERS
        if (ROOT / folder).is_dir()
        for path in (ROOT / folder).rglob("*.py")
    )


def _too_long(path: Path, *, root: Path = ROOT) -> list[str]:
    """Each function over the limit, and the module itself when it is over its limit."""
    text = path.read_text(encoding="utf-8")
    rel = path.relative_to(root).as_posix()
    found = []
    lines = len(text.splitlines())
    if lines > MAX_MODULE_LINES:
        found.append(f"{rel}: {lines} lines (limit {MAX_MODULE_LINES})")
    for node in ast.walk(ast.parse(text, filename=rel)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        assert node.end_lineno is not None
        length = node.end_lineno - node.lineno + 1
        if length > MAX_FUNCTION_LINES:
            found.append(
                f"{rel}:{node.lineno} {node.name}: {length} lines (limit {MAX_FUNCTION_LINES})"
            )
    return found


def test_the_checked_folders_hold_code():
    paths = {p.relative_to(ROOT / "src").parts[:2] for p in _modules()}
    assert {("gpucampaign_prefect", "tasks"), ("gpucampaign_prefect", "flows")} <= paths
    assert any(p[0] == "gpucampaign" for p in paths)


def test_no_function_or_module_is_over_its_size_limit():
    found = [line for path in _modules() for line in _too_long(path)]
    assert not found, "over the size limits:\n" + "\n".join(found)


def test_the_limits_are_measured_as_stated(tmp_path: Path):
    def body(indent: int, n: int) -> str:
        return "\n".join(f"{' ' * indent}x{i} = {i}" for i in range(n))

    # Decorators excluded: f is exactly at the limit.
    (tmp_path / "fits.py").write_text(
        f"@decorated\ndef f():\n{body(4, MAX_FUNCTION_LINES - 1)}\n", encoding="utf-8"
    )
    # A nested function counts on its own, and inside the one that holds it.
    (tmp_path / "over.py").write_text(
        f"def g():\n    def h():\n{body(8, MAX_FUNCTION_LINES)}\n", encoding="utf-8"
    )
    (tmp_path / "big.py").write_text(body(0, MAX_MODULE_LINES + 1) + "\n", encoding="utf-8")
    assert _too_long(tmp_path / "fits.py", root=tmp_path) == []
    assert _too_long(tmp_path / "over.py", root=tmp_path) == [
        f"over.py:1 g: {MAX_FUNCTION_LINES + 2} lines (limit {MAX_FUNCTION_LINES})",
        f"over.py:2 h: {MAX_FUNCTION_LINES + 1} lines (limit {MAX_FUNCTION_LINES})",
    ]
    assert _too_long(tmp_path / "big.py", root=tmp_path) == [
        f"big.py: {MAX_MODULE_LINES + 1} lines (limit {MAX_MODULE_LINES})"
    ]
