"""Kernel records: the per-kernel numbers views plot and tabulate, read from a Program or its saved JSON.

One record per launch (device kernel or host fallback): name, fusion rule, ops, FLOPs, the DRAM bytes
DRAM actually serves (broadcast loads counted once per group), modeled time and bottleneck. Live
programs are simulated in the mode asked for; a saved program carries the numbers of the mode it was
saved with (``Program.to_json`` writes them under ``modeled``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spyre_lab.viz.sources import is_host, is_timed


@dataclass(frozen=True)
class KernelRecord:
    """One launch's modeled numbers (times in modeled µs)."""

    index: int
    name: str
    rule: str
    ops: tuple[str, ...]
    host: bool
    flops: int = 0
    dram_bytes: float = 0.0
    bytes_loaded: int = 0
    bytes_stored: int = 0
    time_us: float | None = None
    launch_us: float = 0.0
    bottleneck: str = ""
    mode: str = ""

    @property
    def intensity(self) -> float:
        """FLOP per DRAM byte (0 when the kernel moves nothing)."""
        return self.flops / self.dram_bytes if self.dram_bytes else 0.0

    @property
    def flops_per_s(self) -> float:
        return self.flops / (self.time_us * 1e-6) if self.time_us else 0.0


def kernel_records(source: Any, mode: str | None = None) -> list[KernelRecord]:
    """Records of every launch of a Program (simulated in ``mode``) or of a saved program dict."""
    if isinstance(source, dict):
        out = []
        for i, entry in enumerate(source["launches"]):
            m = entry.get("modeled") or {}
            out.append(KernelRecord(i, entry["name"], entry.get("rule", ""), tuple(entry.get("ops", ())),
                                    bool(entry.get("host")), int(m.get("flops", 0)), float(m.get("dram_bytes", 0)),
                                    int(m.get("bytes_loaded", 0)), int(m.get("bytes_stored", 0)), m.get("time_us"),
                                    float(m.get("launch_us", 0.0)), str(m.get("bottleneck", "")),
                                    str(m.get("mode", ""))))
        return out
    mode = mode or source.options.timing
    out = []
    for i, (launch, kernel) in enumerate(zip(source.launches, source.kernels)):
        ops = tuple(n.op for n in kernel.nodes)
        host = is_host(launch)
        if not is_timed(launch):
            out.append(KernelRecord(i, launch.name, kernel.rule, ops, host))
            continue
        sim = launch.simulate(mode)
        out.append(KernelRecord(i, launch.name, kernel.rule, ops, host, sim.flops, sim.dram_bytes, sim.bytes_loaded,
                                sim.bytes_stored, sim.time_us, sim.launch_us, sim.bottleneck, mode))
    return out
