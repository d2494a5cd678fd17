"""The launch: one route from a program and its bound tensors to steps on a stream and numbers in DRAM.

:func:`launch` is the one way to launch (eager one-op programs, compiled programs, engine pieces). Per kernel,
in order, it

1. enqueues the kernel's three steps on the stream (the modeled clock: the host pays each enqueue, the step
   runs when its stream and unit are free) and places the kernel's per-core simulator events after them;
2. runs the numerics (skipped inside :func:`~spyre_lab.runtime.launch.options.timing_only`): **HostCompute**
   writes every operand's real DRAM address into the pinned buffer (the correction blob), **H2D** copies it into
   the kernel's correction area, and **Compute**'s prologue reads the addresses back, finds the live buffer at
   each one and runs the kernel on them, so a wrong address would really read the wrong buffer. A host kernel
   runs on the host between its D2H and H2D.

What is the same at every launch of a program on a card (kernels, write-backs, step names, durations, lanes and
trace args) is worked out once by the program's
:class:`~spyre_lab.runtime.launch.correction.CorrectionArea`; the :class:`~spyre_lab.runtime.launch.plan.JobPlan`
a launch returns (and ``last_plan()`` keeps) is that record, so what a reader prints is what ran.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import torch

from spyre_lab.runtime.devices import SpyreDevice, get_device
from spyre_lab.runtime.launch.correction import CorrectionArea, correction_area
from spyre_lab.runtime.launch.kernels import LaunchProgram, Operands, Window
from spyre_lab.runtime.launch.options import SETTINGS, RuntimeOptions
from spyre_lab.runtime.launch.plan import LAST_PLAN, JobPlan
from spyre_lab.runtime.stream import Stream, current_stream
from spyre_lab.runtime.tensor import buffer_of
from spyre_lab.runtime.timeline import TIMELINE, device_lane


def launch(program: LaunchProgram, bindings: Mapping[str, torch.Tensor], *, stream: Stream | None = None,
           options: RuntimeOptions | None = None, **trace_args: Any) -> JobPlan:
    """Launch ``program`` with its address slots bound to spyre tensors, in-place updates included; returns the
    JobPlan that ran (its trace: ``last_trace()``). Every device launch goes through here."""
    if stream is None:
        first = next(iter(bindings.values()), None)
        stream = current_stream(first.device.index if first is not None else None)
    device = get_device(stream.device_index)
    options = SETTINGS.options if options is None else options
    area = correction_area(program, device)
    if not _binds_every_slot(area, bindings):
        _check_bindings(area, bindings)                     # says what is wrong with the binding
    meta = {"dispatch": options.dispatch, **trace_args} if trace_args else options.trace_meta
    _launch_traced(program, area, bindings, stream, options, meta)
    return LAST_PLAN.plan


def launch_bound(program: LaunchProgram, area: CorrectionArea, bindings: Mapping[str, torch.Tensor],
                 stream: Stream | None = None, options: RuntimeOptions | None = None,
                 trace: tuple[str, dict[str, Any]] | None = None) -> None:
    """:func:`launch` for a caller that bound every slot of ``area`` (``correction_area(program, card)``)
    to a buffer on that card itself, as ``run_program`` does: nothing to check again, and no JobPlan to
    return (``last_plan()`` has the record). ``trace``: the (name, meta) of the launch trace to open when none is
    open (an eager op names its trace by the op, not by the program); by default the program's."""
    stream = current_stream(area.device.index) if stream is None else stream
    options = SETTINGS.options if options is None else options
    name, meta = (program.name, options.trace_meta) if trace is None else trace
    TIMELINE.begin_launch(name, meta)
    try:
        _submit(program, area, bindings, stream, options)
    finally:
        TIMELINE.end_launch()


def plan_launch(program: LaunchProgram, bindings: Mapping[str, torch.Tensor],
                device: SpyreDevice | None = None) -> JobPlan:
    """The JobPlan a launch of ``program`` with these bindings runs, without launching it (bindings checked)."""
    if device is None:
        first = next(iter(bindings.values()), None)
        device = get_device(first.device.index if first is not None else None)
    area = correction_area(program, device)
    _check_bindings(area, bindings)
    area.refresh(program)
    return area.record(program, area.host_bytes(bindings))


def _binds_every_slot(area: CorrectionArea, bindings: Mapping[str, torch.Tensor]) -> bool:
    """Every slot bound, every bound tensor on the area's card (else :func:`_check_bindings` says what is wrong)."""
    if len(bindings) < len(area.all_slots) or not bindings.keys() >= area.slot_set:
        return False
    expected = area.torch_device
    return all(t.device == expected for t in bindings.values())


