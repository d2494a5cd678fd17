"""How the host drives launches (:class:`RuntimeOptions`), and the timing-only switch for studies.

* ``dispatch="aot_patch"`` (default): a launch's steps are enqueued and the host returns; it prepares the
  next launch while the card works on this one (ordered queues keep the reused correction buffer safe).
* ``dispatch="rebuild"``: the host rebuilds the execution graph at every launch
  (``cfg.host_rebuild_per_node_us`` per node) and waits for the card: host and device serialised.

Both give the same numbers; only the trace differs. The process-wide defaults are listed with every other
piece of process state in :mod:`~spyre_lab.runtime.process_state`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

Dispatch = Literal["rebuild", "aot_patch"]


@dataclass(frozen=True)
class RuntimeOptions:
    """How the host drives launches: ``"aot_patch"`` (async, patched programs) or ``"rebuild"``."""

    dispatch: Dispatch = "aot_patch"
    # with "aot_patch": False makes the host wait for each launch to finish before it prepares the next one
    # (patched programs, but host and device serialised), to separate patching from overlap in a study
    overlap: bool = True

    def __post_init__(self) -> None:
        if self.dispatch not in ("rebuild", "aot_patch"):
            raise ValueError(f"RuntimeOptions.dispatch must be 'rebuild' or 'aot_patch', got {self.dispatch!r}")

    @property
    def trace_meta(self) -> dict[str, Any]:
        """What a launch's trace records of these options (a fresh dict: the trace keeps it)."""
        return {"dispatch": self.dispatch}


class LaunchSettings:
    """The process's launch settings: the default options and whether launches skip their numerics."""

    def __init__(self) -> None:
        self.options = RuntimeOptions()
        self.timing_only = False

    def reset(self) -> None:
        self.__init__()


SETTINGS = LaunchSettings()


def is_timing_only() -> bool:
    """Are launches skipping their numerics (inside :func:`timing_only`)?"""
    return SETTINGS.timing_only


@contextlib.contextmanager
def timing_only() -> Iterator[None]:
    """Launches inside the block are planned, enqueued and timed as usual but skip their numerics
    (step actions): a study can time a model whose weights were never written, e.g. one built on the
    meta device and given DRAM with ``to_empty``. Outputs read as zeros."""
    previous, SETTINGS.timing_only = SETTINGS.timing_only, True
    try:
        yield
    finally:
        SETTINGS.timing_only = previous


def default_options() -> RuntimeOptions:
    """The options launches use when they are given none (eager ops always use these)."""
    return SETTINGS.options


def set_default_options(options: RuntimeOptions) -> RuntimeOptions:
    """Switch every later launch, eager or compiled, e.g. to ``RuntimeOptions(dispatch="rebuild")``;
    returns the previous options so a study can put them back."""
    if not isinstance(options, RuntimeOptions):
        raise TypeError(f"expected RuntimeOptions, got {type(options).__name__}")
    previous, SETTINGS.options = SETTINGS.options, options
    return previous
