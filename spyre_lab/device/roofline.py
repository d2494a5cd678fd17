"""Roofline time of one kernel: the slower of moving its DRAM bytes and doing its work, plus the launch.

The simulator times a kernel tile by tile (``sim_costs``); a kernel with no tile program (an eager op
the compiler did not take, an in-place write-back copy) is timed by this bound instead, and labelled
so. Work runs on the PE arrays (``"pt"``: fp16 FLOPs at the sustained PT rate,
``peak_flops * pt_sustained_fraction``) or on the SFUs (``"sfu"``: element passes at
``sfu_elems_per_cycle_per_core`` per core and cycle) of every core at once. DRAM runs at the rate of the
kernel's read/write mix (``cfg.dram_bandwidth_at``), as in the simulators: a copy that reads and writes
alike pays the bus turnaround a read-only kernel does not.
"""

from __future__ import annotations

from typing import Literal

from spyre_lab.device.config import SpyreConfig

Unit = Literal["pt", "sfu"]


def roofline_us(read_bytes: int, write_bytes: int, work: float, unit: Unit,
                cfg: SpyreConfig) -> tuple[float, dict[str, object]]:
    """Modeled microseconds of a kernel reading ``read_bytes`` from and writing ``write_bytes`` to DRAM
    and doing ``work`` on ``unit`` (FLOPs on "pt", element passes on "sfu"), with what bound it:
    ``(time_us, details)``."""
    if unit not in ("pt", "sfu"):
        raise ValueError(f"unit must be 'pt' (PE arrays) or 'sfu' (vector units), got {unit!r}")
    if read_bytes < 0 or write_bytes < 0:
        raise ValueError(f"read_bytes and write_bytes must not be negative, got {read_bytes} and {write_bytes}")
    nbytes = read_bytes + write_bytes
    memory_s = nbytes / cfg.dram_bandwidth_at(read_bytes, write_bytes)
    if unit == "pt":
        compute_s = work / (cfg.peak_flops * cfg.pt_sustained_fraction)
    else:
        compute_s = work / (cfg.sfu_elems_per_cycle_per_core * cfg.cores * cfg.clock_hz)
    launch_us = cfg.cycles_to_us(cfg.kernel_launch_cycles)
    time_us = max(memory_s, compute_s) * 1e6 + launch_us
    bound = "memory" if memory_s >= compute_s else "compute"
    return time_us, {"bytes": nbytes, "read_bytes": read_bytes, "write_bytes": write_bytes, "flops": work,
                     "bound": bound, "launch_us": launch_us}
