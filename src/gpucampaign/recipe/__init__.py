"""The recipe contract users write against, how the loop calls a recipe, the data audit."""

from gpucampaign.recipe.contract import Recipe, RecipeContext, RecipeError, load_recipe

__all__ = ["Recipe", "RecipeContext", "RecipeError", "load_recipe"]
