"""The engine's load-time error, in a module of its own so the loader and the models can both raise it."""

from __future__ import annotations


class ModelLoadError(ValueError):
    """A model folder that cannot be loaded; the message names the file and the key or tensor."""
