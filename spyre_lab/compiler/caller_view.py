"""What the caller of a compiled graph sees besides the numbers, read from the example values Dynamo recorded.

Dynamo hands a backend a graph whose every value carries a fake tensor: its device, dtype, sizes, strides and
the storage it shares with other values. A spyre Program computes the numbers (traced on separate host
tensors, it knows nothing of devices or shared memory), so the rest of what eager gives the caller is kept here:

* **devices**: each output lands where eager puts it (``x.to("spyre")``, ``x.cpu()``,
  ``torch.arange(n, device="spyre")`` are part of the program's meaning), and a graph that touches the card runs
  on the card even when its inputs are on the host;
* **outputs that alias**: an output that is a view of an input is that view of the caller's tensor again
  (``x[0]``, ``x.t()``: writing to it writes the input); outputs that share memory with each other share it again;
  every other output is a new tensor on every call, never a program constant or an input;
* **inputs that alias**: a Program updates an input in place after it ran, so when that input shares memory with
  another input (``f(d, d[1])``) the program would have read the other one's old values. Such a call runs the
  graph op by op instead (:meth:`CallerView.aliased_update`), with a one-time warning.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch.multiprocessing.reductions import StorageWeakRef

FRESH, INPUT_VIEW, SAME_INPUT, SHARED, SAME, UNKNOWN = "fresh", "input view", "input", "shared", "same", "unknown"


def example_value(node: Any) -> Any:
    """The fake value Dynamo (``example_value``) or make_fx (``val``) recorded for a node, if any."""
    if not isinstance(node, fx.Node):
        return None
    return node.meta.get("example_value", node.meta.get("val"))


def _static(t: torch.Tensor) -> bool:
    return all(isinstance(v, int) for v in (*t.shape, *t.stride(), t.storage_offset()))


def _storage(t: torch.Tensor) -> StorageWeakRef | None:
    try:
        return StorageWeakRef(t.untyped_storage())
    except (RuntimeError, NotImplementedError):     # a tensor without storage (a functional wrapper)
        return None


def memory_key(t: torch.Tensor) -> tuple[str, int] | None:
    """Which memory a real tensor lives in (device and base address), or None for an empty tensor."""
    if t.numel() == 0:
        return None
    return (str(t.device), t.untyped_storage().data_ptr())


def _extent(t: torch.Tensor) -> tuple[int, int]:
    """The element range [start, end) of its storage a tensor can touch."""
    start = t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if s < 0)
    end = t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if s > 0) + 1
    return start * t.element_size(), end * t.element_size()


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Can writing ``a`` change what ``b`` reads? (The same memory and overlapping byte ranges of it.)"""
    ka, kb = memory_key(a), memory_key(b)
    if ka is None or ka != kb:
        return False
    (a0, a1), (b0, b1) = _extent(a), _extent(b)
    return a0 < b1 and b0 < a1


@dataclass(frozen=True)
class OutputRule:
    """How one tensor output reaches the caller."""

    kind: str                        # FRESH, INPUT_VIEW, SAME_INPUT, SHARED, SAME or UNKNOWN
    device: torch.device | None      # where eager puts it (None: not recorded)
    source: int = -1                 # INPUT_VIEW, SAME_INPUT: tensor input index; SHARED: group id; SAME: output
    size: tuple[int, ...] = ()
    stride: tuple[int, ...] = ()
    offset: int = 0                  # INPUT_VIEW: relative to the input's storage offset; SHARED: absolute
    base_numel: int = 0              # SHARED: elements of the memory the group shares
    dtype: torch.dtype | None = None


