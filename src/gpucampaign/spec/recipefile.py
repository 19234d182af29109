"""Where a recipe's source file is: found on ``sys.path`` without running it, and hashed.

The spec needs the file's sha256 for a run ID before any recipe is imported; importing and
checking the recipe itself is ``recipe.contract.load_recipe``.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path

from gpucampaign.core.files import sha256_file
from gpucampaign.spec.parts import BUILTIN_RECIPES, SpecError

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
        # A top-level module is looked up on sys.path itself: ``find_spec`` would answer with
        # a module of that name imported earlier from another spec's folder.
        top = "." not in module
        found = (
            importlib.machinery.PathFinder.find_spec(module)
            if top
            else importlib.util.find_spec(module)
        )
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


def recipe_file_sha256(recipe: str) -> str:
    """sha256 of the recipe module's source file (part of the run ID)."""
    return sha256_file(recipe_file(recipe))
