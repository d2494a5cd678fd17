"""How fast the simulator runs, and what it says about a big matmul.

    .venv/bin/python benchmarks/bench_sim.py [SECTION ...]   (--help lists the sections)

Prints CPU-time numbers for this process (they still move with the machine's load; the first
line calibrates how fast plain Python runs right now) and modeled numbers, which do not move.
"""

from __future__ import annotations

import dataclasses
import sys
import time

from sections import chosen, parser

from spyre_lab.device.config import SPYRE
from spyre_lab.device.isa import CoreOps, TileProgram
from spyre_lab.device.kernels import elementwise_kernel, matmul_kernel, softmax_kernel, sum_kernel
from spyre_lab.device.sim import simulate


def best_of(repeats: int, fn) -> tuple[float, object]:
    """Fewest CPU seconds of ``repeats`` calls (other processes' load counts less than in wall time)."""
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.process_time()
        out = fn()
        best = min(best, time.process_time() - t0)
    return best, out


def python_speed_ns() -> float:
    """ns per iteration of a trivial loop: divide cpu times by this to compare machines."""
    def loop() -> int:
        x = 0
        for i in range(1_000_000):
            x += i
        return x
    return best_of(3, loop)[0] * 1e3


def distinct_copy(kernel: TileProgram) -> TileProgram:
    """The same kernel with every core's ops as separate objects (no program sharing to exploit)."""
    return TileProgram(kernel.name + "_distinct", [CoreOps([dataclasses.replace(op) for op in p.ops])
                                              for p in kernel.programs])


def event_throughput() -> None:
    """Event mode: tile ops simulated per second, trace off and on, on five kernels."""
    print("\n== event mode: tile ops simulated per second (trace off / on) ==")
    kernels = [
        elementwise_kernel(1 << 24, 32, tile_bytes=16 * 1024),
        sum_kernel(1 << 24, 32, tile_bytes=16 * 1024),
        softmax_kernel(8192, 1024, 32),
        matmul_kernel(1024, 1024, 2048, 2, 4, 4),
        matmul_kernel(2048, 2048, 2048, 4, 8, 1),
    ]
    total_ops = total_s = 0.0
    for kernel in kernels:
        cpu, result = best_of(3, lambda k=kernel: simulate(k, trace=False))
        cpu_trace, _ = best_of(3, lambda k=kernel: simulate(k, trace=True))
        total_ops += kernel.num_ops
        total_s += cpu
        print(f"{kernel.name:36s} {kernel.num_ops:7d} ops  {kernel.num_ops / cpu:9,.0f} ops/s "
              f"({kernel.num_ops / cpu_trace:9,.0f} with trace)  modeled {result.time_us:9.2f} us "
              f"{result.bottleneck}")
    print(f"{'overall':36s} {int(total_ops):7d} ops  {total_ops / total_s:9,.0f} ops/s")


def big_matmul() -> None:
    """A 4096^3 matmul on 32 cores at two tile sizes: analytic vs event, CPU time and modeled time."""
    print("\n== 4096 x 4096 x 4096 fp16 matmul on 32 cores (grid 4x8x1, double-buffered tiles) ==")
    for tile in ((128, 128, 64), (256, 256, 128)):
        build_s, kernel = best_of(1, lambda t=tile: matmul_kernel(4096, 4096, 4096, 4, 8, 1, tile=t))
        analytic_s, analytic = best_of(5, lambda k=kernel: simulate(k, mode="analytic", trace=False))
        event_s, event = best_of(1, lambda k=kernel: simulate(k, mode="event", trace=False))
        print(f"tile {tile}: {kernel.num_ops:,} ops, built in {build_s * 1e3:.1f} ms")
        print(f"  analytic: {analytic_s * 1e3:8.2f} ms cpu  modeled {analytic.time_us:9.1f} us  "
              f"{analytic.bottleneck}-bound, PT utilization {analytic.pt_utilization:.1%}, "
              f"DRAM {analytic.dram_utilization:.1%}")
        print(f"  event:    {event_s * 1e3:8.1f} ms cpu  modeled {event.time_us:9.1f} us  "
              f"{event.bottleneck}-bound, PT utilization {event.pt_utilization:.1%}, "
              f"DRAM {event.dram_utilization:.1%}  ({kernel.num_ops / event_s:,.0f} ops/s)")
        print(f"  analytic / event modeled time: {analytic.time_us / event.time_us:.3f}")
        print(f"  {event.explain()}")
        distinct = distinct_copy(kernel)
        distinct_s, _ = best_of(3, lambda k=distinct: simulate(k, mode="analytic", trace=False))
        print(f"  analytic with no shared programs: {distinct_s * 1e3:8.1f} ms cpu "
              f"({distinct.num_ops / distinct_s:,.0f} ops/s)")


SECTIONS = {"event": event_throughput, "matmul": big_matmul}


def main(argv: list[str]) -> None:
    names = chosen(parser(__doc__, SECTIONS).parse_args(argv).sections, SECTIONS)
    print(f"python speed: {python_speed_ns():.1f} ns per trivial loop iteration (about 15-30 on an idle laptop)")
    print(f"config: {SPYRE.describe()}")
    for name in names:
        SECTIONS[name]()


if __name__ == "__main__":
    main(sys.argv[1:])
