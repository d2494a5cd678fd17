"""SpyreConfig: every hardware number the model uses, in one frozen place.

Why one dataclass: a learner changes a number (``cfg.replace(cores=8)``) and every layer above,
from the simulator to the compiler's cost model to the engine's stats, sees the same machine.
Each field names its source. "official" is an IBM product figure, "code" is a constant in the
open torch-spyre stack, "measured" is fitted to kernels timed on the card (torch-spyre's analytical
cost model, ``docs/source/compiler/cost_model.md``), "estimate" is ours, with the reasoning next to it.

Two named machines share every mechanism and differ only in numbers: ``measured`` (the card as it runs,
fitted to torch-spyre's hardware-fitted cost model; the default :data:`SPYRE` and what ``SpyreConfig()``
builds) and ``datasheet`` (the peak figures). ``SpyreConfig.preset("datasheet")`` or
``SPYRE_LAB_MACHINE=datasheet`` is one switch away; ``docs/fidelity.md`` shows how far each is from the
reference times, including the one-core softmax ladder neither machine meets (and why).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass

import torch

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

_DTYPE_BYTES = {
    torch.float16: 2,
    torch.bfloat16: 2,
    torch.float32: 4,
    torch.int32: 4,
    torch.int64: 8,
    torch.int8: 1,
    torch.uint8: 1,
    torch.bool: 1,
    torch.float8_e4m3fn: 1,
    torch.float8_e5m2: 1,
}


def dtype_bytes(dtype: torch.dtype) -> int:
    """Bytes per element of ``dtype`` (the device never stores complex or float64)."""
    try:
        return _DTYPE_BYTES[dtype]
    except KeyError:
        raise TypeError(
            f"dtype {dtype} has no Spyre device format; use float16 (the device dtype), "
            "bfloat16, float32, int8/int32/int64, bool or float8"
        ) from None


@dataclass(frozen=True)
class SpyreConfig:
    """Hardware numbers of one modeled Spyre card.

    Use :meth:`replace` for experiments: ``SPYRE.replace(cores=8, dram_bandwidth=100e9)``.
    """

    name: str = "measured"

    # --- compute ---------------------------------------------------------------------------
    # official: 32 cores per card (torch-spyre docs architecture/spyre_accelerator.md).
    cores: int = 32
    # official: 2 corelets per core, sharing the core's LX scratchpad.
    corelets_per_core: int = 2
    # docs: an 8x8 systolic PE array (the "PT" unit) per corelet.
    pe_rows: int = 8
    pe_cols: int = 8
    # estimate: fp16 MACs each PE does per cycle. 8 makes one corelet 8x8x8 = 512 MAC/cycle,
    # so 32 cores x 2 corelets x 512 MAC x 2 FLOP x 1.5 GHz = 98.304 TFLOP/s, the "DL16 peak"
    # constant of the torch-spyre work-division cost model (1.536 TMAC/s per core).
    pe_lanes: int = 8
    # estimate: fp16 elements one corelet's SFU (1-D vector unit) handles per cycle; ktir-cpu's
    # latency model uses 64-wide SIMD.
    sfu_lanes: int = 64
    # estimate: a transcendental (exp, rsqrt, sigmoid, ...) costs this many SFU passes
    # (ktir-cpu's latency model uses x4).
    transcendental_factor: int = 4
    # measured: the PT arrays sustain about 1140 MAC/ns per core on real matmuls against the datasheet's
    # 1536 (torch-spyre cost model, mac_peak_per_core_ns): 1140 / 1536 of the peak. datasheet: 1.0.
    pt_sustained_fraction: float = 1140 / 1536
    # estimate: not published. 1.5 GHz is the clock that turns the cost model's 98.304 TFLOP/s
    # into the documented array shape (see pe_lanes).
    clock_hz: float = 1.5e9

    # --- memory ----------------------------------------------------------------------------
    # official: 2 MB LX scratchpad SRAM per core, no cache.
    lx_bytes: int = 2 * MiB
    # code: the backend keeps 20% of LX for itself (DXP_LX_FRAC_AVAIL=0.2), so the planner may
    # use 80% = 1,677,721 bytes.
    lx_planner_fraction: float = 0.8
    # code: a stick is the 128-byte unit of every DRAM <-> LX transfer (BYTES_IN_STICK).
    stick_bytes: int = 128
    # official: up to 128 GB LPDDR5 per card, 16 GB of it for ECC.
    dram_bytes: int = 128 * GiB
    # code: the compiler's address map is 7 segments x 16 GiB = 112 GiB usable.
    dram_usable_bytes: int = 112 * GiB
    # measured: about 150 GB/s when traffic runs one way (read-only or write-only kernels), the card's
    # DRAM peak in torch-spyre's fitted cost model (bw_peak_gbps). datasheet: 204.8 GB/s (work_division.py).
    dram_bandwidth: float = 150e9
    # measured: about 105 GB/s = 0.7 x the peak when reads and writes are balanced: the shared bus turns
    # around between them (torch-spyre cost model, rw_turnaround_ns_per_byte, solved from a balanced copy).
    # The rate at any read/write mix follows, see dram_bandwidth_at(). datasheet: 1.0 (no turnaround).
    # A fraction, so that replace(dram_bandwidth=...) scales both rates.
    dram_balanced_fraction: float = 105 / 150
    # estimate: one core's DMA engine moves at most one stick per cycle (128 B x 1.5 GHz =
    # 192 GB/s), so a single core cannot quite saturate DRAM alone.
    core_dma_bytes_per_cycle: int = 128
    # code: at most 256 MB of one tensor may lie in one core's contiguous span.
    core_span_bytes: int = 256 * MiB
    # code: torch-spyre's matmul cost model lets up to 8 cores that load the same data share one
    # DRAM read (a broadcast); a load tagged ``share=g`` costs DRAM 1/min(g, 8) of its bytes.
    dram_broadcast_cores: int = 8

    # --- interconnect ----------------------------------------------------------------------
    # docs: bi-directional ring, 128 B/cycle in each direction.
    ring_bytes_per_cycle: int = 128
    # estimate: cycles for a ring hop to forward a transfer's head (router + wire), not published.
    ring_hop_cycles: int = 16
    # official: PCIe Gen5 x16 host link. estimate: 32 GT/s x 16 lanes x 128/130 = 63 GB/s raw per
    # direction; 80% of that after TLP/DMA descriptor overhead = 50 GB/s effective.
    pcie_bandwidth: float = 50e9
    # estimate: one DMA's fixed cost (doorbell, descriptor fetch, completion interrupt).
    pcie_latency_us: float = 2.0
    # --- card to card (estimates, not published: no peer link is published for Spyre) -------
    # estimate: a peer-to-peer DMA through a PCIe switch, one crossing per byte at 80 % of pcie_bandwidth.
    card_link_bandwidth: float = 40e9
    # estimate: one doorbell plus a DMA descriptor on each card, per message.
    card_link_latency_us: float = 3.0

    # --- host-side costs the runtime charges (all estimates, measured nowhere) --------------
    # enqueue of one JobPlan step on a stream (driver call, queue bookkeeping).
    host_launch_us: float = 8.0
    # program correction: fixed cost of the host callback plus a cost per patched address slot.
    host_correction_base_us: float = 4.0
    host_correction_per_slot_us: float = 0.25
    # "rebuild" dispatch: rebuilding the execution graph on the host costs this per graph node.
    host_rebuild_per_node_us: float = 40.0
    # device-side fixed cost to start one kernel bundle on all cores (program fetch, barrier).
    # measured: torch-spyre's cost model fits no fixed term to the profiler's kernel time (intercept ~0);
    # the host-side launch costs above stay. datasheet: 6000 cycles (4 us, an estimate): the softmax
    # study attributes its gap to the ideal speed-up to such a per-bundle overhead.
    kernel_launch_cycles: int = 0

    def __post_init__(self) -> None:
        positive_ints = ("cores", "corelets_per_core", "pe_rows", "pe_cols", "pe_lanes", "sfu_lanes",
                         "transcendental_factor", "stick_bytes", "core_dma_bytes_per_cycle", "dram_broadcast_cores",
                         "ring_bytes_per_cycle")
        for field in positive_ints:
            value = getattr(self, field)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"SpyreConfig.{field} must be a positive integer, got {value!r}")
        positive_floats = ("clock_hz", "dram_bandwidth", "pcie_bandwidth")
        for field in positive_floats:
            if not getattr(self, field) > 0:
                raise ValueError(f"SpyreConfig.{field} must be positive, got {getattr(self, field)!r}")
        non_negative = ("ring_hop_cycles", "pcie_latency_us", "host_launch_us", "host_correction_base_us",
                        "host_correction_per_slot_us", "host_rebuild_per_node_us", "kernel_launch_cycles")
        for field in non_negative:
            if getattr(self, field) < 0:
                raise ValueError(f"SpyreConfig.{field} must not be negative, got {getattr(self, field)!r}")
        if not 0 < self.pt_sustained_fraction <= 1:
            raise ValueError(f"SpyreConfig.pt_sustained_fraction must be in (0, 1], got {self.pt_sustained_fraction}")
        if not 0.5 < self.dram_balanced_fraction <= 1:
            raise ValueError(
                f"SpyreConfig.dram_balanced_fraction must be in (0.5, 1], got {self.dram_balanced_fraction}: turning "
                "the bus around cannot speed DRAM up, nor cost more than the transfers; 1 means no turnaround"
            )
        if self.stick_bytes & (self.stick_bytes - 1):
            raise ValueError(f"SpyreConfig.stick_bytes must be a power of two, got {self.stick_bytes}")
        if self.lx_bytes < self.stick_bytes:
            raise ValueError(
                f"SpyreConfig.lx_bytes ({self.lx_bytes}) is smaller than one stick ({self.stick_bytes} B); "
                "a core could not hold a single tile"
            )
        if not 0 < self.lx_planner_fraction <= 1:
            raise ValueError(f"SpyreConfig.lx_planner_fraction must be in (0, 1], got {self.lx_planner_fraction}")
        if not 0 < self.dram_usable_bytes <= self.dram_bytes:
            raise ValueError(
                f"SpyreConfig.dram_usable_bytes ({self.dram_usable_bytes}) must be positive and at most "
                f"dram_bytes ({self.dram_bytes})"
            )
        if self.core_span_bytes < self.stick_bytes:
            raise ValueError(f"SpyreConfig.core_span_bytes must hold at least one stick, got {self.core_span_bytes}")

    @classmethod
    def preset(cls, name: str) -> SpyreConfig:
        """A named machine: ``"measured"`` (the card as it runs, the default) or ``"datasheet"`` (peak numbers)."""
        return get_config(name)

    def replace(self, **changes: object) -> SpyreConfig:
        """A copy with some numbers changed, validated like the original."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"SpyreConfig has no field(s) {sorted(unknown)}")
        return dataclasses.replace(self, **changes)

    # --- derived numbers (never stored, so a replace() can't leave them stale) --------------
    @property
    def lx_budget_bytes(self) -> int:
        """LX bytes the compiler's scratchpad planner may hand out per core (1,677,721 by default)."""
        return int(self.lx_bytes * self.lx_planner_fraction)

    @property
    def macs_per_cycle_per_core(self) -> int:
        return self.corelets_per_core * self.pe_rows * self.pe_cols * self.pe_lanes

    @property
    def sustained_macs_per_cycle_per_core(self) -> float:
        """MACs one core's PT arrays complete per cycle on a real matmul (the peak times ``pt_sustained_fraction``)."""
        return self.macs_per_cycle_per_core * self.pt_sustained_fraction

    @property
    def dram_turnaround_cycles_per_byte(self) -> float:
        """Extra DRAM cycles per byte of read/write overlap: 0 when the balanced rate equals the peak.

        With reads ``R`` and writes ``W`` in flight, DRAM takes ``(R + W) / peak + turnaround * min(R, W)``:
        one-way traffic runs at the peak, balanced traffic at ``dram_balanced_bandwidth``.
        """
        return (2 / self.dram_balanced_bandwidth - 2 / self.dram_bandwidth) * self.clock_hz

    @property
    def dram_balanced_bandwidth(self) -> float:
        """DRAM bytes per second when reads and writes are in flight alike (105 GB/s on ``measured``)."""
        return self.dram_bandwidth * self.dram_balanced_fraction

    def dram_bytes_per_cycle_at(self, read: float, write: float) -> float:
        """DRAM bytes per cycle the whole card moves when ``read`` and ``write`` (any units) share it."""
        if read <= 0 or write <= 0:
            return self.dram_bytes_per_cycle
        overlap = min(read, write) / (read + write)
        return 1.0 / (1.0 / self.dram_bytes_per_cycle + self.dram_turnaround_cycles_per_byte * overlap)

    def dram_bandwidth_at(self, read: float, write: float) -> float:
        """DRAM bytes per second at a read/write mix (150 GB/s one way, 105 GB/s balanced on ``measured``)."""
        return self.dram_bytes_per_cycle_at(read, write) * self.clock_hz

    @property
    def sfu_elems_per_cycle_per_core(self) -> int:
        return self.corelets_per_core * self.sfu_lanes

    @property
    def peak_flops(self) -> float:
        """fp16 FLOP/s of the whole card (2 FLOP per MAC)."""
        return 2 * self.macs_per_cycle_per_core * self.cores * self.clock_hz

    @property
    def dram_bytes_per_cycle(self) -> float:
        return self.dram_bandwidth / self.clock_hz

    @property
    def ridge_flop_per_byte(self) -> float:
        """Arithmetic intensity where the card turns from memory- to compute-bound."""
        return self.peak_flops / self.dram_bandwidth

    def elems_per_stick(self, dtype: torch.dtype) -> int:
        """Elements of ``dtype`` in one stick: 64 fp16, 32 fp32, 128 int8."""
        return self.stick_bytes // dtype_bytes(dtype)

    def cycles_to_us(self, cycles: float) -> float:
        return cycles / self.clock_hz * 1e6

    def us_to_cycles(self, us: float) -> float:
        return us * 1e-6 * self.clock_hz

    def sticks(self, nbytes: int) -> int:
        """Whole sticks needed to hold ``nbytes``."""
        return math.ceil(nbytes / self.stick_bytes)

    def describe(self) -> str:
        """A short human summary for reports and notebooks."""
        return (
            f"{self.name}: {self.cores} cores x {self.corelets_per_core} corelets "
            f"({self.pe_rows}x{self.pe_cols} PE, {self.macs_per_cycle_per_core} MAC/cycle/core), "
            f"{self.clock_hz / 1e9:.2f} GHz (estimate), peak {self.peak_flops / 1e12:.1f} TFLOP/s fp16, "
            f"LX {self.lx_bytes // KiB} KiB/core (planner {self.lx_budget_bytes:,} B), "
            f"DRAM {self.dram_usable_bytes // GiB} GiB usable @ {self.dram_bandwidth / 1e9:.1f} GB/s one way, "
            f"{self.dram_balanced_bandwidth / 1e9:.1f} GB/s read+write, PT sustains {self.pt_sustained_fraction:.0%}, "
            f"ring {self.ring_bytes_per_cycle} B/cycle/dir, PCIe {self.pcie_bandwidth / 1e9:.0f} GB/s (estimate)"
        )


