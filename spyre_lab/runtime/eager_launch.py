"""The cached eager op's launcher: a compiled one-op program bound once per card, relaunched with only what changes.

An eager op at a shape seen before runs the same compiled program on new operands. What
:func:`~spyre_lab.runtime.programs.run_program` works out at every call (the loaded program, its binding plan
and correction area, the checks that every input has the compiled shape and sits on the card, which slots are
constants or intermediates, the queued steps of the stream) is fixed for the cached program on that card, so an
:class:`EagerLauncher` works it out once; a launch then allocates the outputs, enqueues the kernel's steps,
patches the addresses and runs the kernel through the one launch route
(:func:`~spyre_lab.runtime.launch.route.launch_bound`), so it records the same JobPlan, trace events, modeled times
and launch count.

Only the common case takes this road: a functional op (no in-place update, no ``out=``), every output a buffer
of its own, every kernel on the device, the default ``aot_patch`` dispatch. Anything else, and a card reset since
the launcher was made, goes through ``run_program`` as before (:func:`launcher` returns None).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from torch.utils._pytree import TreeSpec, tree_unflatten

from spyre_lab.compiler.program import Program
from spyre_lab.runtime.launch.options import SETTINGS
from spyre_lab.runtime.launch.route import LaunchImage, launch_bound, launch_image, launch_imaged
from spyre_lab.runtime.programs import load
from spyre_lab.runtime.stream import STREAMS, current_stream


class EagerLauncher:
    """One compiled one-op program on one card, bound once: what a launch of it repeats, worked out ahead."""

    __slots__ = ("area", "bound", "device", "fresh", "generation", "image", "index", "inputs", "loaded", "outputs",
                 "trace_meta", "unflatten")

    def __init__(self, program: Program, read_leaves: Sequence[int], index: int, out_spec: TreeSpec) -> None:
        loaded = load(program)
        area, plan = loaded.binding_plan(index)
        self.loaded, self.area, self.index = loaded, area, index
        self.device, self.generation = area.device, area.device.generation      # a reset card: made again
        self.inputs = list(zip((name for name, _, _ in plan.inputs), read_leaves))   # (slot, leaf) per input
        self.bound: dict[str, Any] = dict(loaded.constants(index))                  # what every launch binds
        self.bound.update(plan.intermediates.slots)
        self.fresh = plan.makers                                                     # (slot, FreshTensors)
        self.outputs = [(read.buffer, None if read.is_identity else read) for read in program.outputs]
        # None: one output, returned as it is; else how the op's outputs are put in its structure
        self.unflatten = None if out_spec.is_leaf() else functools.partial(tree_unflatten, treespec=out_spec)
        self.image: LaunchImage | None = None     # the launch on the stream of the last launch, worked out once
        self.trace_meta = {"eager": True, "compiled": True}   # what its traces record besides the op (read, not kept)


def launcher(program: Program, read_leaves: Sequence[int], index: int, out_spec: TreeSpec) -> EagerLauncher | None:
    """A launcher for ``program`` on card ``index`` (the op's outputs in ``out_spec``), or None when a launch of it
    needs the general road."""
    if program.mutations:
        return None
    if any(k.host for k in load(program).kernels):
        return None
    visible = {read.buffer for read in program.outputs}
    if len(visible) != len(program.outputs) or visible & (set(program.inputs) | set(program.constants)):
        return None
    return EagerLauncher(program, read_leaves, index, out_spec)


def run_cached(launch: EagerLauncher, leaves: list[Any], name: str) -> Any:
    """Launch a cached one-op program on ``leaves`` (the trace's launch named ``name``); what the op returns (its
    output, or its outputs in the op's structure), or :data:`GENERAL_ROAD` when this launch needs the general road
    (a dispatch other than ``aot_patch``). The caller made sure the card was not reset since the launcher was made
    (``launch.generation == launch.device.generation``)."""
    options = SETTINGS.options
    if options.dispatch != "aot_patch":
        return GENERAL_ROAD
    stream = STREAMS.current.get(launch.index)
    if stream is None:
        stream = current_stream(launch.index)
    bound = launch.bound.copy()
    for slot, leaf in launch.inputs:
        bound[slot] = leaves[leaf]
    for slot, make in launch.fresh:
        bound[slot] = make()
    image = launch.image
    if image is None or image.stream is not stream:
        image = launch.image = launch_image(launch.loaded, launch.area, stream)
    if image is not None:                                      # the one launch route, traced as the op
        launch_imaged(image, bound, options, name, launch.trace_meta)
    else:
        launch_bound(launch.loaded, launch.area, bound, stream, options, (name, launch.trace_meta))
    if launch.unflatten is None:                               # one output, as the op returns it
        buffer, read = launch.outputs[0]
        return bound[buffer] if read is None else read.apply(bound[buffer])
    return launch.unflatten([bound[buffer] if read is None else read.apply(bound[buffer])
                             for buffer, read in launch.outputs])


GENERAL_ROAD = object()
"""What :func:`run_cached` returns for a launch it leaves to the general road."""
