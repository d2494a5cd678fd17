"""spyre_lab: learn how a dataflow AI accelerator meets PyTorch, on a modeled IBM Spyre device.

Layers (imports point downward only): device -> compiler -> runtime -> engine.

* ``spyre_lab.last_trace()``   the Trace of the last launch on the modeled card (modeled microseconds)
* ``spyre_lab.explain(model)`` graph -> kernels -> work division -> LX plan for a compiled model or Program
"""

# torch first: its import runs the ``torch.backends`` entry point, which registers the spyre
# device by importing spyre_lab.runtime. Doing it here, before any submodule starts importing,
# means that registration never meets a half-initialised spyre_lab module.
import torch  # noqa: F401  (imported for its side effect)

__version__ = "0.1.0"

_LAZY = {
    "last_trace": ("spyre_lab.runtime.timeline", "last_trace"),
    "recording": ("spyre_lab.runtime.timeline", "recording"),
    "explain": ("spyre_lab.runtime.dynamo_backend", "explain"),
    "SpyreConfig": ("spyre_lab.device.config", "SpyreConfig"),
    "SPYRE": ("spyre_lab.device.config", "SPYRE"),
    "CompileOptions": ("spyre_lab.compiler.options", "CompileOptions"),
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> object:
    """Top-level names load their layer on first use, so ``import spyre_lab`` stays cheap."""
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'spyre_lab' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(target[0]), target[1])
