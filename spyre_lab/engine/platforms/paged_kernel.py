"""The platform's glue for the paged-attention kernel: one device launch per layer through ``runtime.programs``.

The eager form (`paged_attention_op.grouped_paged_attention`) is about 11 device ops per layer per decode
step, and its page gathers copy every sequence's whole padded K/V into DRAM before reading it again. The
compiler's paged-attention family (:mod:`~spyre_lab.compiler.paged_attention`) is one tiled kernel that
reads each cache block once through the block table and writes this step's keys and values into their
slots. This module only joins the op to it:

* Plan and timing: the launch shape (cache blocks and queries per sequence) picks the compiler's
  ``KernelSpec`` (:func:`~spyre_lab.compiler.paged_attention.paged_attention_spec`, planned once per shape);
  the device simulators time it (analytic mode).
* Launch: each layer keeps one :class:`~spyre_lab.runtime.programs.LoadedFamilyLaunch`, so a launch is the
  address patch of its correction area, as every compiled kernel's is.
* Numerics: :func:`~spyre_lab.compiler.paged_attention_numerics.paged_online_attention`, in the split-KV order
  the plan chose, after the kernel's own writes of this step's K/V into their cache slots.
* Loop bounds: the real kernel reads each sequence's length from DRAM when it runs. Here a spyre
  tensor's payload is host memory behind the modeled DRAM, so the launch reads the ``seq_query_lens``
  operand from the device tensor's storage (``host_view``) to pick the shape it times, with no modeled
  D2H: the device's own read of it is part of the kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spyre_lab.compiler.explain import KERNEL_FAMILY_EXPLAINERS, Explanation
from spyre_lab.compiler.paged_attention import (
    ADDRESS_SLOTS,
    OUTPUT_SLOTS,
    PagedAttentionSpec,
    describe,
    paged_attention_spec,
)
from spyre_lab.compiler.paged_attention import cache_info as cache_info
from spyre_lab.compiler.paged_attention_numerics import context_blocks, paged_online_attention
from spyre_lab.compiler.tiling_paged_attention import PagedShape
from spyre_lab.runtime.devices import get_device
from spyre_lab.runtime.launch import Operands
from spyre_lab.runtime.programs import LoadedFamilyKernel, LoadedFamilyLaunch
from spyre_lab.runtime.tensor import empty_spyre, host_view


@dataclass(frozen=True)
class PagedNumerics:
    """One layer's kernel numerics (``LoadedFamilyKernel.numerics``): the slot writes, then the attention."""

    num_kv_heads: int
    head_dim: int
    scale: float

    def __call__(self, spec: PagedAttentionSpec, operands: Operands) -> None:
        query, slots = operands["query"], operands["slot_mapping"]
        tokens, kv, d = query.shape[0], self.num_kv_heads, self.head_dim
        for cache, new in (("k_cache", operands["key"]), ("v_cache", operands["value"])):
            _write_slots(operands, cache, slots, new.reshape(tokens, kv, d))     # this step's slots, nothing else
        lens = operands["seq_query_lens"]
        out = paged_online_attention(query, operands["k_cache"], operands["v_cache"], operands["block_tables"],
                                     operands["query_index"], lens.select(1, 0), lens.select(1, 1), kv, self.scale,
                                     spec.chunks, tile_blocks=spec.plan.tile_blocks)
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
    """One layer's paged attention: the op's arguments -> the launch shape's spec -> one kernel launch."""

    layer: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float
    double_buffer: bool = True

    def __post_init__(self) -> None:
        numerics = PagedNumerics(self.num_kv_heads, self.head_dim, self.scale)
        self.kernel = LoadedFamilyKernel(f"paged attention L{self.layer}", ADDRESS_SLOTS, OUTPUT_SLOTS, numerics)
        self.loaded = LoadedFamilyLaunch(self.kernel)

    @property
    def name(self) -> str:
        return self.kernel.name

    @property
    def spec(self) -> PagedAttentionSpec | None:
        """The spec of this layer's last launch (None before the first)."""
        return self.kernel.spec

    def __call__(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, slot_mapping: torch.Tensor, block_tables: torch.Tensor,
                 query_index: torch.Tensor, seq_query_lens: torch.Tensor) -> torch.Tensor:
        index = query.device.index
        lens = host_view(seq_query_lens).tolist()          # the lengths the kernel reads from DRAM (see module doc)
        block_size = k_cache.shape[1]
        seqs = tuple((context_blocks(s - q, block_size), q) for s, q in lens)
        shape = PagedShape(self.num_heads, self.num_kv_heads, self.head_dim, block_size, seqs, k_cache.element_size())
        spec = paged_attention_spec(shape, get_device(index).config, self.double_buffer)
        out = empty_spyre((query.shape[0], self.num_heads * self.head_dim), None, query.dtype, index)
        self.loaded.launch(spec, {"query": query, "key": key, "value": value, "k_cache": k_cache,
                                  "v_cache": v_cache, "slot_mapping": slot_mapping, "block_tables": block_tables,
                                  "query_index": query_index, "seq_query_lens": seq_query_lens, "out": out})
        return out


_LAUNCHES: dict[tuple, PagedAttentionLaunch] = {}


def layer_launch(layer: int, num_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                 double_buffer: bool = True) -> PagedAttentionLaunch:
    """The launch of layer ``layer`` (made once per layer and shape of model)."""
    key = (layer, num_heads, num_kv_heads, head_dim, scale, double_buffer)
    found = _LAUNCHES.get(key)
    if found is None:
        found = _LAUNCHES[key] = PagedAttentionLaunch(layer, num_heads, num_kv_heads, head_dim, scale, double_buffer)
    return found


def explain() -> Explanation:
    """Each layer's paged-attention kernel as text: its last launch's shape, modeled time, DRAM bytes, plan."""
    lines = []
    for layer in sorted(_LAUNCHES.values(), key=lambda x: x.layer):
        if layer.spec is not None:
            first, *rest = describe(layer.spec)
            lines += [f"{layer.name}: {first}", *rest]
    return Explanation("\n".join(lines) or "no paged-attention kernel launched yet")


def _family_section() -> str:
    """`compiler.explain`'s section for this family: empty until some layer launched its kernel."""
    if not any(layer.spec is not None for layer in _LAUNCHES.values()):
        return ""
    text = "\n".join(f"  {line}" for line in explain().splitlines())
    return f"Paged-attention kernels (compiler.paged_attention), each layer's last launch:\n{text}"


KERNEL_FAMILY_EXPLAINERS.append(_family_section)
