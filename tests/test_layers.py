"""The layering holds: the library never imports Prefect (nor the Prefect layer, which its CLI
loads by name), the layer's own packages import only down their ranks, and the CLI says what is
missing when the flows cannot be found."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "gpucampaign"
LAYER = SRC.parent / "gpucampaign_prefect"
#: The Prefect layer's packages, lowest first: a module imports its own package's modules and
#: those of the packages before it (the embedded server and the locks below the tasks, the tasks
#: below the flows that order them).
LAYER_RANKS = ("orchestration", "tasks", "flows")


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
    above = ("prefect", "gpucampaign_prefect")
    offenders = {
        str(p.relative_to(SRC)): sorted(m for m in _imported_modules(p) if m.split(".")[0] in above)
        for p in modules
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def layer_imports(path: Path, *, name: str, modules: set[str]) -> set[str]:
    """The layer's modules that module ``name`` (``'tasks.train'``, read from ``path``)
    imports, wherever the import stands (inside a function too); ``from pkg import module``
    counts as that module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [(a.name, "") for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package up
                parts = ["gpucampaign_prefect", *package.split(".")]
                base = ".".join([*parts[: len(parts) - node.level + 1], *filter(None, [base])])
            targets = [(base, a.name) for a in node.names]
        else:
            continue
        for module, attr in targets:
            short = module.removeprefix("gpucampaign_prefect").lstrip(".")
            sub = f"{short}.{attr}" if short and attr else attr or short
            found.add(sub if sub in modules else short)
    return {m for m in found if m in modules and m != name}


def layer_graph() -> dict[str, set[str]]:
    """``{'tasks.train': {'orchestration.gpu_lock', ...}}`` for every module of the layer."""
    paths = {
        p.relative_to(LAYER)
        .with_suffix("")
        .as_posix()
        .replace("/", ".")
        .removesuffix(".__init__"): p
        for p in LAYER.rglob("*.py")
        if p.parent != LAYER
    }
    return {n: layer_imports(p, name=n, modules=set(paths)) for n, p in paths.items()}


def against_the_layer_ranks(graph: dict[str, set[str]]) -> list[str]:
    """Each import of ``graph`` that points up the layer's ranks."""
    rank = {package: i for i, package in enumerate(LAYER_RANKS)}
    return [
        f"{a} -> {b}"
        for a, targets in sorted(graph.items())
        for b in sorted(targets)
        if rank[b.split(".")[0]] > rank[a.split(".")[0]]
    ]


def test_the_prefect_layer_imports_only_down_its_ranks() -> None:
    from tests.test_architecture import find_cycles

    packages = sorted(p.name for p in LAYER.iterdir() if (p / "__init__.py").is_file())
    assert packages == sorted(LAYER_RANKS)
    assert sorted(p.name for p in LAYER.glob("*.py")) == ["__init__.py"]
    graph = layer_graph()
    assert len(graph) > 20 and graph["tasks.train"] >= {"orchestration.gpu_lock"}
    assert against_the_layer_ranks(graph) == []
    assert find_cycles(graph) == []


def test_the_layer_check_sees_an_upward_import(tmp_path: Path) -> None:
    """An import of a flow's module from below, inside a function, is an upward import."""
    code = "def f():\n    from gpucampaign_prefect.flows import _lots\n"
    (tmp_path / "gpu_lock.py").write_text(code)
    modules = {"orchestration.gpu_lock", "flows._lots"}
    found = layer_imports(tmp_path / "gpu_lock.py", name="orchestration.gpu_lock", modules=modules)
    assert found == {"flows._lots"}
    graph = {"orchestration.gpu_lock": found, "flows._lots": set()}
    assert against_the_layer_ranks(graph) == ["orchestration.gpu_lock -> flows._lots"]


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


def test_the_cli_takes_the_layer_through_one_seam() -> None:
    """The library names the layer's objects only through ``gpucampaign_prefect.entry``: each
    name it asks for (``load_flow``, ``load_embedded``, ``entry``) is in the layer's
    ``ENTRIES``, each entry's module defines it, and no module path of the layer is written in
    the library (read from the source: nothing here imports Prefect)."""
    import gpucampaign_prefect

    entries = gpucampaign_prefect.ENTRIES
    asked: set[str] = set()
    paths = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and node.args:
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                first = node.args[0]
                if called in ("load_flow", "load_embedded", "entry"):
                    if isinstance(first, ast.Name) and first.id == "name":
                        continue  # the seam passing its argument on (runner.load_flow)
                    assert isinstance(first, ast.Constant), f"{path}: {ast.unparse(node)}"
                    asked.add(first.value)
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if node.value.startswith("gpucampaign_prefect."):
                    paths.append(f"{path.relative_to(SRC)}: {node.value}")
    assert paths == []
    assert asked and asked <= set(entries), asked - set(entries)
    for name, module in entries.items():
        source = LAYER.joinpath(*module.split(".")).with_suffix(".py")
        defined = {
            n.name
            for n in ast.parse(source.read_text(encoding="utf-8")).body
            if isinstance(n, ast.FunctionDef | ast.ClassDef)
        }
        defined |= {
            t.id
            for n in ast.parse(source.read_text(encoding="utf-8")).body
            if isinstance(n, ast.Assign)
            for t in n.targets
            if isinstance(t, ast.Name)
        }
        assert name in defined, f"{module} defines no {name}"
