"""The built-in recipes (``mlp``, ``cnn``: ``tabular``'s MLP and CNN) and their models."""

from gpucampaign.builtin.models import RECIPES, build_model, fit_input_stats

__all__ = ["RECIPES", "build_model", "fit_input_stats"]