def _check_bindings(area: CorrectionArea, bindings: Mapping[str, torch.Tensor]) -> None:
    index = area.device.index
    elsewhere = {slot: str(t.device) for slot, t in bindings.items() if t.device != area.torch_device}
    if elsewhere:
        raise ValueError(f"a launch on spyre:{index} needs every bound tensor there; {elsewhere} are not "
                         f"(move them with .to('spyre:{index}'))")
    for kernel, slots in zip(area.kernels, area.slots):
        missing = [s for s in slots if s not in bindings]
        if missing:
            raise KeyError(f"kernel {kernel.name!r} needs address slot(s) {missing} but the launch binds only "
                           f"{sorted(bindings)}")


def _launch_traced(program: LaunchProgram, area: CorrectionArea, bindings: Mapping[str, torch.Tensor],
                   stream: Stream, options: RuntimeOptions, meta: dict[str, Any]) -> None:
    TIMELINE.begin_launch(program.name, meta)
    try:
        _submit(program, area, bindings, stream, options)
    finally:
        TIMELINE.end_launch()


def _submit(program: LaunchProgram, area: CorrectionArea, bindings: Mapping[str, torch.Tensor],
            stream: Stream, options: RuntimeOptions) -> None:
    """Every kernel's steps on ``stream`` and its numerics, in order; the JobPlan of the launch is recorded.

    Run per kernel of every launch, so it calls little: a device kernel's numerics (HostCompute writes the
    blob, H2D copies it, the prologue patches and runs) are written out here."""
    if not area.fixed:
        area.refresh(program)
    host_bytes = area.host_bytes(bindings) if area.has_host else ()
    plan = LAST_PLAN.plan = area.record(program, host_bytes)
    dispatch, device = options.dispatch, area.device
    if dispatch == "rebuild":
        TIMELINE.host_work(f"rebuild graph {plan.name}", device.config.host_rebuild_per_node_us * plan.nodes,
                           nodes=plan.nodes, dispatch="rebuild")
    numerics = not SETTINGS.timing_only
    enqueue_all, emit_shifted = stream.enqueue_all, TIMELINE.emit_shifted
    lane_of = None if device.index == 0 else functools.partial(device_lane, device_index=device.index)
    live = device.live_buffers
    for k, kernel, slots, _, steps, sim_events in area.queued(stream, dispatch, host_bytes):
        start = enqueue_all(steps)                          # the modeled clock: its three steps in FIFO order
        if sim_events is not None:
            emit_shifted(sim_events, start, lane_of)        # its per-core events, after the patch
        if not numerics:
            continue
        views = list(map(bindings.__getitem__, slots))
        claims = area.claims[k]
        if claims:
            live.update(claims)                             # its planned places in the intermediates segment
        if kernel.host:
            kernel.run(Operands({s: _resolve(device, buffer_of(v).address, v) for s, v in zip(slots, views)}))
            continue
        kernel.run(Operands(_patched_windows(area, k, slots, views)))
    if numerics and area.kernels:
        area.launches += 1
    if dispatch == "rebuild" or not options.overlap:
        stream.synchronize()


class LaunchImage:
    """One launch of a program of one device kernel with fixed modeled times (a cached eager op's), on one stream
    with ``aot_patch`` dispatch, worked out once: its record, its three queued steps and simulator events, where
    its trace events go, its slots and the claims it makes. :func:`launch_image` replays it; the steps, events,
    patch and run are :func:`_submit`'s, without the loop and its branches for host kernels, rebuilds and
    timing-only launches, and without looking the record and the queued steps up at every launch."""

    __slots__ = ("area", "claims", "geometry", "kernel", "lane_of", "plan", "program", "sim_events", "slots", "steps",
                 "stream")

    def __init__(self, program: LaunchProgram, area: CorrectionArea, stream: Stream) -> None:
        self.program, self.area, self.stream = program, area, stream
        self.plan = area.record(program)
        _, self.kernel, self.slots, _, self.steps, self.sim_events = area.queued(stream, "aot_patch")[0]
        index = area.device.index
        self.lane_of = None if index == 0 else functools.partial(device_lane, device_index=index)
        self.claims = area.claims[0]
        self.geometry: list[Geometry] | None = None        # the slots' operands, as the first launch binds them


def launch_image(program: LaunchProgram, area: CorrectionArea, stream: Stream) -> LaunchImage | None:
    """The :class:`LaunchImage` of ``program`` on ``stream`` (``area``: its correction area on that card), or None
    when its launches need :func:`launch_bound` (more than one kernel, a host kernel, modeled times that may
    change)."""
    if len(area.kernels) != 1 or area.has_host or not area.fixed:
        return None
    return LaunchImage(program, area, stream)


