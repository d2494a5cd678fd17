"""How fast are the device allocators and the stick copies? (wall-clock on this CPU, not modeled time)

The runtime allocates DRAM for every tensor and stickifies on every host <-> device copy, so both
sit on the hot path of every eager op.

    .venv/bin/python benchmarks/bench_memory.py [SECTION ...]   (--help lists the sections)
"""

from __future__ import annotations

import random
import sys
import time

import torch
from sections import chosen, parser

from spyre_lab.device.config import SPYRE
from spyre_lab.device.layout import StickLayout, stickify, unstickify
from spyre_lab.device.memory import DeviceMemory, DeviceOutOfMemoryError


def tensor_like_size(rng: random.Random) -> int:
    """Log-uniform sizes from 128 B to 64 MiB, like a model's mix of biases, activations and weights."""
    return int(2 ** rng.uniform(7, 26))


def churn(ops: int, live_target: int, seed: int = 0) -> dict[str, float]:
    """``ops`` allocate/free pairs around a steady live set of ``live_target`` tensors."""
    rng = random.Random(seed)
    mem = DeviceMemory.for_config(SPYRE)
    live = [mem.allocate(tensor_like_size(rng)) for _ in range(live_target)]
    sizes = [tensor_like_size(rng) for _ in range(ops)]
    victims = [rng.randrange(live_target) for _ in range(ops)]
    alloc_s = free_s = 0.0
    ooms = 0
    for size, victim in zip(sizes, victims):
        t0 = time.perf_counter()
        mem.free(live[victim])
        t1 = time.perf_counter()
        try:
            live[victim] = mem.allocate(size)
        except DeviceOutOfMemoryError:
            ooms += 1
            live[victim] = mem.allocate(0)
        t2 = time.perf_counter()
        free_s += t1 - t0
        alloc_s += t2 - t1
    return {"allocs_per_s": ops / alloc_s, "frees_per_s": ops / free_s, "free_blocks": mem.stats()["num_free_blocks"],
            "fragmentation": mem.fragmentation, "ooms": ooms}


def copy_throughput(shape: tuple[int, ...], dtype: torch.dtype, repeats: int = 5) -> tuple[float, float, float]:
    """GB/s (host bytes) of stickify, unstickify and a plain ``clone`` (the memcpy floor), best of ``repeats``."""
    t = torch.randn(shape).to(dtype)
    layout = StickLayout.default(shape, dtype)
    best_in = best_out = best_clone = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        d = stickify(t, layout)
        t1 = time.perf_counter()
        unstickify(d, layout)
        t2 = time.perf_counter()
        t.clone()
        t3 = time.perf_counter()
        best_in, best_out, best_clone = min(best_in, t1 - t0), min(best_out, t2 - t1), min(best_clone, t3 - t2)
    return tuple(layout.host_nbytes / s / 1e9 for s in (best_in, best_out, best_clone))


def bench_churn(ops: int) -> None:
    """DeviceMemory: allocations and frees per second around 100, 1,000 and 10,000 live tensors."""
    print(f"DeviceMemory churn: {ops:,} free+allocate pairs, 112 GiB card, log-uniform 128 B..64 MiB sizes")
    for live in (100, 1_000, 10_000):
        r = churn(ops, live)
        print(f"  {live:>6,} live tensors: {r['allocs_per_s']:>9,.0f} allocs/s  {r['frees_per_s']:>9,.0f} frees/s  "
              f"({r['free_blocks']:,} free blocks, fragmentation {r['fragmentation']:.0%}, {r['ooms']} OOMs)")


def bench_copies() -> None:
    """Host GB/s of stickify and unstickify (the work of every host <-> device copy) vs a plain clone."""
    print("stickify / unstickify (host GB/s, best of 5)")
    for shape, dtype in [((4096, 4096), torch.float16), ((32, 128, 4096), torch.float16),
                         ((4096, 4000), torch.float16), ((2048, 2048), torch.float32), ((1 << 22,), torch.int64)]:
        gbs_in, gbs_out, gbs_clone = copy_throughput(shape, dtype)
        name = f"{str(dtype).removeprefix('torch.')} {shape}"
        print(f"  {name:<28} stickify {gbs_in:5.2f} GB/s   unstickify {gbs_out:5.2f} GB/s   "
              f"(clone {gbs_clone:5.2f} GB/s)")


SECTIONS = {"churn": bench_churn, "copies": bench_copies}


def main(argv: list[str]) -> None:
    p = parser(__doc__, SECTIONS)
    p.add_argument("--ops", type=int, default=100_000, help="allocate/free pairs per churn run (default 100,000)")
    args = p.parse_args(argv)
    for name in chosen(args.sections, SECTIONS):
        if name == "churn":
            bench_churn(args.ops)
        else:
            SECTIONS[name]()


if __name__ == "__main__":
    main(sys.argv[1:])
