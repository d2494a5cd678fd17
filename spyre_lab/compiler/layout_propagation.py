"""Layout propagation: every buffer gets a ``StickLayout``; restickify where producer and consumer disagree.

torch-spyre runs ``propagate_spyre_tensor_layouts`` -> ``insert_restickify`` before scheduling. The
rules it enforces (docs/hardware.md, "Stick layouts"): pointwise operands share one stick dim; a matmul reads A
sticked on K and B sticked on N and writes C sticked on N; a view is free only when the stick it
needs already exists in memory -- the consumer's innermost axis must run contiguously through whole
sticks of the producer's buffer, starting at a stick boundary.

Buffers are stored row-major (``StickLayout.default``: the last host dim is the stick dim), so the
test is on the *strides of the view*: the consumer's innermost axis must have stride 1 in the base
buffer (or 0: a broadcast), start at a stick boundary, and either cover the producer's whole row or
split it into whole sticks. ``x @ W.T`` fails it (W is sticked on K, the matmul wants N), which is
why the real vLLM plugin stores W-transposed once at load: here a weight that is a compile-time
constant is restickified at compile time, a weight passed as an input is restickified every call.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spyre_lab.compiler.access import Access, Lowered, Read, compose
from spyre_lab.compiler.ir import BufferInfo, Pointwise
from spyre_lab.device.config import SpyreConfig
from spyre_lab.device.layout import StickLayout


def stored_dtype(dtype: torch.dtype) -> torch.dtype:
    """The element type the card holds a buffer of ``dtype`` in: a float64 value (made and used only by host ops)
    is stored as fp16, the runtime's storage policy for floating dtypes the card does not compute in."""
    return torch.float16 if dtype == torch.float64 else dtype


@dataclass(frozen=True)
class Restickify:
    """One layout conflict the pass resolved."""

    consumer: str
    source: str
    buffer: str
    reason: str
    at_compile_time: bool


def stick_conflict(read: Read, base_shape: tuple[int, ...], dtype: torch.dtype, cfg: SpyreConfig) -> str | None:
    """Why a read cannot stream its innermost axis straight out of the base buffer's sticks (None: it can)."""
    meta = read.meta
    if meta.dim() == 0 or read.is_identity:
        return None
    size, stride = meta.shape[-1], meta.stride()[-1]
    if size == 1 or stride == 0:
        return None
    eps = cfg.elems_per_stick(stored_dtype(dtype))
    row = base_shape[-1] if base_shape else 1
    if stride != 1:
        return f"innermost axis has stride {stride} in {read.buffer} (sticked on its last dim)"
    offset = meta.storage_offset() % row
    if offset % eps:
        return f"view starts {offset} elements into a stick"
    if size != row and (size % eps or row % eps):
        return f"view cuts {read.buffer}'s {row}-wide sticked rows into pieces of {size}"
    return None


def propagate_layouts(lowered: Lowered, cfg: SpyreConfig) -> list[Restickify]:
    """Insert restickify nodes where needed and give every buffer its StickLayout (in place)."""
    graph, buffers = lowered.graph, lowered.graph.buffers
    nodes, events = [], []
    done: dict[tuple, Read] = {}                      # one restickify per (buffer, view), shared by its readers
    for node in graph.nodes:
        access = lowered.access[node.name]
        if access is None or node.kind == "Fallback":
            nodes.append(node)
            continue
        if node.op == "copy" and len(access.reads) == 1:
            r = access.reads[0]
            why = stick_conflict(r, buffers[r.buffer].shape, buffers[r.buffer].dtype, cfg)
            if why:
                node.op = "restickify"
                events.append(Restickify(node.name, r.buffer, node.output, why, False))
            nodes.append(node)
            continue
        new_reads = []
        for r in access.reads:
            src = buffers[r.buffer]
            why = stick_conflict(r, src.shape, src.dtype, cfg)
            if why is None:
                new_reads.append(r)
                continue
            key = (r.buffer, r.steps)
            if key not in done:
                done[key] = _restickify(lowered, r, node.name, why, nodes, events)
            new_reads.append(Read(done[key].buffer, (), done[key].meta, r.axes))
        if new_reads != access.reads:
            access.reads = new_reads
            node.inputs = tuple(r.buffer for r in new_reads)
            node.compute = compose(new_reads, access.op_fn)
        nodes.append(node)
    graph.nodes = _restickify_early(nodes)
    for buf in buffers.values():
        buf.layout = StickLayout.default(buf.shape, stored_dtype(buf.dtype))
    return events


def _restickify(lowered: Lowered, r: Read, consumer: str, why: str, nodes: list, events: list) -> Read:
    buffers = lowered.graph.buffers
    shape = tuple(r.meta.shape)
    dtype = buffers[r.buffer].dtype
    name = f"{r.buffer}_restick_{len(events)}"
    meta = torch.empty(shape, dtype=dtype, device="meta")
    if r.buffer in lowered.constants:                 # a constant is restickified once, at compile time
        if name not in lowered.constants:
            lowered.constants[name] = r.apply(lowered.constants[r.buffer]).contiguous()
            buffers[name] = BufferInfo(name, shape, dtype, "constant")
        events.append(Restickify(consumer, r.buffer, name, why, True))
        return Read(name, (), meta, r.axes)
    buffers[name] = BufferInfo(name, shape, dtype, "intermediate")
    names = tuple(f"d{i}" for i in range(len(shape)))
    src = Read(r.buffer, r.steps, r.meta, names)
    fn = torch.Tensor.contiguous
    node = Pointwise(name=f"restickify:{name}", op="restickify", inputs=(r.buffer,), output=name,
                     dims=dict(zip(names, shape)), compute=compose([src], fn), stick_dim=names[-1] if names else None)
    lowered.access[node.name] = Access([src], names, fn)
    nodes.append(node)
    events.append(Restickify(consumer, r.buffer, name, why, False))
    return Read(name, (), meta, r.axes)


def _restickify_early(nodes: list) -> list:
    """Move each restickify right behind the producer of its source (graph inputs: to the front), so the
    reformatted tensor is ready before any consumer and never splits a chain that fusion could join."""
    moves = [n for n in nodes if n.op == "restickify" and n.name.startswith("restickify:")]
    rest = [n for n in nodes if not any(n is m for m in moves)]
    produced = {n.output for n in rest}
    ordered = [m for m in moves if m.inputs[0] not in produced]
    for n in rest:
        ordered.append(n)
        ordered.extend(m for m in moves if m.inputs[0] == n.output)
    return ordered
