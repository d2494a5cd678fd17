"""The launch: how a loaded program runs on a card, as one route.

* :mod:`~spyre_lab.runtime.launch.options`     how the host drives launches (``RuntimeOptions``, ``timing_only``)
* :mod:`~spyre_lab.runtime.launch.kernels`     what a launch accepts and runs (``LaunchProgram``, ``LaunchKernel``,
  ``LoadedFunction``, ``Operands``)
* :mod:`~spyre_lab.runtime.launch.plan`        the record of a launch (``JobPlan`` of ``Step`` s, ``last_plan``)
* :mod:`~spyre_lab.runtime.launch.correction`  what a launch patches (``CorrectionArea``) and the in-place updates
  it lands (``WriteBack``)
* :mod:`~spyre_lab.runtime.launch.route`       the route itself: ``launch`` (and ``launch_bound``, ``plan_launch``)
"""

from __future__ import annotations

from spyre_lab.runtime.launch.correction import CorrectionArea, WriteBack, correction_area, launch_kernels, writebacks
from spyre_lab.runtime.launch.kernels import LaunchKernel, LaunchProgram, LoadedFunction, Operands, Window
from spyre_lab.runtime.launch.options import (
    RuntimeOptions,
    default_options,
    is_timing_only,
    set_default_options,
    timing_only,
)
from spyre_lab.runtime.launch.plan import JobPlan, Step, StepKind, last_plan
from spyre_lab.runtime.launch.route import launch, launch_bound, plan_launch

__all__ = [
    "CorrectionArea", "JobPlan", "LaunchKernel", "LaunchProgram", "LoadedFunction", "Operands", "RuntimeOptions",
    "Step", "StepKind", "Window", "WriteBack", "correction_area", "default_options", "is_timing_only", "last_plan",
    "launch", "launch_bound", "launch_kernels", "plan_launch", "set_default_options", "timing_only", "writebacks",
]