class CallerView:
    """The caller-visible contract of one Dynamo graph: output devices and aliasing, and which inputs it updates."""

    def __init__(self, gm: fx.GraphModule, output_nodes: Sequence[fx.Node]) -> None:
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        inputs = [example_value(n) for n in placeholders]
        tensor_inputs = [v for v in inputs if isinstance(v, torch.Tensor)]
        self.on_card = any(isinstance(v, torch.Tensor) and v.device.type == "spyre"
                           for v in (example_value(n) for n in gm.graph.nodes))
        input_storage = {}
        for i, v in enumerate(tensor_inputs):
            key = _storage(v)
            if key is not None:
                input_storage.setdefault(key, i)
        seen_nodes: dict[fx.Node, int] = {}
        groups: dict[StorageWeakRef, list[int]] = {}
        rules: list[OutputRule] = []
        for i, node in enumerate(output_nodes):
            value = example_value(node)
            if not isinstance(value, torch.Tensor):
                rules.append(OutputRule(UNKNOWN, None))
                continue
            if node in seen_nodes:
                rules.append(OutputRule(SAME, value.device, source=seen_nodes[node]))
                continue
            seen_nodes[node] = i
            key = _storage(value)
            if key is None or not _static(value):
                rules.append(OutputRule(UNKNOWN, value.device))
                continue
            geometry = dict(size=tuple(value.shape), stride=tuple(value.stride()), dtype=value.dtype)
            if key in input_storage:
                source = tensor_inputs[input_storage[key]]
                if value is source:                  # x.contiguous() of a contiguous x, x.to(x.device): x itself
                    rules.append(OutputRule(SAME_INPUT, value.device, source=input_storage[key]))
                    continue
                if source.dtype == value.dtype and _static(source):
                    rules.append(OutputRule(INPUT_VIEW, value.device, source=input_storage[key],
                                            offset=value.storage_offset() - source.storage_offset(), **geometry))
                    continue
                rules.append(OutputRule(UNKNOWN, value.device))
                continue
            groups.setdefault(key, []).append(i)
            rules.append(OutputRule(FRESH, value.device, offset=value.storage_offset(),
                                    base_numel=value.untyped_storage().nbytes() // value.element_size(), **geometry))
        for gid, members in enumerate(m for m in groups.values() if len(m) > 1):
            if len({rules[i].dtype for i in members}) == 1:
                for i in members:
                    r = rules[i]
                    rules[i] = OutputRule(SHARED, r.device, gid, r.size, r.stride, r.offset, r.base_numel, r.dtype)
        self.rules = rules

    # --- inputs ---------------------------------------------------------------------------------------
    @staticmethod
    def aliased_update(updated: Sequence[int], tensors: Sequence[torch.Tensor]) -> tuple[int, int] | None:
        """(updated input, input sharing its memory) if an input the program updates in place overlaps another.
        One pass over the inputs' memory: only inputs in the same memory as an updated one are compared."""
        by_memory: dict[tuple[str, int], list[int]] = {}
        for j, t in enumerate(tensors):
            key = memory_key(t)
            if key is not None:
                by_memory.setdefault(key, []).append(j)
        for m in updated:
            for j in by_memory.get(memory_key(tensors[m]), ()) if tensors[m].numel() else ():
                if j != m and overlaps(tensors[m], tensors[j]):
                    return m, j
        return None

    # --- outputs --------------------------------------------------------------------------------------
    def finish(self, values: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor],
               suspects: Collection[int] = ()) -> list[torch.Tensor]:
        """The program's tensor outputs as eager hands them over: on eager's devices, views of the caller's
        inputs where eager returns views, sharing memory where eager's outputs share it, fresh otherwise.
        ``suspects``: the outputs that may come back in an input's or an earlier output's memory (the Program
        returns a view of an input buffer, or one buffer twice); only those are checked and copied."""
        taken = {k for k in (memory_key(t) for t in inputs) if k is not None} if suspects else set()
        results: list[torch.Tensor] = []
        bases: dict[int, torch.Tensor] = {}
        for index, (value, rule) in enumerate(zip(values, self.rules)):
            if rule.kind == SAME:
                results.append(results[rule.source])
                continue
            if rule.kind == SAME_INPUT:
                results.append(inputs[rule.source])
                continue
            if rule.kind == INPUT_VIEW:
                source = inputs[rule.source]
                results.append(source.as_strided(rule.size, rule.stride, source.storage_offset() + rule.offset))
                continue
            if rule.device is not None and value.device != rule.device:
                value = value.to(rule.device)
            if rule.kind == SHARED:
                base = bases.get(rule.source)
                if base is None:
                    base = bases[rule.source] = torch.empty(rule.base_numel, dtype=rule.dtype, device=value.device)
                view = base.as_strided(rule.size, rule.stride, rule.offset)
                view.copy_(value)
                results.append(view)
                continue
            if index in suspects:
                key = memory_key(value)
                if rule.kind == FRESH and key is not None and key in taken:
                    value = value.clone()             # an input's or another output's memory: a new tensor
                    key = memory_key(value)
                if key is not None:
                    taken.add(key)
            results.append(value)
        return results


__all__ = ["CallerView", "OutputRule", "example_value", "memory_key", "overlaps"]
