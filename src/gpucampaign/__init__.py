"""gpucampaign: a training campaign on a rented GPU lot that ends in a decision.

``Recipe`` and ``RecipeContext`` are the contract a user's training code follows;
``load_model(OUT, RUN)`` reloads a run's model with its recipe (``.model``, ``.recipe``,
``.predict(path)``), see ``gpucampaign.modelfolder.reload``.
"""

from typing import TYPE_CHECKING, Any

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
