"""spyre_lab: learn how a dataflow AI accelerator meets PyTorch, on a modeled IBM Spyre device.

Layers (imports point downward only): device -> compiler -> runtime -> engine -> viz.
"""

__version__ = "0.1.0"
