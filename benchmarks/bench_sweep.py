"""A design-space sweep on Dask: 500 device configurations on a 1-worker and a 2-worker local cluster.

    .venv/bin/python benchmarks/bench_sweep.py [SECTION ...] [--configs N]   (--help lists the sections)

The study is the sweep's own kernel study (``sweeps.kernel_ratios``: the matmul, softmax and MLP claims
recompiled and simulated under each configuration), at N distinct combinations of the kernel-side
parameters (clock, kernel launch cost, DRAM bandwidth, DRAM broadcast), nothing cached. Both cluster
sizes run in this one process, one after the other, on the same configurations; the figure is the
ratio of their wall times (the 2-worker run's speed-up), printed with the workers' CPU seconds and the
machine's load average, since other processes on a shared machine take cores from the workers. The
two runs' results must be identical (checked). Cluster start-up is timed apart from the sweep.
"""

from __future__ import annotations

import itertools
import os
import random
import time

from sections import chosen, parser

from spyre_lab.studies.sweep_runner import sweep
from spyre_lab.studies.sweeps import KERNEL_FIELDS, SWEEP_RANGES, kernel_ratios

DEFAULT_CONFIGS = 500


def configurations(count: int) -> list[dict[str, float]]:
    """``count`` distinct kernel-parameter combinations (of the 625 in ``SWEEP_RANGES``), in a seeded order."""
    grid = [dict(zip(KERNEL_FIELDS, values)) for values in itertools.product(*(SWEEP_RANGES[f] for f in KERNEL_FIELDS))]
    random.Random(0).shuffle(grid)
    if count > len(grid):
        raise SystemExit(f"--configs {count}: the kernel parameters have {len(grid)} distinct combinations")
    return grid[:count]


def _worker_cpu(client) -> float:
    return sum(client.run(time.process_time).values())


def timed_sweep(workers: int, configs: list[dict[str, float]]):
    """(start-up s, sweep wall s, workers' CPU s, frame) of the sweep on a fresh ``workers``-process cluster."""
    from distributed import Client, LocalCluster

    start = time.perf_counter()
    cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                           dashboard_address=None, env={"OMP_NUM_THREADS": "1"}, death_timeout=60)
    client = Client(cluster, timeout=120)
    try:
        startup = time.perf_counter() - start
        cpu = _worker_cpu(client)
        start = time.perf_counter()
        frame = sweep(configs, kernel_ratios, scheduler=client, progress=False, cache=False)
        wall = time.perf_counter() - start
        return startup, wall, _worker_cpu(client) - cpu, frame
    finally:
        client.close(timeout=30)
        cluster.close(timeout=30)


def scaling(count: int = DEFAULT_CONFIGS) -> None:
    """1 vs 2 workers: wall time of the same N-configuration sweep, and the ratio."""
    print(f"== scaling: {count} configurations of sweeps.kernel_ratios, 1 vs 2 worker processes (wall time)")
    configs = configurations(count)
    runs = {}
    for workers in (1, 2):
        load = os.getloadavg()[0]
        startup, wall, cpu, frame = timed_sweep(workers, configs)
        runs[workers] = (wall, frame)
        print(f"  {workers} worker{'s' if workers > 1 else ' '}: sweep {wall:7.1f} s wall ({count / wall:5.1f} "
              f"configs/s), workers' CPU {cpu:6.1f} s, cluster start-up {startup:4.1f} s, load average {load:.1f}")
    same = runs[1][1].equals(runs[2][1])
    print(f"  speed-up 2 vs 1 workers: {runs[1][0] / runs[2][0]:.2f}x wall (ideal 2.00x on 2 free cores); "
          f"{os.cpu_count()} cores here; results identical: {same}")
    if not same:
        raise SystemExit("the 1- and 2-worker sweeps disagree")


SECTIONS = {"scaling": scaling}


if __name__ == "__main__":
    p = parser(__doc__, SECTIONS)
    p.add_argument("--configs", type=int, default=DEFAULT_CONFIGS, help="configurations per sweep (default 500)")
    args = p.parse_args()
    for name in chosen(args.sections, SECTIONS):
        SECTIONS[name](args.configs)
