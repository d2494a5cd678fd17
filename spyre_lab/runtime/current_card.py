"""An index-less ``"spyre"`` means the current card everywhere, as an index-less ``"cuda"`` does.

Why this module exists: torch fills in a missing device index in C++ by asking the backend's device guard,
and the Python device guard of torch 2.13 always answers index 0 (its ``getDevice`` cannot be overridden
from Python). Factories (``torch.ones(2, device="spyre")``) reach the spyre allocator with no index, and it
picks the current card; but ``.to("spyre")``, ``torch.tensor(..., device="spyre")`` and
``nn.Module.to("spyre")`` have had the index filled in with 0 before the backend sees them, so inside
``with torch.spyre.device(1):`` they used to land on spyre:0.

The fix: while the current card is not spyre:0, a torch function mode (:class:`CurrentCardMode`) gives
every index-less spyre device passed to a torch function the current card's index before torch reads it.
On spyre:0, the default, the mode is not installed: ordinary work pays nothing for it.

The mode sits at the bottom of the thread's mode stack (just above torch's own ``DeviceContext``, which
insists on the very bottom), so a mode a user enters and leaves around ``set_device`` never pops it by
mistake. Mode stacks are per thread, and so is the current card (:mod:`~spyre_lab.runtime.devices`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch._C import _len_torch_function_stack
from torch.overrides import TorchFunctionMode, _pop_mode, _push_mode
from torch.utils import _device as torch_device_context

BACKEND = "spyre"
_TENSOR_TO = torch.Tensor.to


def _indexless(value: Any) -> bool:
    """Does ``value`` name the spyre device without an index (``"spyre"``, ``torch.device("spyre")``)?"""
    kind = type(value)
    if kind is str:
        return value == BACKEND
    return kind is torch.device and value.type == BACKEND and value.index is None


class CurrentCardMode(TorchFunctionMode):
    """Rewrites an index-less spyre device in a torch call (``device=``, or positional in ``x.to("spyre")``) to
    ``spyre:<current card>``; also the device a ``with torch.device("spyre"):`` block gives factories, which torch
    would otherwise complete with index 0.

    Dynamo traces this method when it compiles under the mode, so it reads only plain values (the common
    case, no ``with torch.device(...)`` block, never touches the set of factories)."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.device = torch.device(BACKEND, index)

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is _TENSOR_TO:           # the one torch function that takes a device positionally: x.to("spyre")
            for value in args:
                if _indexless(value):
                    args = tuple(self.device if _indexless(a) else a for a in args)
                    break
        device = kwargs.get("device")
        if device is not None:
            if _indexless(device):
                kwargs = {**kwargs, "device": self.device}
        elif torch_device_context.CURRENT_DEVICE is not None and _indexless(torch_device_context.CURRENT_DEVICE) \
                and func in _factories():
            kwargs = {**kwargs, "device": self.device}
        return func(*args, **kwargs)


def _factories() -> set[Any]:
    """The factories ``with torch.device(...)`` gives a device (torch's own list)."""
    return torch_device_context._device_constructors()


def follow(index: int) -> None:
    """Make index-less spyre devices in torch calls mean spyre:``index`` on this thread (the current card)."""
    stack = [_pop_mode() for _ in range(_len_torch_function_stack())]   # top of the stack first
    stack = [mode for mode in stack if not isinstance(mode, CurrentCardMode)]
    bottom = stack.pop() if stack and isinstance(stack[-1], torch_device_context.DeviceContext) else None
    if bottom is not None:
        _push_mode(bottom)
    if index != 0:                     # on spyre:0 torch's own answer (index 0) is already the current card
        _push_mode(CurrentCardMode(index))
    for mode in reversed(stack):
        _push_mode(mode)


def installed() -> CurrentCardMode | None:
    """The mode in this thread's stack, if the current card is not spyre:0 (for tests and diagnostics)."""
    from torch.overrides import _get_current_function_mode_stack

    return next((m for m in _get_current_function_mode_stack() if isinstance(m, CurrentCardMode)), None)
