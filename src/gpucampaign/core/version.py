"""The library's version (recorded in every model folder and manifest)."""

__version__ = "0.1.0"
