"""A run's model folder: saved as safetensors and ``config.json``, reloaded without pickle."""

from gpucampaign.modelfolder.saveload import (
    MODEL_FORMAT,
    RecipeCodeNotTrusted,
    library_versions,
    load_model_dir,
    load_run_model,
    predict,
    rebuild_recipe_model,
    save_model_dir,
)

__all__ = [
    "MODEL_FORMAT",
    "RecipeCodeNotTrusted",
    "library_versions",
    "load_model_dir",
    "load_run_model",
    "predict",
    "rebuild_recipe_model",
    "save_model_dir",
]