MEASURED = SpyreConfig()
"""The Spyre card as it runs (preset ``measured``): DRAM, PT and launch numbers fitted to measured kernels."""

DATASHEET = SpyreConfig(name="datasheet", dram_bandwidth=204.8e9, dram_balanced_fraction=1.0,
                         pt_sustained_fraction=1.0, kernel_launch_cycles=6000)
"""The Spyre card by its peak numbers (preset ``datasheet``): 204.8 GB/s either way, the full PT peak, a 4 us launch."""

PRESETS: dict[str, SpyreConfig] = {"measured": MEASURED, "datasheet": DATASHEET}
MACHINES: tuple[str, ...] = tuple(PRESETS)

MACHINE_ENV = "SPYRE_LAB_MACHINE"
"""Environment variable naming the preset every layer defaults to (``measured`` when unset); read once at import."""


def _default_machine() -> SpyreConfig:
    name = os.environ.get(MACHINE_ENV) or "measured"
    if name not in PRESETS:
        raise ValueError(f"{MACHINE_ENV}={name!r} names no SpyreConfig preset; use one of {list(MACHINES)} or unset it")
    return PRESETS[name]


SPYRE = _default_machine()
"""The card every layer uses unless told otherwise: ``measured``, or the preset ``$SPYRE_LAB_MACHINE`` names."""


def get_config(name: str = "measured") -> SpyreConfig:
    """A preset by name; the error lists the presets that exist."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"no SpyreConfig preset {name!r}; presets: {sorted(PRESETS)}") from None
