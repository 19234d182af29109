"""gpucampaign: a training campaign on a rented GPU lot that ends in a decision."""

from gpucampaign.core.version import __version__
from gpucampaign.recipe.contract import Recipe, RecipeContext

__all__ = ["Recipe", "RecipeContext", "__version__"]
