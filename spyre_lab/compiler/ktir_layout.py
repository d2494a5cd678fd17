"""The two facts of a compiled kernel's plan that its KTIR text spells out for the timing to carry over.

**Stick padding.** The compiler lays every tensor out in whole 128-byte sticks: each row of the innermost dim
starts on a stick, so a ``[48, 150]`` fp16 tensor has a row stride of 192 elements, not 150, and a 64-wide
tile of a row touches one stick, never two. The exported memory views use those padded strides (and
offsets), so the reader moves the sticks the compiler's plan moves; the reader's argument buffers are laid
out the same way (:mod:`spyre_lab.ktir.sticks`).

**Buffer phases.** The compiler's plan gives every streamed operand two LX slots (double buffering): the load
of tile ``t`` reuses the slot tile ``t - 2`` used, so it waits for that tile to finish, and overlaps tile
``t - 1``'s compute. KTIR's loads produce values, not buffers, so the text says how many slots each tile
loop cycles through with a discardable attribute after the loop's region, the double-buffering pass's
``num_phases`` of torch-spyre's dataflow dialect: ``scf.for ... { ... } {ktdf.num_phases = 2 : i64}``.
The reader makes each DRAM load of iteration ``i`` wait for iteration ``i - num_phases`` of its loop to end.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from spyre_lab.compiler.ktir_errors import KTIRUnsupported

KernelSpec = Any  # compiler.kernel_spec.KernelSpec; not imported, since kernel_spec.to_ktir imports the writers

PHASES_ATTR = "ktdf.num_phases"


def stick_layout(spec: KernelSpec, b: str, strides: Sequence[int], offset: int) -> tuple[list[int], int]:
    """``b``'s view ``strides`` and ``offset`` (elements of the dense base buffer) in the stick-padded layout.

    An element at dense position ``x`` of a base whose innermost dim has ``n`` elements lies at
    ``(x // n) * padded(n) + x % n``: whole rows keep their count, positions inside a row stay. A stride that
    moves by whole rows or stays inside one row maps the same way; any other stride (a reshape that merges
    the innermost dim with another) has no padded form and is refused by name."""
    info = spec.buffers.get(b)
    shape = tuple(info.shape) if info is not None else tuple(spec.operands[b].shape)
    item = info.dtype.itemsize if info is not None else spec.operands[b].itemsize    # the text's element type
    n = shape[-1] if shape else 1
    per = max(1, spec.cfg.stick_bytes // item)
    padded = max(1, math.ceil(n / per)) * per       # a row of one element still fills a stick
    if padded == n:
        return list(strides), offset
    out = []
    for s in strides:
        if s % n and s >= n:
            raise KTIRUnsupported("export", 0, f"kernel {spec.name}: {b} is read with stride {s} over rows of {n}, "
                                               "which no stick-padded memory view can express")
        out.append(s // n * padded + s % n)
    return out, offset // n * padded + offset % n


def buffer_phases(spec: KernelSpec) -> int:
    """LX slots the plan cycles each streamed operand through: 2 when it double-buffers (a ``[1]`` copy)."""
    return 2 if any(name.endswith("[1]") for name in spec.lx_plan.sizes) else 1


def loop_end(spec: KernelSpec, phases: int | None = None) -> str:
    """The line that closes a tile loop: its region's brace and the loop's buffer phases (``phases``, else the
    plan's streamed-operand slots)."""
    return f"}} {{{PHASES_ATTR} = {phases or buffer_phases(spec)} : i64}}"
