"""spyre_lab.runtime: ``torch.device("spyre")`` in pure Python.

Importing this package registers the device. It also happens on a bare ``import torch`` through the
``torch.backends`` entry point, which calls :func:`_autoload` (set ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``
to switch that off).

* ``torch.spyre``            device module (device_count, memory_allocated, Stream, Event, synchronize, ...)
* :func:`last_trace`         the Trace of the last launch (eager op, copy or compiled program)
* :func:`recording`          ``with recording() as trace:`` every modeled event of a block
* :func:`last_plan`          the JobPlan submitted last (``last_plan().describe()``)
* :func:`launch`             run a program through the one launch route (program correction, H2D, Compute)
* :func:`run_program`        launch a compiler ``Program`` on spyre tensors
* :func:`host_view`, :func:`write_into`, :func:`device_nbytes`   read, write and size a spyre tensor's
  values on the host, for code that moves them itself (the collectives' staging) and models the DMA

The public names are loaded on first use so that the autoload inside ``import torch`` stays small.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

_EXPORTS = {
    "register": "spyre_lab.runtime.registration",
    "JobPlan": "spyre_lab.runtime.launch",
    "RuntimeOptions": "spyre_lab.runtime.launch",
    "set_default_options": "spyre_lab.runtime.launch",
    "StepKind": "spyre_lab.runtime.launch",
    "launch": "spyre_lab.runtime.launch",
    "last_plan": "spyre_lab.runtime.launch",
    "run_program": "spyre_lab.runtime.programs",
    "plan_launch": "spyre_lab.runtime.launch",
    "Event": "spyre_lab.runtime.event",
    "Stream": "spyre_lab.runtime.stream",
    "last_trace": "spyre_lab.runtime.timeline",
    "recording": "spyre_lab.runtime.timeline",
    "configure": "spyre_lab.runtime.devices",
    "host_view": "spyre_lab.runtime.tensor",
    "write_into": "spyre_lab.runtime.tensor",
    "device_nbytes": "spyre_lab.runtime.tensor",
    "SpyreUsageError": "spyre_lab.runtime.errors",
    "SpyreDtypeError": "spyre_lab.runtime.errors",
    "SpyreRangeError": "spyre_lab.runtime.errors",
    "SpyreInferenceOnlyError": "spyre_lab.runtime.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'spyre_lab.runtime' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def _autoload() -> None:
    """Entry point of ``torch.backends``: runs inside ``import torch``, so it must never raise."""
    try:
        from spyre_lab.runtime.registration import register

        register()
    except Exception as exc:  # a broken backend must not break every `import torch`
        warnings.warn(f"spyre_lab could not register the spyre device: {exc!r}", RuntimeWarning, stacklevel=2)


_autoload()
