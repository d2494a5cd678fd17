"""Which conclusions survive the unpublished numbers: every claim's ratio across plausible device parameters.

The card's host costs, kernel launch cost, clock, DRAM bandwidth, DRAM broadcast and PCIe link are
estimates (``SpyreConfig`` says so field by field). A sweep varies each one across a plausible range with the
others at their defaults, then all of them at once over a seeded random sample, and reports per claim the
range of its ratio and a verdict: *robust* when the effect keeps its direction everywhere and its size
stays within a factor of two of the default's, else *depends on X*, naming the parameter whose one-at-a-time
range moves the ratio most.

The kernel claims are recompiled and simulated under every configuration (real planner, real simulator).
The engine claims re-time the recorded 8B steps (:mod:`~spyre_lab.studies.retime`) with the configuration's
host, PCIe and launch costs. Configurations run on Dask (:mod:`~spyre_lab.studies.sweep_runner`),
in parallel worker processes, each result cached under the source fingerprint.
"""

from __future__ import annotations

import hashlib
import os
import random
from dataclasses import dataclass
from typing import Any

from spyre_lab.compiler import CompileOptions
from spyre_lab.device.config import SPYRE, SpyreConfig
from spyre_lab.studies.sweep_runner import sweep

SWEEP_RANGES: dict[str, tuple[float, ...]] = {
    "host_rebuild_per_node_us": (10.0, 20.0, 40.0, 80.0, 160.0),
    "host_launch_us": (2.0, 4.0, 8.0, 16.0, 32.0),
    "kernel_launch_cycles": (1500, 3000, 6000, 12000, 24000),
    "clock_hz": (1.0e9, 1.25e9, 1.5e9, 1.75e9, 2.0e9),
    "dram_bandwidth": (102.4e9, 153.6e9, 204.8e9, 256.0e9, 307.2e9),
    "dram_broadcast_cores": (1, 2, 4, 8, 16),
    "pcie_bandwidth": (16e9, 25e9, 50e9, 63e9),
    "pcie_latency_us": (0.5, 1.0, 2.0, 5.0, 10.0),
}
"""Plausible range of every unpublished parameter (the default is one of the values)."""

RANDOM_SAMPLES = 80
SEED = 0
MEASURED_ON = {"matmul": "qkv_proj 1024x4096x6144, naive vs planned",
               "softmax": "512x1024 on 1 core, no LX planning vs every step",
               "mlp": "1 row, unfused vs the scheduler's choice",
               "prefill": "the recorded 8B prefill steps, all off vs all on, re-timed",
               "decode": "the recorded 8B decode steps, all off vs all on, re-timed"}
"""What each claim's sweep ratio is measured on (a representative subset of the claim's full measurement)."""
KERNEL_FIELDS = ("kernel_launch_cycles", "clock_hz", "dram_bandwidth", "dram_broadcast_cores")
"""Swept parameters the kernel claims depend on."""
HOST_FIELDS = tuple(k for k in SWEEP_RANGES if k not in KERNEL_FIELDS)
"""Swept parameters that act only on the engine's host side: the kernel claims do not read them."""


def configurations(samples: int = RANDOM_SAMPLES, seed: int = SEED) -> list[tuple[str, dict[str, float]]]:
    """(label, changes to SpyreConfig) for every point: one parameter at a time, then random combinations."""
    points: list[tuple[str, dict[str, float]]] = [("default", {})]
    for name, values in SWEEP_RANGES.items():
        points += [(f"{name}={v:g}", {name: v}) for v in values if v != getattr(SPYRE, name)]
    rng = random.Random(seed)
    for i in range(samples):
        points.append((f"random {i}", {name: rng.choice(values) for name, values in SWEEP_RANGES.items()}))
    return points


def kernel_ratios(cfg: SpyreConfig) -> dict[str, float]:
    """The kernel claims' ratios (before / after) under ``cfg``, on a representative subset of their shapes."""
    from spyre_lab.studies.claims import SOFTMAX_LADDER, SOFTMAX_SHAPE, granite_matmuls
    from spyre_lab.studies.granite8b import GRANITE_3_3_8B, PREFILL_TOKENS
    from spyre_lab.studies.kernels import matmul, measure, softmax, swiglu_mlp

    naive, planned = CompileOptions(work_division="naive"), CompileOptions()
    before = after = 0.0
    for name, m, k, n in granite_matmuls(PREFILL_TOKENS):
        if name == "qkv_proj":
            before += measure(matmul, [(m, k), (k, n)], naive, cfg).time_us
            after += measure(matmul, [(m, k), (k, n)], planned, cfg).time_us
    one = cfg.replace(cores=1)
    s0 = measure(softmax, [SOFTMAX_SHAPE], CompileOptions(**SOFTMAX_LADDER[0][1]), one).time_us
    s1 = measure(softmax, [SOFTMAX_SHAPE], CompileOptions(**SOFTMAX_LADDER[-1][1]), one).time_us
    c = GRANITE_3_3_8B
    shapes = [(1, c.hidden_size), (c.hidden_size, c.intermediate_size), (c.hidden_size, c.intermediate_size),
              (c.intermediate_size, c.hidden_size)]
    m0 = measure(swiglu_mlp, shapes, CompileOptions().without("mlp"), cfg).time_us
    m1 = measure(swiglu_mlp, shapes, CompileOptions(), cfg).time_us
    return {"matmul": before / after, "softmax": s0 / s1, "mlp": m0 / m1}


