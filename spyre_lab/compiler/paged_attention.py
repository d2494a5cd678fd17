"""Paged attention as a compiler kernel family: the :class:`KernelSpec` of one launch shape.

A fused kernel of a Program is planned once, at compile time, for the shapes of its graph. Paged attention
cannot be: the work of a launch depends on how many cache blocks each sequence reads this step, which the
card learns only when the kernel reads ``seq_query_lens``. So the compiler plans it per launch shape
(:class:`~spyre_lab.compiler.tiling_paged_attention.PagedShape`: cache blocks and queries per sequence) and
keeps the plans: a decode step re-plans only when some sequence crosses into a new block.

:func:`paged_attention_spec` is that entry. It plans with the paged tiler
(:func:`~spyre_lab.compiler.tiling_paged_attention.plan_paged_attention`) and wraps the plan as a
:class:`PagedAttentionSpec`, a ``KernelSpec`` like every planned kernel: per-core tile programs the device
simulators time (``spec.simulate``), an LX plan, a work division, and the DRAM operands the runtime patches
at launch (``address_slots``: the step's queries, keys and values, both KV caches, the slot mapping, block
tables, query index, per-sequence lengths and the output). The caches are operands written in place, so
they never cross PCIe.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from spyre_lab.compiler.kernel_spec import KernelSpec
from spyre_lab.compiler.tiling_paged_attention import PagedPlan, PagedShape, plan_paged_attention
from spyre_lab.compiler.work_division import WorkDivision
from spyre_lab.device.config import SpyreConfig

RULE = "attention"
"""The fusion rule a paged-attention kernel belongs to (switching it off runs attention as eager ops)."""

KERNEL_NAME = "paged attention"
"""Every launch shape's kernel name: the per-core events of its simulation carry it."""

ADDRESS_SLOTS = ("query", "key", "value", "k_cache", "v_cache", "slot_mapping", "block_tables", "query_index",
                 "seq_query_lens", "out")
OUTPUT_SLOTS = ("k_cache", "v_cache", "out")
"""The slots the kernel writes: this step's K/V into the caches, and the attention output."""

CACHE_ENTRIES = 512
"""Launch shapes whose spec (and so its simulation) is kept, least recently used dropped first."""


@dataclass
class PagedAttentionSpec(KernelSpec):
    """The spec of one paged-attention launch shape: a ``KernelSpec`` plus the tiler's plan (whose split-KV
    chunks and key-tile width the numerics follow) and what the launch reads."""

    plan: PagedPlan | None = field(default=None, repr=False)
    blocks_read: int = 0
    kv_bytes: int = 0

    @property
    def shape(self) -> PagedShape:
        return self.plan.shape

    @property
    def chunks(self) -> list[list[int]]:
        """Per sequence, the cache blocks where its split-KV chunks start (the numerics merge in this order)."""
        if self._chunks is None:
            self._chunks = self.plan.block_chunks()
        return self._chunks

    @property
    def launch_args(self) -> dict[str, Any]:
        """What a launch's trace event says beyond its time: blocks and K/V bytes read, whether it split KV."""
        return {"blocks_read": self.blocks_read, "kv_bytes": self.kv_bytes, "split_kv": self.plan.split_kv}

    def __post_init__(self) -> None:
        self._chunks: list[list[int]] | None = None


def _division(plan: PagedPlan) -> WorkDivision:
    """The plan's work division in the compiler's terms: work items (a (sequence, KV head) unit's query tile,
    or one split-KV chunk of it) over the busy cores."""
    cores = tuple(plan.kernel.active_cores)
    reason = plan.reason.split("; ")[-1] if plan.reason else ""
    return WorkDivision({"work items": max(1, len(cores))}, cores or (0,), "paged (sequence, KV head) units", reason)


def _build(shape: PagedShape, cfg: SpyreConfig, double_buffer: bool) -> PagedAttentionSpec:
    plan = plan_paged_attention(shape, cfg, double_buffer, name=KERNEL_NAME)
    blocks = sum(nb for nb, q in shape.seqs if q > 0) * shape.kv_heads
    return PagedAttentionSpec(
        name=KERNEL_NAME, rule=RULE, ops=["paged_attention"], division=_division(plan), lx_plan=plan.lx_plan,
        tile_kernel=plan.kernel, address_slots=list(ADDRESS_SLOTS), slices=[], cfg=cfg,
        dims={"heads": shape.heads, "kv_heads": shape.kv_heads, "head_dim": shape.head_dim,
              "block_size": shape.block_size, "sequences": len(shape.seqs)},
        tiles={"query_rows": plan.query_rows, "key_blocks": plan.tile_blocks, "fresh_rows": plan.fresh_rows},
        roles={s: "OUTPUT" for s in OUTPUT_SLOTS}, plan=plan, blocks_read=blocks, kv_bytes=shape.kv_bytes())


_SPECS: OrderedDict[tuple, PagedAttentionSpec] = OrderedDict()


def paged_attention_spec(shape: PagedShape, cfg: SpyreConfig, double_buffer: bool = True) -> PagedAttentionSpec:
    """The compiler's kernel for one paged-attention launch shape on ``cfg``, planned once and kept: every layer
    and every step with the same shape shares one spec, and so one simulation (``spec.simulate`` caches it)."""
    key = (shape, cfg, double_buffer)
    spec = _SPECS.get(key)
    if spec is None:
        spec = _SPECS[key] = _build(shape, cfg, double_buffer)
        while len(_SPECS) > CACHE_ENTRIES:
            _SPECS.popitem(last=False)
    else:
        _SPECS.move_to_end(key)
    return spec


def cache_info() -> dict[str, int]:
    """How many launch shapes are planned (every other launch reused one of them)."""
    return {"shapes": len(_SPECS)}


def describe(spec: PagedAttentionSpec, mode: str = "analytic") -> list[str]:
    """A launch shape's spec as lines: modeled time and bound, cores, blocks and bytes read, shape, plan."""
    sim = spec.simulate(mode)
    shape = spec.shape
    return [f"{sim.time_us:.2f} us modeled ({sim.bottleneck}-bound) on {len(sim.active_cores)} cores; "
            f"{spec.blocks_read} cache blocks read ({shape.block_size} tokens each), {spec.kv_bytes:,} B of K/V, "
            f"{int(sim.dram_bytes):,} B from DRAM in all",
            f"  shape: (cache blocks, queries) per sequence {list(shape.seqs)}",
            f"  plan: {spec.plan.reason}"]
