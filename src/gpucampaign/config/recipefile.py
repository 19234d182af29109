"""Where a recipe's source file is: found on ``sys.path`` without running it, and hashed.

The spec needs the recipe's hashes for a run ID before any recipe is imported; importing and
checking the recipe itself is ``recipe.contract.load_recipe``. Two hashes: the file's
(``recipe_file_sha256``: what a model folder keeps and a reload checks) and its training
source's (``recipe_hashes``: the file without the recipe class's ``predict`` and ``score``,
which run only after training), which enters the run ID.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.machinery
import importlib.util
import sys
import sysconfig
from pathlib import Path

from gpucampaign.config.parts import BUILTIN_RECIPES
from gpucampaign.core.errors import SpecError
from gpucampaign.core.files import sha256_file

# Folders put on sys.path for recipes; child processes get them through PYTHONPATH.
RECIPE_DIRS: list[str] = []


class RecipeError(SpecError):
    """A recipe that cannot be used: names the recipe and the method (CLI exit 2)."""

    def __init__(self, recipe: str, method: str, problem: str) -> None:
        super().__init__(f"recipe '{recipe}', {method}: {problem}", field="control.recipe")
        self.recipe = recipe
        self.method = method


def use_recipe_dir(folder: str | Path) -> None:
    """Put ``folder`` (a spec's folder) first on ``sys.path``, once."""
    path = str(Path(folder).resolve())
    # Latest first, as on sys.path: a child process finds the module this process would.
    if path in RECIPE_DIRS:
        RECIPE_DIRS.remove(path)
    RECIPE_DIRS.insert(0, path)
    if path in sys.path:
        sys.path.remove(path)
    sys.path.insert(0, path)


def import_path(recipe: str) -> str:
    """``module:ClassName`` of a recipe (the built-in names resolved)."""
    return BUILTIN_RECIPES.get(recipe, recipe)


def recipe_file(recipe: str) -> Path:
    """The source file of a recipe's module, found without running it.

    Raises:
        RecipeError: The module cannot be found.
    """
    module = import_path(recipe).partition(":")[0]
    try:
        found = _find_without_import(module)
    except (ImportError, ValueError) as exc:
        found, why = None, f"{type(exc).__name__}: {exc}"
    else:
        why = "no such module on sys.path"
    if found is None or not found.origin or not Path(found.origin).is_file():
        raise RecipeError(
            recipe,
            "import",
            f"module '{module}' does not import ({why}); put "
            f"{module.replace('.', '/')}.py next to the spec file or install it",
        )
    origin = Path(found.origin)
    _refuse_link_out(recipe, origin)
    return origin


def _find_without_import(module: str) -> importlib.machinery.ModuleSpec | None:
    """The spec of ``module`` found as an import would find it, with nothing imported: a
    dotted name's packages are looked up, never run (``importlib.util.find_spec`` imports
    them), so a recipe's file is found and hashed before any code of it or its package runs.

    A top-level module is looked up on ``sys.path`` first (``find_spec`` would answer with a
    module of that name imported earlier from another spec's folder), then by the other
    finders (an editable install); a package's submodule in its package's folders."""
    parts = module.split(".")
    found = importlib.machinery.PathFinder.find_spec(parts[0])
    if found is None:
        found = importlib.util.find_spec(parts[0])  # top-level: imports nothing
    for i in range(1, len(parts)):
        where = None if found is None else found.submodule_search_locations
        if not where:
            return None
        name = ".".join(parts[: i + 1])
        found = next(
            (
                spec
                for finder in sys.meta_path
                if hasattr(finder, "find_spec")
                and (spec := finder.find_spec(name, list(where))) is not None
            ),
            None,
        )
    return found


def _top_level_names(tree: ast.Module) -> set[str]:
    """The names a module binds at its top: classes, functions, imports and assignments."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).partition(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def check_recipe_source(recipe: str, origin: Path) -> None:
    """Refuse, before it is imported, a file that cannot be a recipe's module: a package's
    ``__main__``, a module of Python's own library, or a file that does not define the
    recipe's class at its top (read as text, never run: a class, an import or an assignment
    of that name). A model folder names its recipe; this
    keeps it from naming some installed module whose import does something else.

    Raises:
        RecipeError: The file is one of those.
    """
    module, _, cls = import_path(recipe).partition(":")
    stdlib = {Path(sysconfig.get_paths()[k]).resolve() for k in ("stdlib", "platstdlib")}
    where = origin.resolve()
    why = None
    if module.rpartition(".")[2] == "__main__" or where.name == "__main__.py":
        why = f"'{module}' is a package's __main__ (it runs when imported)"
    elif any(where.is_relative_to(d) and "site-packages" not in where.parts for d in stdlib):
        why = f"'{module}' is a module of Python's own library, not a recipe"
    else:
        try:
            tree = ast.parse(origin.read_bytes())
        except (SyntaxError, ValueError, OSError) as exc:
            tree, why = None, f"'{origin}' does not parse ({type(exc).__name__})"
        if tree is not None and cls not in _top_level_names(tree):
            why = f"'{origin}' defines no class '{cls}' at its top"
    if why:
        raise RecipeError(
            recipe,
            "import",
            f"{why}; a recipe is a module that defines its Recipe class, named module:Class",
        )


def _refuse_link_out(recipe: str, origin: Path) -> None:
    """A recipe file found in a spec's folder that is a link to a file outside that folder is
    refused: the code a run ID hashes and an output folder keeps is the folder's own."""
    for folder in RECIPE_DIRS:
        if origin.is_relative_to(folder) and not origin.resolve().is_relative_to(folder):
            raise RecipeError(
                recipe,
                "import",
                f"'{origin}' is a link to '{origin.resolve()}', outside the folder '{folder}' "
                "it is found in; put the file itself there (a link out of the spec's folder is "
                "never followed)",
            )


