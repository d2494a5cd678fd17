"""Instructions per cached eager op and per tiny-granite decode step, counted by valgrind's callgrind.

On a shared machine, wall-clock and CPU time swing by a third from one minute to the next; the number of
instructions a piece of host code executes does not. Each workload runs twice in a child process under
callgrind, with counting switched on only around its last N repeats (two values of N, ``REPEATS``): the
difference divided by the difference of the Ns is the count per repeat, and start-up, warmup and compiles
cancel out. Compare two trees by running this in each. Needs valgrind (``apt-get install valgrind``); takes
about three minutes, so ``make bench`` leaves it out.

    .venv/bin/python benchmarks/instructions.py            # both workloads
    .venv/bin/python benchmarks/instructions.py eager      # one
    .venv/bin/python benchmarks/instructions.py first      # a first eager op at a new shape
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import warnings

from sections import chosen, parser

REPEATS = {"eager": (300, 1300), "eager_cpu": (300, 1300), "first": (10, 30), "decode": (5, 25), "decode_cpu": (5, 25)}
"""Per workload, the repeats counted in its two runs (the shorter first)."""


def _counting(on: bool) -> None:
    subprocess.run(["callgrind_control", "-i", "on" if on else "off", str(os.getpid())], capture_output=True,
                   check=False)


CACHED_RATIO_GOAL = 8.0
"""A cached eager op's host instructions over the same add on CPU tensors, at most: the goal the ratio row prints."""


def _child_eager(repeats: int, device: str = "spyre") -> None:
    import torch

    import spyre_lab.runtime  # noqa: F401  (the spyre device)

    x = torch.randn(64, 64, dtype=torch.float16).to(device)
    y = torch.randn(64, 64, dtype=torch.float16).to(device)
    for _ in range(50):
        torch.add(x, y)
    _counting(True)
    for _ in range(repeats):
        torch.add(x, y)
    _counting(False)


def _child_first(repeats: int) -> None:
    """``repeats`` first eager ops, each torch.add at a shape no op has seen (its one-op program built, compiled,
    checked and launched); the operands are made before counting starts."""
    import torch

    import spyre_lab.runtime  # noqa: F401  (the spyre device)

    for n in range(1, 4):                      # the first op of the process (imports, the form's trace) is not counted
        a = torch.empty(n, 8, dtype=torch.float16, device="spyre")
        torch.add(a, a)
    operands = [torch.empty(n, 8, dtype=torch.float16, device="spyre") for n in range(8, 8 + repeats)]
    _counting(True)
    for a in operands:
        torch.add(a, a)
    _counting(False)


DECODE_RATIO_GOAL = 2.0
"""A spyre decode step's host instructions over the cpu platform's, at most: the goal the ratio row prints."""


def _child_decode(repeats: int, platform: str = "spyre") -> None:
    import torch

    from spyre_lab.engine import LLM, SamplingParams
    from spyre_lab.engine.platforms.spyre import SpyrePlatform

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    if platform == "spyre":
        llm = LLM("tiny-granite", platform=SpyrePlatform(prefill_buckets=[128], batch_buckets=[1]),
                  max_model_len=128, max_num_seqs=1)
        llm.warmup(show_progress=False)
    else:                                    # the cpu platform in the spyre platform's dtype (fp16)
        llm = LLM("tiny-granite", dtype=torch.float16, max_model_len=128, max_num_seqs=1)
    engine = llm.llm_engine
    engine.add_request("a", "count from 5 to 12:", SamplingParams(temperature=0, max_tokens=repeats + 4,
                                                                  ignore_eos=True))
    for _ in range(3):                       # the prefill and two decode steps
        engine.step()
    _counting(True)
    for _ in range(repeats):
        engine.step()
    _counting(False)


def _collected(workload: str, repeats: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={tmp}/out",
             sys.executable, __file__, "--child", workload, str(repeats)],
            capture_output=True, text=True, check=False, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode or not found:
        raise SystemExit(f"callgrind run of {workload} failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return int(found.group(1))


def per_repeat(workload: str) -> float:
    short, long = REPEATS[workload]
    return (_collected(workload, long) - _collected(workload, short)) / (long - short)


def bench_eager() -> None:
    """Instructions per cached eager torch.add (64x64 fp16 spyre tensors, the program cached) vs the CPU add."""
    spyre, cpu = per_repeat("eager"), per_repeat("eager_cpu")
    print(f"cached eager torch.add 64x64 fp16: {spyre / 1e3:8.1f} k instructions per op")
    print(f"the same add on CPU tensors:       {cpu / 1e3:8.1f} k instructions per op")
    print(f"  cached eager op / CPU add: {spyre / cpu:5.1f}x  (goal <= {CACHED_RATIO_GOAL:g}x: "
          f"{'met' if spyre / cpu <= CACHED_RATIO_GOAL else 'not met'})")


def bench_first() -> None:
    """Instructions per first eager op at a new shape (torch.add n x 8 fp16; its program compiled)."""
    print(f"first eager torch.add at a new shape: {per_repeat('first') / 1e6:8.2f} M instructions per op "
          "(its CPU time, goal < 5 ms: bench_runtime.py eager)")


def bench_decode() -> None:
    """Instructions per tiny-granite decode step, spyre platform (piecewise-compiled, batch bucket 1) vs cpu."""
    spyre, cpu = per_repeat("decode"), per_repeat("decode_cpu")
    print(f"tiny-granite decode step (spyre):  {spyre / 1e6:8.2f} M instructions per step")
    print(f"tiny-granite decode step (cpu):    {cpu / 1e6:8.2f} M instructions per step")
    print(f"  spyre / cpu: {spyre / cpu:5.2f}x  (goal <= {DECODE_RATIO_GOAL:g}x)")


SECTIONS = {"eager": bench_eager, "first": bench_first, "decode": bench_decode}


def main(argv: list[str]) -> None:
    if argv[:1] == ["--child"]:
        children = {"eager": _child_eager, "eager_cpu": lambda n: _child_eager(n, device="cpu"), "first": _child_first,
                    "decode": _child_decode,
                    "decode_cpu": lambda n: _child_decode(n, platform="cpu")}
        children[argv[1]](int(argv[2]))
        return
    args = parser(__doc__, SECTIONS).parse_args(argv)
    if not (shutil.which("valgrind") and shutil.which("callgrind_control")):
        raise SystemExit("valgrind is not installed; install it (apt-get install valgrind) to count instructions")
    print("host instructions counted by callgrind (the same on a busy machine as on an idle one)")
    for name in chosen(args.sections, SECTIONS):
        SECTIONS[name]()


if __name__ == "__main__":
    main(sys.argv[1:])