def launch_imaged(image: LaunchImage, bindings: Mapping[str, torch.Tensor], options: RuntimeOptions,
                  name: str, meta: dict[str, Any]) -> None:
    """:func:`launch_bound` of the image's program with ``bindings`` (every slot bound on its card) on its stream,
    traced as ``name``/``meta``, for ``aot_patch`` options: the same record, steps, events, patch and run. The
    caller binds every slot to a tensor of the same size, stride, offset and dtype at every launch (a cached eager
    op: its signature names them), so the kernel's windows take them from the first launch, as a compiled
    binary keeps its static shapes. Inside :func:`~spyre_lab.runtime.launch.options.timing_only` it takes
    :func:`launch_bound` (no numerics)."""
    area = image.area
    if SETTINGS.timing_only:
        launch_bound(image.program, area, bindings, image.stream, options, (name, meta))
        return
    TIMELINE.begin_launch(name, meta)
    try:
        LAST_PLAN.plan = image.plan
        start = image.stream.enqueue_all(image.steps)       # the modeled clock: its three steps in FIFO order
        if image.sim_events is not None:
            TIMELINE.emit_shifted(image.sim_events, start, image.lane_of)
        if image.claims:
            area.device.live_buffers.update(image.claims)
        views = list(map(bindings.__getitem__, image.slots))
        if image.geometry is None:
            image.geometry = [(v.shape, v.stride(), v.storage_offset(), v.dtype) for v in views]
        image.kernel.run(Operands(_patched_windows(area, 0, image.slots, views, image.geometry)))
        area.launches += 1
        if not options.overlap:
            image.stream.synchronize()
    finally:
        TIMELINE.end_launch()


def _patched_windows(area: CorrectionArea, k: int, slots: list[str], views: list[torch.Tensor],
                     geometry: list[Geometry] | None = None) -> dict[str, Window]:
    """Device kernel ``k``'s correction, as the card does it: HostCompute writes the real address of every slot
    into the pinned buffer (pinned[:n]), H2D copies that blob into the kernel's correction area
    (region[offset:offset + n]), and Compute's prologue reads the addresses back and finds the live buffer at
    each, so a wrong address would really read the wrong buffer; returns the operand windows the kernel runs on.
    ``geometry``: per slot the (size, stride, offset, dtype) the kernel was compiled for, when the caller knows
    every view has it (by default read from the views)."""
    device = area.device
    generation, live = device.generation, device.live_buffers
    pinned, region = area.pinned_views[k], area.region_views[k]
    addresses = []
    for v in views:
        buffer = v.untyped_storage().spyre_buffer
        if buffer.generation != generation:
            buffer.check_valid()                            # the error of a tensor from before a device reset
        addresses.append(buffer.allocation.address)
    pinned[...] = addresses
    region[...] = pinned
    addresses = area.patched[k] = region.tolist()
    windows = {}
    if geometry is None:
        for s, a, v in zip(slots, addresses, views):       # what each patched address holds
            buffer = live.get(a)
            if buffer is None or buffer.generation != generation or buffer.host_dtype != v.dtype:
                buffer = _resolve(device, a, v)[0]          # says what is wrong
            windows[s] = (buffer, v.shape, v.stride(), v.storage_offset())
        return windows
    for s, a, (size, stride, offset, dtype), v in zip(slots, addresses, geometry, views):
        buffer = live.get(a)
        if buffer is None or buffer.generation != generation or buffer.host_dtype != dtype:
            buffer = _resolve(device, a, v)[0]
        windows[s] = (buffer, size, stride, offset)
    return windows


Geometry = tuple[torch.Size, tuple[int, ...], int, torch.dtype]
"""A slot's operand as a kernel was compiled for it: size, stride, storage offset and dtype."""


def _resolve(device: SpyreDevice, address: int, static_view: torch.Tensor) -> Window:
    """The operand window at a patched ``address``: the live buffer there, with the kernel's static
    size/stride/offset (compiled into the program; only base addresses are patched)."""
    buffer = device.buffer_at(address)
    buffer.check_valid()
    if buffer.host_dtype != static_view.dtype:
        raise RuntimeError(f"patched address {address:#x} holds {buffer.host_dtype} data but the kernel expects "
                           f"{static_view.dtype}; the correction blob is stale")
    return buffer, static_view.shape, static_view.stride(), static_view.storage_offset()
