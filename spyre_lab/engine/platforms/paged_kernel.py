"""Paged attention as one device launch per layer: this step's K/V written and attended in one tiled kernel.

The eager form (`paged_attention_op.grouped_paged_attention`) is about 11 device ops per layer per decode
step, and its page gathers copy every sequence's whole padded K/V into DRAM before reading it again.
Here one hand-made launch (:class:`PagedAttentionLaunch`, a ``jobplan.Launchable`` with one kernel) does
it all through ``jobplan.launch``: the kernel reads each cache block once through the block table, writes
this step's keys and values into their slots, and the KV caches are operands written in place, so they
never cross PCIe.

* Numerics: :func:`~spyre_lab.compiler.tiling_paged_attention.paged_online_attention`, in the split-KV
  order the plan chose.
* Timing: the per-core tile programs of :func:`~spyre_lab.compiler.tiling_paged_attention.plan_paged_attention`,
  simulated (analytic mode) once per launch shape -- cache blocks and queries per sequence -- and cached,
  so a decode step re-simulates only when some sequence crosses into a new block.
* Loop bounds: the real kernel reads each sequence's length from DRAM when it runs. Here a spyre
  tensor's payload is host memory behind the modeled DRAM, so the launch reads the ``seq_query_lens``
  operand from the device tensor's storage (``host_view``) to pick the shape it times, with no modeled
  D2H: the device's own read of it is part of the kernel.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch

from spyre_lab.compiler.access import Read
from spyre_lab.compiler.explain import Explanation
from spyre_lab.compiler.tiling_paged_attention import (
    PagedPlan,
    PagedShape,
    context_blocks,
    paged_online_attention,
    plan_paged_attention,
)
from spyre_lab.device.config import SpyreConfig
from spyre_lab.device.sim import simulate
from spyre_lab.device.trace import Trace
from spyre_lab.runtime.devices import get_device
from spyre_lab.runtime.launch import Operands, launch
from spyre_lab.runtime.tensor import empty_spyre, host_view

SLOTS = ("query", "key", "value", "k_cache", "v_cache", "slot_mapping", "block_tables", "query_index",
         "seq_query_lens", "out")
OUTPUT_SLOTS = ("k_cache", "v_cache", "out")
CACHE_ENTRIES = 512
"""Launch shapes whose simulation is kept (least recently used dropped first)."""


@dataclass
class Timed:
    """One launch shape, planned and simulated: what the kernel's trace step shows."""

    plan: PagedPlan
    time_us: float
    trace: Trace
    args: dict[str, Any]
    chunks: list[list[int]]


_TIMED: OrderedDict[tuple, Timed] = OrderedDict()


def timed(shape: PagedShape, cfg: SpyreConfig, double_buffer: bool = True) -> Timed:
    """The plan and simulated time (analytic mode) of one launch shape on ``cfg``, cached: every layer and
    every step with the same shape shares one simulation."""
    key = (shape, cfg, double_buffer)
    hit = _TIMED.get(key)
    if hit is None:
        plan = plan_paged_attention(shape, cfg, double_buffer, name="paged attention")
        sim = simulate(plan.kernel, cfg, mode="analytic", trace=False)
        events = sim.core_trace("paged attention")
        blocks = sum(nb for nb, q in shape.seqs if q > 0) * shape.kv_heads
        args = {"rule": "attention", "kernel": "paged attention", "blocks_read": blocks,
                "kv_bytes": shape.kv_bytes(), "dram_bytes": int(sim.dram_bytes), "bottleneck": sim.bottleneck,
                "cores": len(sim.active_cores), "split_kv": plan.split_kv}
        hit = Timed(plan, sim.time_us, events, args, plan.block_chunks())
        _TIMED[key] = hit
        while len(_TIMED) > CACHE_ENTRIES:
            _TIMED.popitem(last=False)
    else:
        _TIMED.move_to_end(key)
    return hit


def explain() -> Explanation:
    """Each layer's paged-attention kernel as text: its last launch's shape, modeled time, DRAM bytes, plan."""
    lines = []
    for layer in sorted(_LAUNCHES.values(), key=lambda x: x.layer):
        t = layer.kernel.current
        if t is None:
            continue
        shape, args = t.plan.shape, t.args
        lines += [f"{layer.name}: {t.time_us:.2f} us modeled ({args['bottleneck']}-bound) on {args['cores']} cores; "
                  f"{args['blocks_read']} cache blocks read ({shape.block_size} tokens each), {args['kv_bytes']:,} B "
                  f"of K/V, {args['dram_bytes']:,} B from DRAM in all",
                  f"  shape: (cache blocks, queries) per sequence {list(shape.seqs)}",
                  f"  plan: {t.plan.reason}"]
    return Explanation("\n".join(lines) or "no paged-attention kernel launched yet")


def cache_info() -> dict[str, int]:
    """How many launch shapes are planned and simulated (the rest of the launches hit)."""
    return {"shapes": len(_TIMED)}


