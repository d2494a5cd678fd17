"""Kernel-level measurements for the claims: one small graph through ``compile_graph``, timed by the simulator.

Every number comes from the compiler's own plan of a real graph (traced on meta tensors, so nothing is
allocated) and the analytic simulator's time of each planned kernel, launch included.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from spyre_lab.compiler import CompileOptions, compile_graph
from spyre_lab.device.config import SPYRE, SpyreConfig


@dataclass(frozen=True)
class KernelMeasure:
    """A compiled graph on the model: time, kernels, how busy the cores were, what bounds it."""

    time_us: float
    kernels: int
    utilization: float          # mean over all cores and the whole time of the fraction a core computes
    cores_used: int             # most cores any kernel of the graph ran on
    bottleneck: str             # the slowest kernel's bottleneck class (memory / compute / ...)
    splits: str                 # the slowest kernel's work division

    def to_dict(self) -> dict[str, float | int | str]:
        return dict(self.__dict__)


def measure(fn: Callable[..., torch.Tensor], shapes: Sequence[tuple[int, ...]], options: CompileOptions,
            cfg: SpyreConfig = SPYRE) -> KernelMeasure:
    """Compile ``fn`` for fp16 inputs of ``shapes`` and time every kernel (analytic simulator)."""
    inputs = [torch.empty(s, dtype=torch.float16, device="meta") for s in shapes]
    program = compile_graph(fn, inputs, options, cfg)
    specs = [k for k in program.launches if hasattr(k, "simulate")]
    if len(specs) != len(program.launches):
        missing = [k.name for k in program.launches if not hasattr(k, "simulate")]
        raise RuntimeError(f"{fn.__name__}: kernels {missing} have no tile plan, so the graph has no modeled time")
    sims = [s.simulate() for s in specs]
    total = sum(r.time_us for r in sims)
    busy = sum(sum(r.core_utilization.values()) * r.time_us for r in sims)
    slowest = max(range(len(sims)), key=lambda i: sims[i].time_us)
    splits = " ".join(f"{d}{n}" for d, n in specs[slowest].division.splits.items() if n > 1) or "1 core"
    return KernelMeasure(total, len(specs), busy / (cfg.cores * total) if total else 0.0,
                         max(len(s.tile_kernel.active_cores) for s in specs), str(sims[slowest].bottleneck), splits)


def matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x @ w


def softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def swiglu_mlp(x: torch.Tensor, wg: torch.Tensor, wu: torch.Tensor, wd: torch.Tensor) -> torch.Tensor:
    return (torch.nn.functional.silu(x @ wg) * (x @ wu)) @ wd
