"""Compiler benchmarks: compile time, cache hits, fusion, and modeled matmul times (all device times modeled).

Run: .venv/bin/python benchmarks/bench_compile.py [SECTION ...]   (--help lists the sections)
"""

from __future__ import annotations

import sys
import time
import warnings

import torch
from sections import chosen, parser

import spyre_lab.compiler  # noqa: F401  (registers the backend)
from spyre_lab.compiler import cache, plan_memo
from spyre_lab.compiler.backend import compile_graph
from spyre_lab.compiler.examples import granite_layer, granite_stack, layer_inputs, stack_inputs
from spyre_lab.compiler.options import CompileOptions
from spyre_lab.device.config import SPYRE


def timed(fn, repeat: int = 1) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def bench_compile_time() -> None:
    """Compile time (wall clock) cold and cached, fusion, modeled layer time; torch.compile first and next call."""
    print("== compile time (wall clock, this machine) ==")
    first = timed(lambda: compile_graph(lambda t: torch.softmax(t * 2, -1), [torch.randn(8, 64).half()]))
    print(f"first compile in a fresh process (one-time imports, decomposition table, tracer warm-up): {first:.2f} s")
    for label, (d, heads, kv, ff, seq, device) in {
        "small Granite-style layer (d=256, seq 64, real tensors)": (256, 4, 2, 512, 64, "cpu"),
        "Granite-3.3-8B-shaped layer (d=4096, ff=12800, seq 1024, meta tensors)": (4096, 32, 8, 12800, 1024, "meta"),
    }.items():
        inputs = layer_inputs(d, heads, kv, ff, seq, device)
        fn = lambda *a, _h=heads, _kv=kv: granite_layer(*a, heads=_h, kv_heads=_kv)
        cache.clear()
        plan_memo.clear()
        cold = timed(lambda fn=fn, inputs=inputs: compile_graph(fn, inputs))
        hit = timed(lambda fn=fn, inputs=inputs: compile_graph(fn, inputs), repeat=5)
        program = compile_graph(fn, inputs)
        print(f"{label}:\n  cold compile {cold:.2f} s wall (CPU time and its goal: layers section), "
              f"cache hit {hit * 1e3:.2f} ms (target < 50 ms)")
        unfused = compile_graph(fn, inputs, CompileOptions(fusion=frozenset()))
        modeled = program.modeled_time_us()
        modeled_unfused = unfused.modeled_time_us()
        print(f"  {program.aten_ops} ATen ops -> {program.unfused_kernels} LoopIR nodes; kernels: "
              f"{len(unfused.kernels)} without fusion -> {len(program.kernels)} with fusion")
        if modeled is None or modeled_unfused is None:
            untimed = [launch.name for launch in program.launches if not hasattr(launch, "simulate")]
            print(f"  modeled device time: n/a, kernels without a tile plan: {untimed}")
        else:
            print(f"  modeled device time: {modeled_unfused:.1f} us unfused -> {modeled:.1f} us fused (analytic)")
        for kernel in program.kernels:
            if kernel.decision:
                print(f"  fusion choice: {kernel.decision}")
    torch._dynamo.reset()
    inputs = layer_inputs(256, 4, 2, 512, 64)
    cache.clear()
    compiled = torch.compile(lambda *a: granite_layer(*a, heads=4, kv_heads=2), backend="spyre", fullgraph=True)
    first = timed(lambda: compiled(*inputs))
    again = timed(lambda: compiled(*inputs), repeat=3)
    print(f"torch.compile(backend='spyre') small layer: first call {first:.2f} s (Dynamo + compile + run), "
          f"next call {again * 1e3:.1f} ms (execute only: numerics on CPU + modeled timing); cache {cache.stats()}")


def cpu_seconds(fn) -> float:
    """Process CPU time of one call (the shared machine's load does not inflate it as wall clock would)."""
    start = time.process_time()
    fn()
    return time.process_time() - start


def bench_layers() -> None:
    """Compile CPU time of Granite-3.3-8B-shaped layers: one layer, and N identical layers in one graph."""
    print("\n== compile CPU time, Granite-3.3-8B-shaped layers (d=4096, ff=12800, seq 1024, meta tensors) ==")
    compile_graph(lambda t: torch.softmax(t * 2, -1), [torch.randn(8, 64).half()])     # one-time warm-up
    one = None
    for layers in (1, 2, 8):
        inputs = stack_inputs(4096, 32, 8, 12800, 1024, layers, "meta")
        fn = lambda *a, _n=layers: granite_stack(*a, layers=_n)
        cache.clear()
        plan_memo.clear()
        cpu = cpu_seconds(lambda fn=fn, inputs=inputs: compile_graph(fn, inputs))
        one = cpu if one is None else one
        goal = "goal < 1.5 s" if layers == 1 else f"goal < 2x one layer: {cpu / one:.2f}x"
        print(f"{layers} layer(s) in one graph: {cpu:.2f} s CPU ({goal}); "
              f"{plan_memo.stats()['plans']} distinct kernel plans")


def matmul_us(m: int, n: int, k: int, strategy: str) -> tuple[float, object]:
    a = torch.empty(m, k, dtype=torch.float16, device="meta")
    b = torch.empty(k, n, dtype=torch.float16, device="meta")
    program = compile_graph(lambda x, w: x @ w, [a, b], CompileOptions(work_division=strategy))
    (spec,) = program.launches
    return spec.simulate("analytic").time_us, spec


def bench_matmuls() -> None:
    """Modeled matmul times: naive vs planned work division (analytic simulator)."""
    print("\n== modeled matmul times (analytic simulator, fp16) ==")
    m = n = k = 4096
    t, spec = matmul_us(m, n, k, "planned")
    roofline = 2 * m * n * k / SPYRE.peak_flops * 1e6
    print(f"4096^3 planned {dict(spec.division.splits)}: {t:.1f} us modeled; compute roofline {roofline:.1f} us "
          f"-> {roofline / t:.1%} of peak (target >= 80%)")
    for m, n, k in [(1, 4096, 4096), (1, 12800, 4096), (1, 4096, 12800), (1024, 4096, 4096)]:
        naive, ns = matmul_us(m, n, k, "naive")
        planned, ps = matmul_us(m, n, k, "planned")
        print(f"{m}x{k} @ {k}x{n}: naive {dict(ns.division.splits)} {naive:.1f} us, planned "
              f"{dict(ps.division.splits)} {planned:.1f} us (planned changes time by {planned / naive - 1:+.0%})")


SECTIONS = {"compile": bench_compile_time, "layers": bench_layers, "matmul": bench_matmuls}


def main(argv: list[str]) -> None:
    names = chosen(parser(__doc__, SECTIONS).parse_args(argv).sections, SECTIONS)
    torch.manual_seed(0)
    warnings.simplefilter("ignore")
    for name in names:
        SECTIONS[name]()


if __name__ == "__main__":
    main(sys.argv[1:])
