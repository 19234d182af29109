"""The library's import graph, read from the source: every ``import`` and ``from ... import``
wherever it stands (inside functions and under ``TYPE_CHECKING`` included).

The packages have ranks; an import points down the ranks or stays inside its package, and the
graph has no cycle. The few modules at the top of ``gpucampaign`` are faces: they may import
any package, and no package imports them.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "gpucampaign"

#: Lowest first: a package imports only packages before it in this list.
RANKS = (
    "core",
    "config",
    "plan",
    "folder",
    "storage",
    "data",
    "checkpoint",
    "recipe",
    "builtin",
    "modelfolder",
    "preflight",
    "tracking",
    "engine",
    "restartcheck",
    "close",
    "verify",
    "cli",
)
#: The modules allowed at the top of the package, besides ``__init__.py``.
FACES = {"predictions"}


def library_modules() -> dict[str, Path]:
    """``{'gpucampaign.pkg.mod': path}`` for every module of the library."""
    out = {}
    for p in SRC.rglob("*.py"):
        name = p.relative_to(SRC.parent).with_suffix("").as_posix().replace("/", ".")
        out[name.removesuffix(".__init__")] = p
    return out


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The library modules ``name`` imports, each import resolved to the module it loads."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            for a in node.names:  # `from pkg import module` loads that module
                sub = f"{module}.{a.name}"
                found.add(sub if sub in modules else module)
    return {m for m in found if m in modules and m != name}


def import_graph() -> dict[str, set[str]]:
    modules = library_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def package_of(module: str) -> str | None:
    """The subpackage of a module; None for the root package and its faces."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in RANKS else None


def against_the_ranks(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for a, targets in sorted(graph.items()):
        pa = package_of(a)
        if pa is None:
            continue  # a face imports what it shows
        for b in sorted(targets):
            pb = package_of(b)
            if pb is None:
                bad.append(f"{a} -> {b} (a face)")
            elif pb != pa and RANKS.index(pb) > RANKS.index(pa):
                bad.append(f"{a} -> {b} ({pa} is below {pb})")
    return bad


def test_every_module_lives_in_a_ranked_package() -> None:
    top = sorted(p.stem for p in SRC.glob("*.py") if p.name != "__init__.py")
    assert set(top) <= FACES, top
    packages = sorted(p.name for p in SRC.iterdir() if (p / "__init__.py").is_file())
    assert packages == sorted(RANKS)


def test_the_import_graph_has_no_cycle() -> None:
    graph = import_graph()
    assert len(graph) > 60  # the whole library was read
    assert find_cycles(graph) == []


def test_imports_point_down_the_ranks() -> None:
    assert against_the_ranks(import_graph()) == []


def test_the_checks_see_hidden_imports(tmp_path) -> None:
    """An import inside a function or under TYPE_CHECKING counts: the checks would see it."""
    modules = {"gpucampaign.core.files": tmp_path / "a.py", "gpucampaign.cli.commands": tmp_path}
    code = "def f():\n    from gpucampaign.cli import commands\nif TYPE_CHECKING:\n    import x\n"
    (tmp_path / "a.py").write_text(code)
    found = imports_of("gpucampaign.core.files", tmp_path / "a.py", modules)
    assert found == {"gpucampaign.cli.commands"}
    graph = {
        "gpucampaign.core.files": found,
        "gpucampaign.cli.commands": {"gpucampaign.core.files"},
    }
    assert find_cycles(graph) == [["gpucampaign.cli.commands", "gpucampaign.core.files"]]
    assert against_the_ranks(graph) == [
        "gpucampaign.core.files -> gpucampaign.cli.commands (core is below cli)"
    ]


def test_no_module_re_exports_names_it_does_not_use() -> None:
    """A name is imported from its owner: an unused import kept for callers (``noqa: F401``)
    lives only in a package's ``__init__.py``."""
    root = SRC.parents[1]
    shims = [
        f"{path.relative_to(root)}:{n}"
        for top in (SRC, SRC.parent / "gpucampaign_prefect")
        for path in sorted(top.rglob("*.py"))
        if path.name != "__init__.py"
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if line.lstrip().startswith(("from ", "import ")) and "noqa: F401" in line
    ]
    assert shims == []