class ClaimRatios:
    """The sweep's study: every claim's ratio at one configuration (a picklable callable for ``sweep``).

    The kernel claims are recompiled under the configuration's kernel fields (remembered per process, since
    many configurations share them); the engine claims re-time ``logs``, which maps an engine claim to its
    (all-off, all-on) recorded steps, under the full configuration."""

    def __init__(self, logs: dict[str, Any], recorded_on: SpyreConfig = SPYRE) -> None:
        self.logs, self.recorded_on = logs, recorded_on      # the machine the logs were recorded on travels along
        digest = hashlib.sha256(f"{sorted(logs.items())!r}|{recorded_on!r}".encode()).hexdigest()[:16]
        self.cache_key = f"ClaimRatios:{digest}"
        self._kernels: dict[str, dict[str, float]] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"logs": self.logs, "recorded_on": self.recorded_on, "cache_key": self.cache_key, "_kernels": {}}

    def __call__(self, cfg: SpyreConfig) -> dict[str, float]:
        from spyre_lab.studies.retime import retime_extended

        kernel_cfg = cfg.replace(**{k: getattr(self.recorded_on, k) for k in HOST_FIELDS})
        key = repr(kernel_cfg)                                # configurations that differ only on the host share it
        if key not in self._kernels:
            self._kernels[key] = kernel_ratios(kernel_cfg)
        ratios = dict(self._kernels[key])
        base = self.recorded_on
        for claim, (before, after) in self.logs.items():
            ratios[claim] = retime_extended(before, base, cfg)[0] / retime_extended(after, base, cfg)[0]
        return ratios


@dataclass
class SweepResult:
    points: list[dict[str, Any]]

    def ratios(self, claim: str) -> list[float]:
        return [p["ratios"][claim] for p in self.points if claim in p["ratios"]]

    def verdicts(self) -> dict[str, dict[str, Any]]:
        default = next(p for p in self.points if p["label"] == "default")["ratios"]
        out = {}
        for claim, base in default.items():
            values = self.ratios(claim)
            lo, hi = min(values), max(values)
            same_direction = all((v > 1) == (base > 1) for v in values)
            stable = all(base / 2 <= v <= base * 2 for v in values)
            spread = {}
            for name in SWEEP_RANGES:
                own = [p["ratios"][claim] for p in self.points
                       if list(p["changes"]) == [name] or p["label"] == "default"]
                spread[name] = max(own) - min(own)
            driver = max(spread, key=spread.get)
            if same_direction and stable:
                verdict = f"robust: {lo:.2f}x to {hi:.2f}x (default {base:.2f}x)"
            else:
                flips = "" if same_direction else ", and the effect reverses somewhere"
                verdict = f"depends on {driver}: {lo:.2f}x to {hi:.2f}x (default {base:.2f}x){flips}"
            out[claim] = {"default": base, "min": lo, "max": hi, "same_direction": same_direction,
                          "driver": driver, "verdict": verdict, "measured_on": MEASURED_ON.get(claim, "")}
        return out


def run_sweep(logs: dict[str, Any], samples: int = RANDOM_SAMPLES, workers: int | None = None,
              progress: bool = True, seed: int = SEED, scheduler: Any = None,
              cache: bool | str = True) -> SweepResult:
    """Every configuration's claim ratios through :func:`~spyre_lab.studies.sweep_runner.sweep` (Dask: a local
    cluster of ``workers`` processes by default, or ``scheduler``); ``logs`` maps an engine claim to its
    (all-off, all-on) recorded steps."""
    points = configurations(samples, seed)
    workers = workers or max(1, min(4, os.cpu_count() or 1))
    frame = sweep(points, ClaimRatios(logs), scheduler=scheduler, workers=workers, progress=progress, cache=cache)
    claims = [c for c in frame.columns if c not in ("label", *frame.attrs["parameters"])]
    return SweepResult([{"label": label, "changes": changes, "ratios": {c: float(row[c]) for c in claims}}
                        for (label, changes), (_, row) in zip(points, frame.iterrows(), strict=True)])
