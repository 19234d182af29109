"""The layering holds: the library never imports Prefect, and the CLI says what is missing when
the flows cannot be found."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "gpucampaign"
LAYER = SRC.parent / "gpucampaign_prefect"


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_no_library_module_imports_prefect() -> None:
    modules = sorted(SRC.rglob("*.py"))
    assert len(modules) > 10
    offenders = {
        str(p.relative_to(SRC)): sorted(
            m for m in _imported_modules(p) if m.split(".")[0] == "prefect"
        )
        for p in modules
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_tasks_holds_only_task_modules() -> None:
    """Every module of tasks/ defines a Prefect task; what tasks and flows share and is no
    task (the GPU lock, the notifications, the UI's views) lives in orchestration/."""
    tasks = LAYER / "tasks"
    modules = sorted(p for p in tasks.glob("*.py") if p.name != "__init__.py")
    assert len(modules) >= 5
    without = [
        p.name
        for p in modules
        if not any(
            isinstance(d, ast.Call) and getattr(d.func, "id", "") == "task"
            for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
            if isinstance(node, ast.FunctionDef)
            for d in node.decorator_list
        )
    ]
    assert without == []


@pytest.mark.process
def test_importing_the_whole_library_loads_no_prefect() -> None:
    names = [
        p.relative_to(SRC.parent).with_suffix("").as_posix().replace("/", ".")
        for p in SRC.rglob("*.py")
        if p.name != "__main__.py"
    ]
    code = (
        "import importlib, sys\n"
        f"for n in {names!r}:\n"
        "    importlib.import_module(n.removesuffix('.__init__'))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'prefect'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_prefect_layer_has_one_path() -> None:
    """The layer's files live in ``src/gpucampaign_prefect`` and nowhere else: no link in it, no
    top-level ``flows``/``tasks``/``orchestration``/``deployments`` beside it, and no bare
    ``tasks`` or ``flows`` module to import, even with the checkout's root on ``sys.path`` (as
    pytest puts it): each module, each task object and the GPU lock exist once."""
    root = SRC.parents[1]
    assert [p.relative_to(root) for p in LAYER.rglob("*") if p.is_symlink()] == []
    folders = ("flows", "tasks", "orchestration", "deployments")
    assert [name for name in folders if (root / name).exists()] == []
    assert all((LAYER / name).is_dir() and not (LAYER / name).is_symlink() for name in folders)
    assert str(root) in sys.path  # the root is there, and still names none of them
    assert [n for n in ("tasks", "flows", "orchestration") if importlib.util.find_spec(n)] == []


def test_ruff_passes_with_its_line_length() -> None:
    ruff = Path(sys.executable).parent / "ruff"
    if not ruff.is_file():
        pytest.skip("ruff is not installed beside this Python (pip install -e '.[dev]')")
    root = SRC.parents[1]
    folders = ["src", "tests", "bench", "infra"]
    out = subprocess.run(
        [str(ruff), "check", *folders], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout[-3000:]


@pytest.mark.slow
def test_mypy_passes_on_the_library_and_the_prefect_layer() -> None:
    """``mypy`` with no arguments: its one path set, ``src/`` (pyproject.toml)."""
    mypy = Path(sys.executable).parent / "mypy"
    if not mypy.is_file():
        pytest.skip("mypy is not installed beside this Python (pip install -e '.[dev]')")
    root = SRC.parents[1]
    out = subprocess.run([str(mypy)], cwd=root, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-1000:]
