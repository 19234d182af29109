"""gpucampaign: a training campaign on a rented GPU lot that ends in a decision."""

__version__ = "0.1.0"

from gpucampaign.recipe import Recipe, RecipeContext  # noqa: E402

__all__ = ["Recipe", "RecipeContext", "__version__"]
