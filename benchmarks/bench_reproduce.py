"""How long ``spyre-lab reproduce`` makes a user wait: a cold run (nothing cached) and a warm one.

    .venv/bin/python benchmarks/bench_reproduce.py [SECTION ...]   (--help lists the sections)

Each run is a fresh ``python -m spyre_lab.cli reproduce`` subprocess with its own empty cache folder
(``SPYRE_LAB_CACHE``); the figure is that subprocess's CPU time (user + system, from the kernel's
accounting of the child), so other processes' load on a shared machine moves it far less than wall
time, and its peak resident memory. Goals (issue 22): cold < 20 s CPU, warm < 3 s CPU. The modeled
numbers the command prints are the same either way (a warm run reads the cold run's result, stored
under the source fingerprint). ``profile`` runs the studies once in this process and splits each stage's CPU
into Dynamo tracing, compiling the pieces' Programs and the rest. ``BENCH_REPRODUCE_CACHE=DIR`` keeps the cache
folder between runs (``warm`` alone then times a cache already filled by this source, without a cold run first;
``cold`` empties it).
"""

from __future__ import annotations

import ast
import collections
import functools
import itertools
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sections import chosen, parser

ROOT = Path(__file__).resolve().parents[1]
GOALS_S = {"cold": 20.0, "warm": 3.0}
HEAVY = ("spyre_lab.compiler", "spyre_lab.engine", "spyre_lab.studies.claims", "torch._dynamo")
"""What computing a result loads and reading a cached one need not."""
_CACHE = os.environ.get("BENCH_REPRODUCE_CACHE") or tempfile.mkdtemp(prefix="bench-reproduce-")
_OUTPUTS: dict[str, str] = {}


def run_reproduce(*flags: str) -> tuple[float, float, str]:
    """(CPU seconds, peak RSS in MB, stdout) of one ``spyre-lab reproduce`` subprocess (and its children)."""
    return run_python("-m", "spyre_lab.cli", "reproduce", *flags)


