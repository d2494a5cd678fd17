"""What one tile op costs on one core, in cycles: the numbers both simulator modes share.

Kept apart from the simulators so the event and analytic modes cannot drift apart on the basic
rates, and so a learner can ask "what does this one op cost?" directly.

* PT (matmul): ``ceil(m' * n' * k' / sustained_macs_per_cycle_per_core)`` where each dim is padded up to
  the PE array's shape (rows to ``pe_rows``, columns to ``pe_cols``, depth to ``pe_lanes``), at the
  rate the arrays sustain (``pt_sustained_fraction`` of the peak). The
  padding is the shape-efficiency term: an array that is fed 1 row (a decode GEMV) does the work
  of 8, which is why splitting M down to a few rows per core starves the PT unit.
* SFU: ``ceil(elements / sfu_elems_per_cycle_per_core)``; a transcendental (``special``) op costs
  ``transcendental_factor`` passes.
* Ring send: ``nbytes / ring_bytes_per_cycle + hops * ring_hop_cycles``.
* DRAM (load, store): no fixed cost; their time depends on how many transfers share DRAM and on
  how reads and writes mix (the bus turns around between them), see :func:`dram_rate`.
"""

from __future__ import annotations

from dataclasses import dataclass

from spyre_lab.device.config import SpyreConfig
from spyre_lab.device.isa import OpKind

LOAD, PT, SFU, STORE, RING, RECV = range(6)
"""Unit indices. ``RECV`` is not a unit: a posted receive occupies LX but no engine."""

UNIT_NAMES: tuple[str, ...] = ("load", "pt", "sfu", "store", "ring")

UNIT_INDEX: dict[OpKind, int] = {
    OpKind.LOAD: LOAD,
    OpKind.MATMUL: PT,
    OpKind.VECTOR: SFU,
    OpKind.SPECIAL: SFU,
    OpKind.STORE: STORE,
    OpKind.RING_SEND: RING,
    OpKind.RING_RECV: RECV,
}


def _pad(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def matmul_cycles(m: int, n: int, k: int, cfg: SpyreConfig) -> float:
    """PT cycles for an ``m x n x k`` tile matmul: whole cycles at the peak (dims padded to the PE array
    shape), stretched by the fraction of the peak the arrays sustain."""
    if min(m, n, k) <= 0:
        return 0
    work = _pad(m, cfg.pe_rows) * _pad(n, cfg.pe_cols) * _pad(k, cfg.pe_lanes)
    return -(-work // cfg.macs_per_cycle_per_core) / cfg.pt_sustained_fraction


def sfu_cycles(elements: int, cfg: SpyreConfig, transcendental: bool = False) -> int:
    """SFU cycles for one pass over ``elements`` (times ``transcendental_factor`` for exp, rsqrt, ...)."""
    passes = -(-elements // cfg.sfu_elems_per_cycle_per_core)
    return passes * cfg.transcendental_factor if transcendental else passes


def ring_cycles(nbytes: int, hops: int, cfg: SpyreConfig) -> float:
    """Cycles a ring send occupies its sender: serialization plus per-hop forwarding latency."""
    return nbytes / cfg.ring_bytes_per_cycle + hops * cfg.ring_hop_cycles


def dram_rate(reads_in_flight: float, writes_in_flight: float, cfg: SpyreConfig) -> float:
    """Bytes per cycle each in-flight DRAM transfer gets: a fair share of DRAM, capped by one DMA engine.

    DRAM's own rate depends on the mix: ``cfg.dram_bytes_per_cycle_at(reads, writes)`` (the peak one way,
    ``dram_balanced_bandwidth`` when reads and writes are in flight alike). Counts may be fractional: a
    load broadcast to ``share`` cores counts as ``1/share`` of a transfer.
    """
    transfers = reads_in_flight + writes_in_flight
    if transfers <= 0:
        raise ValueError(f"dram_rate needs at least one transfer in flight, got {transfers}")
    return min(float(cfg.core_dma_bytes_per_cycle), cfg.dram_bytes_per_cycle_at(reads_in_flight, writes_in_flight)
               / transfers)


def fixed_cycles(kind: OpKind, m: int, n: int, k: int, elements: int, nbytes: int, hops: int,
                 cfg: SpyreConfig) -> float:
    """Cycles of an op whose time does not depend on other traffic (PT, SFU, ring send); 0 otherwise."""
    if kind is OpKind.MATMUL:
        return matmul_cycles(m, n, k, cfg)
    if kind is OpKind.VECTOR:
        return sfu_cycles(elements, cfg)
    if kind is OpKind.SPECIAL:
        return sfu_cycles(elements, cfg, transcendental=True)
    if kind is OpKind.RING_SEND:
        return ring_cycles(nbytes, hops, cfg)
    return 0.0


def check_capacity(lx_capacity: int | None, cfg: SpyreConfig) -> int:
    """The LX bytes per core the simulation may use (``cfg.lx_bytes`` unless overridden)."""
    if lx_capacity is None:
        return cfg.lx_bytes
    if not isinstance(lx_capacity, int) or lx_capacity <= 0:
        raise ValueError(f"lx_capacity must be a positive number of bytes (or None for cfg.lx_bytes), "
                         f"got {lx_capacity!r}")
    return lx_capacity



@dataclass
class EngineRun:
    """Raw output of one simulator engine, in cycles, before :class:`SimResult` turns it into microseconds."""

    makespan: float
    """Cycles from kernel start (after launch) to the end of the last op."""
    busy: dict[tuple[int, int], float]
    """(core, unit index) -> cycles that unit was busy."""
    compute_busy: dict[int, float]
    """core -> cycles during which its PT or its SFU (or both) was busy."""
    lx_peak: dict[int, int]
    bytes_loaded: int
    bytes_stored: int
    ring_bytes: int
    flops: int
    macs: int
    matmul_cores: int
    dram_bytes: float = 0.0
    """Bytes DRAM itself served: loads and stores, with a broadcast load counted once per group."""
    events: list[tuple[int, int, str, float, float, dict]] | None = None
    """(core, unit index, name, start cycle, duration cycles, args) per trace event, when asked for."""