@dataclass(eq=False)
class PagedAttentionKernel:
    """The kernel of one layer's launch (a ``jobplan.RuntimeKernel``): the numerics and, per launch, the
    simulated time of the launch's shape (set by :meth:`PagedAttentionLaunch.__call__` before it launches)."""

    name: str
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float
    current: Timed | None = field(default=None, repr=False)
    address_slots: tuple[str, ...] = SLOTS
    output_slots: tuple[str, ...] = OUTPUT_SLOTS
    host: bool = False

    @property
    def time_us(self) -> float:
        return self.current.time_us if self.current else 0.0

    @property
    def timing(self) -> str:
        return "simulated, analytic"

    @property
    def sim_trace(self) -> Trace | None:
        """Per-core busy time of the launch's shape (shared by every layer: its core events say "paged attention")."""
        return self.current.trace if self.current else None

    @property
    def args(self) -> dict[str, Any]:
        return self.current.args if self.current else {}

    def run(self, operands: Operands) -> None:
        query, slots = operands["query"], operands["slot_mapping"]
        tokens, kv, d = query.shape[0], self.num_kv_heads, self.head_dim
        for cache, new in (("k_cache", operands["key"]), ("v_cache", operands["value"])):
            _write_slots(operands, cache, slots, new.reshape(tokens, kv, d))     # this step's slots, nothing else
        lens = operands["seq_query_lens"]
        out = paged_online_attention(query, operands["k_cache"], operands["v_cache"], operands["block_tables"],
                                     operands["query_index"], lens.select(1, 0), lens.select(1, 1), kv, self.scale,
                                     self.current.chunks if self.current else None,
                                     tile_blocks=self.current.plan.tile_blocks if self.current else 1)
        operands.write("out", out)


def _write_slots(operands: Operands, slot: str, slots: torch.Tensor, values: torch.Tensor) -> None:
    """Store ``values`` ([tokens, kv_heads, d]) into cache slots ``slots`` of the cache bound to ``slot``
    ([blocks, block_size, kv_heads, d], slots numbered block * block_size + offset): a row write of the
    buffer behind the patched address, so a launch writes its own K/V and leaves the rest of the cache alone."""
    buffer, size, stride, offset = operands.window(slot)     # the window the prologue resolved
    if stride[0] != size[1] * stride[1]:
        raise ValueError(f"the {slot} operand's blocks are not contiguous (size {size}, stride {stride})")
    buffer.write_rows((size[0] * size[1], *size[2:]), stride[1:], offset, slots, values)


@dataclass(eq=False)
class PagedAttentionLaunch:
    """One layer's paged attention as a ``jobplan.Launchable``: one kernel, no write-backs (the kernel writes
    the KV caches itself). Made once per layer and kept, so the runtime binds its correction area once."""

    layer: int
    kernel: PagedAttentionKernel
    double_buffer: bool = True

    @property
    def name(self) -> str:
        return self.kernel.name

    @property
    def kernels(self) -> list[PagedAttentionKernel]:
        return self._kernels

    @property
    def num_nodes(self) -> int:
        return 1

    @property
    def mutations(self) -> list[tuple[str, Read]]:
        return []

    def __post_init__(self) -> None:
        self._kernels = [self.kernel]

    def __call__(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, slot_mapping: torch.Tensor, block_tables: torch.Tensor,
                 query_index: torch.Tensor, seq_query_lens: torch.Tensor) -> torch.Tensor:
        kernel = self.kernel
        index = query.device.index
        cfg = get_device(index).config
        lens = host_view(seq_query_lens).tolist()          # the lengths the kernel reads from DRAM (see module doc)
        block_size = k_cache.shape[1]
        seqs = tuple((context_blocks(s - q, block_size), q) for s, q in lens)
        shape = PagedShape(kernel.num_heads, kernel.num_kv_heads, kernel.head_dim, block_size, seqs,
                           k_cache.element_size())
        kernel.current = timed(shape, cfg, self.double_buffer)
        out = empty_spyre((query.shape[0], kernel.num_heads * kernel.head_dim), None, query.dtype, index)
        launch(self, {"query": query, "key": key, "value": value, "k_cache": k_cache, "v_cache": v_cache,
                      "slot_mapping": slot_mapping, "block_tables": block_tables, "query_index": query_index,
                      "seq_query_lens": seq_query_lens, "out": out})
        return out


_LAUNCHES: dict[tuple, PagedAttentionLaunch] = {}


def layer_launch(layer: int, num_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                 double_buffer: bool = True) -> PagedAttentionLaunch:
    """The launch of layer ``layer`` (made once per layer and shape of model)."""
    key = (layer, num_heads, num_kv_heads, head_dim, scale, double_buffer)
    found = _LAUNCHES.get(key)
    if found is None:
        kernel = PagedAttentionKernel(f"paged attention L{layer}", num_heads, num_kv_heads, head_dim, scale)
        found = _LAUNCHES[key] = PagedAttentionLaunch(layer, kernel, double_buffer)
    return found
