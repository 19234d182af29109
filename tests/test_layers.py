"""The layering holds: the library never imports Prefect, and the CLI says what is missing when
the flows cannot be found."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "gpucampaign"


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
    tasks = SRC.parents[1] / "tasks"
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


def test_the_prefect_layer_is_imported_only_by_its_installed_name() -> None:
    """A bare ``tasks``/``flows``/``orchestration`` import would load a second copy of a module
    (two GPU-lock modules, two task objects) and fails where the package is installed."""
    root = SRC.parents[1]
    bare = {"tasks", "flows", "orchestration"}
    offenders = [
        f"{p.relative_to(root)}: {m}"
        for folder in ("src", "tasks", "flows", "orchestration", "tests", "bench", "infra")
        for p in sorted((root / folder).rglob("*.py"))
        if "gpucampaign_prefect" not in p.parts
        for m in _imported_modules(p)
        if m.split(".")[0] in bare
    ]
    assert offenders == []


def test_ruff_passes_with_its_line_length() -> None:
    ruff = Path(sys.executable).parent / "ruff"
    if not ruff.is_file():
        pytest.skip("ruff is not installed beside this Python (pip install -e '.[dev]')")
    root = SRC.parents[1]
    folders = ["src", "orchestration", "tasks", "flows", "tests", "bench", "infra"]
    out = subprocess.run(
        [str(ruff), "check", *folders], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout[-3000:]


@pytest.mark.slow
def test_mypy_passes_on_the_library_tasks_and_flows() -> None:
    mypy = Path(sys.executable).parent / "mypy"
    if not mypy.is_file():
        pytest.skip("mypy is not installed beside this Python (pip install -e '.[dev]')")
    root = SRC.parents[1]
    out = subprocess.run(
        [str(mypy), "src/gpucampaign", "orchestration", "tasks", "flows"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-1000:]
