"""CustomOp: a layer with one portable definition and optional per-platform replacements.

Each layer writes `forward_native` in plain torch. A platform may register a subclass for a layer
name (`platform.register_oot("RMSNorm", SpyreRMSNorm)`); when a model is built inside
`layer_overrides(...)` (which `set_current_platform(platform)` enters), constructing `RMSNorm(...)`
returns a `SpyreRMSNorm` instead. The model file never mentions a platform, and the replacement
keeps the same parameters, so weight loading and state dicts are unchanged. This is vLLM's
`CustomOp.register_oot` pattern. The dependency points one way: platforms know layers, layers only
know the table of overrides they are handed.

Dispatch costs nothing per call: when a class is defined, its `forward` is bound to
`forward_oot` if the class defines one, else to `forward_native`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

from torch import nn

# The overrides in force while a model is being built, and who registered them (for error messages).
_active_overrides: Mapping[str, type] = {}
_active_owner: str = ""


@contextlib.contextmanager
def layer_overrides(owner: str, overrides: Mapping[str, type]) -> Iterator[None]:
    """Inside this block, building the CustomOp named ``name`` builds ``overrides[name]`` instead.

    ``overrides`` is read at construction time, so entries added while the block is open count too.
    """
    global _active_overrides, _active_owner
    previous = _active_overrides, _active_owner
    _active_overrides, _active_owner = overrides, owner
    try:
        yield
    finally:
        _active_overrides, _active_owner = previous


def active_override(op_name: str) -> type | None:
    """The class registered for ``op_name`` in the block being built, if any (for layers chosen by a factory)."""
    return _active_overrides.get(op_name)


@contextlib.contextmanager
def more_overrides(owner: str, extra: Mapping[str, type]) -> Iterator[None]:
    """`layer_overrides` with ``extra`` added to those in force; a TypeError if both name the same layer, unless
    ``extra``'s form subclasses the one in force (it is that form, specialised: e.g. a platform's sharded form)."""
    clash = sorted(name for name in set(extra) & set(_active_overrides)
                   if not issubclass(extra[name], _active_overrides[name]))
    if clash:
        raise TypeError(f"{_active_owner} and {owner} both replace {clash}; {owner} needs forms of these layers "
                        f"written for {_active_owner}")
    with layer_overrides(f"{_active_owner} with {owner}" if _active_owner else owner, {**_active_overrides, **extra}):
        yield


class CustomOp(nn.Module):
    #: the name platforms use to replace this layer
    op_name: ClassVar[str] = ""

    def __new__(cls, *args: Any, **kwargs: Any) -> CustomOp:
        override = _active_overrides.get(cls.op_name)
        if override is not None and override is not cls and issubclass(override, cls):
            cls = override
        elif override is not None and not issubclass(override, cls):
            raise TypeError(
                f"{_active_owner} registered {override.__name__} for {cls.op_name!r}, "
                f"but it must subclass {cls.__name__} so it keeps the same parameters"
            )
        return super().__new__(cls)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        overridden = cls.forward_oot is not CustomOp.forward_oot
        cls.forward = cls.forward_oot if overridden else cls.forward_native

    def forward_native(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define forward_native")

    def forward_oot(self, *args: Any, **kwargs: Any) -> Any:
        """What a platform subclass overrides; by default the portable implementation."""
        return self.forward_native(*args, **kwargs)
