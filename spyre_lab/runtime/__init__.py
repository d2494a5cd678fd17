"""spyre_lab.runtime: ``torch.device("spyre")`` in pure Python.

Importing this package registers the device. It also happens on a bare ``import torch`` through the
``torch.backends`` entry point, which calls :func:`_autoload`.

* ``torch.spyre``            device module (device_count, memory_allocated, Stream, Event, synchronize, ...)
* :func:`last_trace`         the Trace of the last launch (eager op, copy or compiled program)
* :func:`recording`          ``with recording() as trace:`` every modeled event of a block
* :func:`launch`             run a program through the JobPlan path (program correction, H2D, Compute)
"""

from __future__ import annotations

import warnings

from spyre_lab.runtime.registration import register

register()

from spyre_lab.runtime.jobplan import JobPlan, RuntimeOptions, StepKind, launch, plan_launch  # noqa: E402
from spyre_lab.runtime.streams import Event, Stream, last_trace, recording  # noqa: E402

__all__ = ["Event", "JobPlan", "RuntimeOptions", "StepKind", "Stream", "last_trace", "launch", "plan_launch",
           "recording", "register"]


def _autoload() -> None:
    """Entry point of ``torch.backends``: runs inside ``import torch``, so it must never raise."""
    try:
        register()
    except Exception as exc:  # a broken backend must not break every `import torch`
        warnings.warn(f"spyre_lab could not register the spyre device: {exc!r}", RuntimeWarning, stacklevel=2)