def run_python(*args: str) -> tuple[float, float, str]:
    """(CPU seconds, peak RSS in MB, stdout) of one ``python ARGS`` subprocess, with this bench's cache folder."""
    env = dict(os.environ, SPYRE_LAB_CACHE=_CACHE, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(child.pid, 0)        # this child's own accounting, not every child's so far
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        if child.returncode != 0:
            raise SystemExit(f"{' '.join(args)} failed:\n{err.read()[-2000:]}")
        return usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, out.read()


def _report(name: str, cpu: float, rss_mb: float) -> None:
    goal = GOALS_S[name]
    verdict = "meets" if cpu < goal else "misses"
    print(f"  {name:<5} {cpu:7.1f} s CPU   peak RSS {rss_mb:7.0f} MB   goal < {goal:g} s: {verdict} it")


def cold() -> None:
    """Cold: text output, nothing cached (every engine probe, compile and kernel claim runs)."""
    print("== cold: spyre-lab reproduce, empty cache")
    for path in Path(_CACHE).glob("*"):
        if path.is_file():
            path.unlink()
    cpu, rss, _OUTPUTS["cold"] = run_reproduce()
    _report("cold", cpu, rss)


def warm() -> None:
    """Warm: text output again, the result cached by source fingerprint (run after cold)."""
    print("== warm: spyre-lab reproduce, this source's result cached")
    if "cold" not in _OUTPUTS:
        _OUTPUTS["cold"] = run_reproduce()[2]             # fill the cache first (not timed)
    cpu, rss, out = run_reproduce()
    _report("warm", cpu, rss)
    print(f"  warm output identical to the cold run's: {out == _OUTPUTS['cold']}")
    json_cpu, json_rss, _ = run_reproduce("--json")
    print(f"  warm --json {json_cpu:5.1f} s CPU   peak RSS {json_rss:7.0f} MB")
    # the floor: every spyre_lab import starts with torch's (spyre_lab/__init__.py), so a cache hit can cost no less;
    # what it spends after that is this command's own imports, the cache read and the rendering, timed in-process
    torch_cpu = min(run_python("-c", "import torch")[0] for _ in range(2))
    print(f"  import torch alone {torch_cpu:5.1f} s CPU (a fresh interpreter's floor)")
    for flags in ([], ["--json"]):
        after = min(_after_torch(flags) for _ in range(3))
        print(f"  cache hit{' ' + ' '.join(flags) if flags else ''}, CPU after torch is imported: {after[0]:.3f} s "
              f"(best of 3); of {', '.join(HEAVY)} it loads {after[1] or 'none'}")


def _after_torch(flags: list[str]) -> tuple[float, list[str]]:
    """(CPU seconds, heavy modules loaded) of ``spyre-lab reproduce FLAGS`` run in-process once torch is imported."""
    probe = ("import contextlib, io, sys, time; import torch; start = time.process_time(); "
             "from spyre_lab.cli import main\n"
             "with contextlib.redirect_stdout(io.StringIO()): main(['reproduce', *sys.argv[1:]])\n"
             f"print(time.process_time() - start, [m for m in {HEAVY!r} if m in sys.modules])")
    cpu, loaded = run_python("-c", probe, *flags)[2].splitlines()[-1].split(" ", 1)
    return float(cpu), ast.literal_eval(loaded)


def profile() -> None:
    """Where a cold run's CPU goes: each stage, split into Dynamo tracing, spyre piece compiles and the rest."""
    print("== profile: one cold reproduce in this process (text output's studies, no cache), CPU seconds")
    start = time.process_time()
    sys.path.insert(0, str(ROOT))     # this tree's spyre_lab, as the subprocess sections run (not an installed one)
    import importlib

    import torch._dynamo.convert_frame as convert_frame

    from spyre_lab.compiler import cache as program_cache
    from spyre_lab.compiler import plan_memo
    from spyre_lab.engine.platforms.spyre import SpyrePlatform

    study = importlib.import_module("spyre_lab.studies.reproduce")
    spent: collections.Counter = collections.Counter()
    _count_cpu(convert_frame.ConvertFrameAssert, "__call__", spent, "dynamo")      # trace + its backend call
    _count_cpu(SpyrePlatform, "_backend", spent, "compile")                        # the pieces' Programs
    print(f"  imports {time.process_time() - start:6.1f} s")
    marks: list[tuple[str, float, dict]] = []

    def progress(enabled: bool):
        return lambda message: marks.append((message, time.process_time(), dict(spent)))

    study._progress = progress
    study.reproduce(progress=True)
    marks.append(("end", time.process_time(), dict(spent)))
    print(f"  {'stage':<58}{'CPU':>7}{'traces':>8}{'tracing':>9}{'compile':>9}{'other':>7}")
    for (label, t0, a), (_, t1, b) in itertools.pairwise(marks):
        traces = b.get("dynamo#", 0) - a.get("dynamo#", 0)
        comp = b.get("compile", 0) - a.get("compile", 0)
        tracing = b.get("dynamo", 0) - a.get("dynamo", 0) - comp
        print(f"  {label[:56]:<58}{t1 - t0:7.1f}{traces:8d}{tracing:9.1f}{comp:9.1f}{t1 - t0 - tracing - comp:7.1f}")
    stats = program_cache.stats()
    print(f"  total {time.process_time() - start:.1f} s CPU: {spent['dynamo#']} Dynamo traces "
          f"({spent['dynamo'] - spent['compile']:.1f} s tracing), {spent['compile']:.1f} s compiling pieces; "
          f"program cache {stats['compiles']} compiles, {stats['hits']} hits; "
          f"{plan_memo.stats()['plans']} kernel plans kept (each planned and timed once)")


def _count_cpu(owner: type, name: str, spent: collections.Counter, key: str) -> None:
    """Wrap ``owner.name`` to add its calls' process CPU time (outermost calls only) and count to ``spent``."""
    inner = getattr(owner, name)
    depth = [0]

    @functools.wraps(inner)
    def timed(*args, **kwargs):
        depth[0] += 1
        start = time.process_time()
        try:
            return inner(*args, **kwargs)
        finally:
            depth[0] -= 1
            if depth[0] == 0:
                spent[key] += time.process_time() - start
                spent[key + "#"] += 1
    setattr(owner, name, timed)


SECTIONS = {"cold": cold, "warm": warm, "profile": profile}


if __name__ == "__main__":
    args = parser(__doc__, SECTIONS).parse_args()
    for name in chosen(args.sections, SECTIONS):
        SECTIONS[name]()
