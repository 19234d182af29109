"""gpucampaign: a training campaign on a rented GPU lot that ends in a decision.

``Recipe`` and ``RecipeContext`` are the contract a user's training code follows;
``load_model(OUT, RUN)`` reloads a run's model with its recipe (``.model``, ``.recipe``,
``.predict(path)``), see ``gpucampaign.modelfolder.reload``.
"""

import os as _os
import sys as _sys
from typing import TYPE_CHECKING, Any


def _keep_working_folder_off_the_path() -> None:
    """``python -m gpucampaign.X`` from inside an output folder: Python put the working folder
    first on ``sys.path``, where a planted ``csv.py`` would shadow the standard library for
    everything this process imports next. Dropped here, before anything else is imported (the
    package's ``__init__`` runs before the module named), as ``-P`` would; the working folder
    stays only when the user named it on ``PYTHONPATH``."""
    argv = list(getattr(_sys, "orig_argv", ()))
    named = next(
        (
            a[2:] or (argv[i + 1] if i + 1 < len(argv) else "")
            for i, a in enumerate(argv)
            if a.startswith("-m")
        ),
        "",
    )
    if named.partition(".")[0] != __name__:
        return
    cwd = _os.getcwd()
    given = {_os.path.abspath(p) for p in _os.environ.get("PYTHONPATH", "").split(_os.pathsep) if p}
    if cwd not in given:  # -m's first entry, or an empty PYTHONPATH entry (both mean cwd)
        _sys.path[:] = [p for p in _sys.path if p and _os.path.abspath(p) != cwd]


_keep_working_folder_off_the_path()

if TYPE_CHECKING:
    from gpucampaign.recipe.contract import Recipe, RecipeContext

__all__ = ["Recipe", "RecipeContext", "__version__", "load_model"]


def __getattr__(name: str) -> Any:
    # Loaded when asked for: the recipe contract brings pydantic and the spec's models (0.13 s),
    # which `campaign`'s first line and its server's process (gpucampaign.cli) need not wait for.
    if name in ("Recipe", "RecipeContext"):
        from gpucampaign.recipe import contract

        return getattr(contract, name)
    if name == "__version__":
        from gpucampaign.core.version import __version__

        return __version__
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_model(out: Any, run: str, **options: Any) -> Any:
    """Reload run ``run`` (its name or run ID) of the output folder ``out`` with its recipe, on
    CPU: a ``LoadedModel`` with ``.model``, ``.recipe``, ``.config`` and ``.predict(path)``.

    Options (keyword-only): ``trust_folder_code`` (import the recipe copy kept in the folder)
    and ``recipes`` (folders of your recipe files). See
    ``gpucampaign.modelfolder.reload.load_model``.
    """
    # torch stays off `import gpucampaign`: the reload imports it only when called.
    from gpucampaign.modelfolder.reload import load_model as load

    return load(out, run, **options)
