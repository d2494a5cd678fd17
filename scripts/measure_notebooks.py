"""Wall time and peak memory of each notebook run top to bottom on one core (the < 60 s, < 700 MB budget).

Each notebook runs in its own child process pinned to CPU 0 (``taskset -c 0`` where available, and one
torch/OpenMP thread either way); the child executes it in a fresh kernel and reports the kernel's peak
resident memory and CPU time (``getrusage`` of the finished kernel process) and the wall time from kernel start
to the last cell. On a shared machine the wall time includes waiting for the core; the kernel's CPU time is what
the notebook itself needs. Nothing is written back to the notebooks.

    python scripts/measure_notebooks.py                     # every notebook in tutorials/ and notebooks/
    python scripts/measure_notebooks.py tutorials/01_tour.ipynb
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_notebooks import KERNEL_ENV, ROOT, execute, find_notebooks

BUDGET_S = 60.0
BUDGET_MB = 700.0   # Binder guarantees 1 GB and JupyterLab keeps earlier kernels alive


def measure_one(path: Path) -> dict[str, float]:
    """Run one notebook in this process's child kernel; wall seconds and the kernel's peak RSS in MB."""
    start = time.perf_counter()
    execute(path)
    wall = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)   # the finished kernel process
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_mb": usage.ru_maxrss / 1024}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", help="notebooks or folders (default: tutorials/ and notebooks/)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(measure_one(Path(args.one))))
        return 0
    pin = ["taskset", "-c", "0"] if shutil.which("taskset") else []
    env = {**os.environ, **KERNEL_ENV}
    print(f"one core ({'taskset -c 0, ' if pin else ''}OMP_NUM_THREADS=1); budget {BUDGET_S:.0f} s, {BUDGET_MB:.0f} MB")
    print(f"{'notebook':<44} {'wall s':>8} {'cpu s':>8} {'peak MB':>8}  within budget")
    over = 0
    for path in find_notebooks(args.paths):
        cmd = [*pin, sys.executable, __file__, "--one", str(path)]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        name = str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
        if done.returncode:
            print(f"{name:<44} failed:\n{done.stderr[-2000:]}")
            over += 1
            continue
        m = json.loads(done.stdout.strip().splitlines()[-1])
        ok = m["wall_s"] < BUDGET_S and m["peak_mb"] < BUDGET_MB
        over += not ok
        print(f"{name:<44} {m['wall_s']:8.1f} {m['cpu_s']:8.1f} {m['peak_mb']:8.0f}  {'yes' if ok else 'NO'}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
