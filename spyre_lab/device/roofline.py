"""Roofline time of one kernel: the slower of moving its DRAM bytes and doing its work, plus the launch.

The simulator times a kernel tile by tile (``sim_costs``); a kernel with no tile program (an eager op
the compiler did not take, an in-place write-back copy) is timed by this bound instead, and labelled
so. Work runs on the PE arrays (``"pt"``: fp16 FLOPs at ``peak_flops``) or on the SFUs (``"sfu"``:
element passes at ``sfu_elems_per_cycle_per_core`` per core and cycle) of every core at once.
"""

from __future__ import annotations

from typing import Literal

from spyre_lab.device.config import SpyreConfig

Unit = Literal["pt", "sfu"]


def roofline_us(nbytes: int, work: float, unit: Unit, cfg: SpyreConfig) -> tuple[float, dict[str, object]]:
    """Modeled microseconds of a kernel moving ``nbytes`` through DRAM and doing ``work`` on ``unit``
    (FLOPs on "pt", element passes on "sfu"), with what bound it: ``(time_us, details)``."""
    if unit not in ("pt", "sfu"):
        raise ValueError(f"unit must be 'pt' (PE arrays) or 'sfu' (vector units), got {unit!r}")
    memory_s = nbytes / cfg.dram_bandwidth
    if unit == "pt":
        compute_s = work / cfg.peak_flops
    else:
        compute_s = work / (cfg.sfu_elems_per_cycle_per_core * cfg.cores * cfg.clock_hz)
    launch_us = cfg.cycles_to_us(cfg.kernel_launch_cycles)
    time_us = max(memory_s, compute_s) * 1e6 + launch_us
    bound = "memory" if memory_s >= compute_s else "compute"
    return time_us, {"bytes": nbytes, "flops": work, "bound": bound, "launch_us": launch_us}
