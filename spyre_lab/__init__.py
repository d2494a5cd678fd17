"""spyre_lab: learn how a dataflow AI accelerator meets PyTorch, on a modeled IBM Spyre device.

Layers (imports point downward only): device -> compiler -> runtime -> engine -> viz.
"""

# torch first: its import runs the ``torch.backends`` entry point, which registers the spyre
# device by importing spyre_lab.runtime. Doing it here, before any submodule starts importing,
# means that registration never meets a half-initialised spyre_lab module.
import torch  # noqa: F401  (imported for its side effect)

__version__ = "0.1.0"