#: The recipe methods that run only after training (predictions, per-example scores): a run
#: whose file changed only in these keeps its ID, and only its predictions and scores are redone.
AFTER_TRAINING: tuple[str, ...] = ("predict", "score")


def recipe_file_sha256(recipe: str) -> str:
    """sha256 of the recipe module's source file (what a model folder records)."""
    return sha256_file(recipe_file(recipe))


def training_source(recipe: str, source: bytes) -> bytes:
    """The recipe file's bytes without the lines of the recipe class's ``predict`` and
    ``score`` (decorators included): what training depends on in that file.

    Everything else stays: the model, datasets, loss and optimizer code, module-level helpers
    and constants, other classes. Lines are cut from the text (not an AST dump), so the hash
    is the same under every Python version. A file that does not parse, or whose recipe
    class is not defined in it (imported from elsewhere), is kept whole.
    """
    cls = import_path(recipe).partition(":")[2]
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return source
    cut: list[tuple[int, int]] = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if (
                    isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                    and item.name in AFTER_TRAINING
                    and item.end_lineno is not None
                ):
                    first = min([d.lineno for d in item.decorator_list] + [item.lineno])
                    cut.append((first - 1, item.end_lineno))
    lines = source.splitlines(keepends=True)
    return b"".join(line for i, line in enumerate(lines) if not any(a <= i < b for a, b in cut))


#: The training source's sha256 by (recipe, file sha256): a file is cut once per process.
_TRAINING_SHA256: dict[tuple[str, str], str] = {}


def recipe_hashes(recipe: str) -> tuple[str, str]:
    """``(file sha256, training sha256)`` of a recipe given by import path: the first is
    what a model folder records, the second (``training_source``'s) enters the run ID. The
    file is hashed through ``sha256_file``'s cache and cut once per version."""
    path = recipe_file(recipe)
    file_sha = sha256_file(path)
    key = (import_path(recipe), file_sha)
    if key not in _TRAINING_SHA256:
        source = path.read_bytes()
        if hashlib.sha256(source).hexdigest() != file_sha:  # written between the two reads
            return recipe_hashes(recipe)
        _TRAINING_SHA256[key] = hashlib.sha256(training_source(recipe, source)).hexdigest()
    return file_sha, _TRAINING_SHA256[key]
