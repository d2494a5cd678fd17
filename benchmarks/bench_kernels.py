"""Kernel planning on the modeled card: work division, DRAM broadcast, fused softmax, MLP, attention, paged attention.

Prints modeled kernel times (``KernelSpec.simulate``, analytic mode unless stated) next to the
published claims they relate to, and the wall-clock time codegen itself took. Nothing here is tuned
to a claim: the numbers are whatever the mechanisms produce on ``SPYRE``. "DRAM MB" is what DRAM
itself served (a broadcast load counted once per group); "no bcast" reruns the same plan on a card
whose DRAM cannot broadcast (``dram_broadcast_cores=1``), to show what the mechanism is worth.

    .venv/bin/python benchmarks/bench_kernels.py            # everything (~20 s)
    .venv/bin/python benchmarks/bench_kernels.py matmul     # one section (--help lists them)
"""

from __future__ import annotations

import sys
import time

import torch
from sections import chosen, parser

from spyre_lab.compiler.codegen import KernelSpec, generate_kernel
from spyre_lab.compiler.ir import BufferInfo, IRNode, MatMul, NodeGroup, Pointwise, Reduction
from spyre_lab.compiler.options import CompileOptions
from spyre_lab.device.config import SPYRE, SpyreConfig
from spyre_lab.device.kernels import softmax_kernel
from spyre_lab.device.sim import simulate

F16 = torch.float16
HIDDEN, INTERMEDIATE, KV = 4096, 12800, 1024  # Granite-3.3-8B: hidden 4096, MLP 12800, 8 KV heads x 128
NO_BROADCAST = SPYRE.replace(dram_broadcast_cores=1)  # same card, every core's load a separate DRAM read


def _noop(*_):
    return None


def _bufs(*rows) -> dict[str, BufferInfo]:
    return {name: BufferInfo(name, shape, F16, role) for name, shape, role in rows}


def _single(node: IRNode) -> NodeGroup:
    return NodeGroup(node.name, [node], "single", list(dict.fromkeys(node.inputs)), [node.output])


def _compile(kernel: NodeGroup, bufs, cfg: SpyreConfig, opts: CompileOptions) -> tuple[KernelSpec, float]:
    t = time.perf_counter()
    spec = generate_kernel(kernel, bufs, cfg, opts)
    return spec, time.perf_counter() - t


def _mean_util(specs: list[KernelSpec], mode: str = "analytic") -> float:
    """Time-weighted mean over all cores of the fraction of time a core's PT or SFU computes."""
    busy = total = 0.0
    for s in specs:
        r = s.simulate(mode)
        busy += sum(r.core_utilization.values()) / s.cfg.cores * r.time_us
        total += r.time_us
    return busy / total


# --- matmul: naive vs planned work division ------------------------------------------------------------

def matmul_kernel(m: int, n: int, k: int) -> tuple[NodeGroup, dict[str, BufferInfo]]:
    bufs = _bufs(("a", (m, k), "input"), ("w", (k, n), "constant"), ("c", (m, n), "output"))
    node = MatMul("mm", "matmul", ("a", "w"), "c", {"B": 1, "M": m, "N": n, "K": k}, _noop, ("K",), "N", 1, m, n, k)
    return NodeGroup("mm", [node], "single", ["a", "w"], ["c"]), bufs


def bench_matmul() -> None:
    """Naive (one output dim) vs planned work division on Granite-3.3-8B matmul shapes, with DRAM broadcast on/off."""
    print("== matmul: naive (one output dim) vs planned work division, Granite-3.3-8B shapes, fp16, 32 cores ==")
    print("   published: matmul kernel time -29 ... -69% (IBM; mechanism not in the docs)")
    print("   roof = compute roofline (prefill) or DRAM roofline (decode: each weight byte once) over the time")
    shapes = {"qkv": (HIDDEN + 2 * KV, HIDDEN), "o_proj": (HIDDEN, HIDDEN), "mlp up": (INTERMEDIATE, HIDDEN),
              "mlp down": (HIDDEN, INTERMEDIATE)}
    header = (f"{'shape':>26} {'naive':>7} {'planned':>8} {'naive us':>9} {'planned us':>10} {'change':>8} "
              f"{'roof n/p':>9} {'DRAM MB n/p':>12} {'no bcast us':>11} {'tiles MxNxK':>13} {'codegen s':>9}")
    print(header)
    for m in (1024, 1):
        for label, (n, k) in shapes.items():
            kernel, bufs = matmul_kernel(m, n, k)
            naive, t0 = _compile(kernel, bufs, SPYRE, CompileOptions(work_division="naive"))
            planned, t1 = _compile(kernel, bufs, SPYRE, CompileOptions(work_division="planned"))
            rn, rp = naive.simulate(), planned.simulate()
            alone = generate_kernel(kernel, bufs, NO_BROADCAST, CompileOptions()).simulate()
            floor_us = (2 * m * n * k / SPYRE.peak_flops if m > 1 else n * k * 2 / SPYRE.dram_bandwidth) * 1e6
            t = planned.tiles
            print(f"{label + f' {m}x{n}x{k}':>26} {_fmt(naive.division.splits):>7} {_fmt(planned.division.splits):>8} "
                  f"{rn.time_us:>9.1f} {rp.time_us:>10.1f} {100 * (rp.time_us / rn.time_us - 1):>+7.1f}% "
                  f"{floor_us / rn.time_us:>4.0%}/{floor_us / rp.time_us:<4.0%} "
                  f"{rn.dram_bytes / 1e6:>5.0f}/{rp.dram_bytes / 1e6:<6.0f} {alone.time_us:>11.1f} "
                  f"{t['M']:>5}x{t['N']}x{t['K']:<4} {t0 + t1:>9.2f}")
    kernel, bufs = matmul_kernel(1, HIDDEN, HIDDEN)
    for kf in (True, False):
        spec, _ = _compile(kernel, bufs, SPYRE, CompileOptions(k_fast_placement=kf))
        hops = {op.hops for p in spec.tile_kernel.programs for op in p if op.kind.value == "ring_send"}
        r = spec.simulate("event")
        print(f"   decode o_proj, K-fast placement {'on ' if kf else 'off'}: psum hops {sorted(hops)}, "
              f"{r.time_us:.1f} us modeled (event mode)")


def bench_roofline() -> None:
    """A 4096^3 planned matmul as a fraction of the compute roofline."""
    n = 4096
    print(f"\n== {n}^3 fp16 matmul, planned, 32 cores: fraction of the compute roofline ==")
    kernel, bufs = matmul_kernel(n, n, n)
    ideal_us = 2 * n ** 3 / SPYRE.peak_flops * 1e6
    for label, cfg, mode in (("broadcast", SPYRE, "analytic"), ("broadcast", SPYRE, "event"),
                             ("no broadcast", NO_BROADCAST, "analytic")):
        spec, tc = _compile(kernel, bufs, cfg, CompileOptions())
        t = time.perf_counter()
        r = spec.simulate(mode)
        ts = time.perf_counter() - t
        print(f"   {label:>12} ({mode:>8}): split {_fmt(spec.division.splits)}, tiles {spec.tiles['M']}x"
              f"{spec.tiles['N']}x{spec.tiles['K']}, {r.time_us:7.1f} us modeled vs {ideal_us:.1f} ideal = "
              f"{ideal_us / r.time_us:5.1%} of the roofline, DRAM {r.dram_bytes / 1e6:.0f} MB, bottleneck "
              f"{r.bottleneck} (codegen {tc:.2f} s, sim {ts:.2f} s)")


def _fmt(splits: dict[str, int]) -> str:
    return ",".join(f"{d}{s}" for d, s in splits.items() if s > 1) or "1 core"


# --- softmax: fused in LX vs staged through DRAM --------------------------------------------------------

def softmax_nodes(m: int, n: int) -> tuple[list[IRNode], dict[str, BufferInfo]]:
    d = {"d0": m, "d1": n}
    bufs = _bufs(("x", (m, n), "input"), ("amax", (m, 1), "intermediate"), ("sub", (m, n), "intermediate"),
                 ("exp", (m, n), "intermediate"), ("sum", (m, 1), "intermediate"), ("div", (m, n), "output"))
    nodes: list[IRNode] = [
        Reduction("amax", "amax", ("x",), "amax", dict(d), _noop, ("d1",), "d0"),
        Pointwise("sub", "sub", ("x", "amax"), "sub", dict(d), _noop, (), "d1"),
        Pointwise("exp", "exp", ("sub",), "exp", dict(d), _noop, (), "d1"),
        Reduction("sum", "sum", ("exp",), "sum", dict(d), _noop, ("d1",), "d0"),
        Pointwise("div", "div", ("exp", "sum"), "div", dict(d), _noop, (), "d1"),
    ]
    return nodes, bufs


def bench_softmax() -> None:
    """Softmax 512x1024: fused (intermediates in LX) vs staged through DRAM, on 1 and 32 cores."""
    m, n = 512, 1024
    print(f"\n== softmax {m}x{n} fp16: fused (intermediates in LX) vs staged (through DRAM) ==")
    print("   published: 32.51 us staged -> 23.67 us fused (-27%), 1 core; 4 cores: 32.17 us")
    nodes, bufs = softmax_nodes(m, n)
    amax, sub, exp, total, div = nodes
    for cores in (1, 4, 32):
        cfg = SPYRE.replace(cores=cores)
        opts = CompileOptions()
        fused, _ = _compile(NodeGroup("softmax", nodes, "softmax", ["x"], ["div"], ["amax", "sub", "exp", "sum"]),
                            bufs, cfg, opts)
        five = [_compile(_single(nd), bufs, cfg, opts)[0] for nd in nodes]
        three = [_compile(_single(amax), bufs, cfg, opts)[0],
                 _compile(NodeGroup("exp_sum", [sub, exp, total], "reduction_fusion", ["x", "amax"],
                                      ["exp", "sum"], ["sub"]), bufs, cfg, opts)[0],
                 _compile(_single(div), bufs, cfg, opts)[0]]
        tf = fused.simulate().time_us
        fused_mb = fused.simulate().dram_bytes / 1e6
        one_launch = simulate(softmax_kernel(m, n, cores, cfg, fused=False), cfg, mode="analytic")
        print(f"   {cores:>2} core(s): fused {tf:6.2f} us, {fused_mb:.2f} MB DRAM, split "
              f"{_fmt(fused.division.splits)}, row tile {fused.tiles['d0']}")
        rows = [("staged in one launch (device reference kernel)", one_launch.time_us, one_launch.dram_bytes)]
        rows += [(f"staged as {len(ks)} kernels", sum(k.simulate().time_us for k in ks),
                  sum(k.simulate().dram_bytes for k in ks)) for ks in (five, three)]
        for label, ts, moved in rows:
            print(f"      {label:>47}: {ts:7.2f} us, {moved / 1e6:5.2f} MB DRAM | fused change "
                  f"{100 * (tf / ts - 1):+6.1f}%")
        if cores == 1:
            ev = fused.simulate("event").time_us
            launch = SPYRE.cycles_to_us(SPYRE.kernel_launch_cycles)
            print(f"      (event mode, 1 core: fused {ev:.2f} us; launch {launch} us per kernel; "
                  f"bottleneck {fused.simulate().bottleneck})")


# --- MLP: one fused kernel vs gate, up, SiLU, mul, down as separate kernels -----------------------------

def mlp_nodes(m: int, h: int, i: int) -> tuple[list[IRNode], dict[str, BufferInfo]]:
    bufs = _bufs(("x", (m, h), "input"), ("wg", (h, i), "constant"), ("wu", (h, i), "constant"),
                 ("g", (m, i), "intermediate"), ("u", (m, i), "intermediate"), ("s", (m, i), "intermediate"),
                 ("p", (m, i), "intermediate"), ("wd", (i, h), "constant"), ("y", (m, h), "output"))
    dims = {"B": 1, "M": m, "N": i, "K": h}
    nodes: list[IRNode] = [
        MatMul("gate", "matmul", ("x", "wg"), "g", dict(dims), _noop, ("K",), "N", 1, m, i, h),
        MatMul("up", "matmul", ("x", "wu"), "u", dict(dims), _noop, ("K",), "N", 1, m, i, h),
        Pointwise("silu", "silu", ("g",), "s", {"d0": m, "d1": i}, _noop, (), "d1"),
        Pointwise("mul", "mul", ("s", "u"), "p", {"d0": m, "d1": i}, _noop, (), "d1"),
        MatMul("down", "matmul", ("p", "wd"), "y", {"B": 1, "M": m, "N": h, "K": i}, _noop, ("K",), "N", 1, m, h, i),
    ]
    return nodes, bufs


def bench_mlp() -> None:
    """MLP: one fused kernel vs five kernels, core utilization, and the scheduler's cost-based choice."""
    print("\n== MLP (gate, up, SiLU, mul, down): one fused kernel vs five kernels, Granite-3.3-8B dims ==")
    print("   published: fused MLP-style kernel raises core utilization (not quantified)")
    print("   util = time-weighted share of all 32 cores' time their PT or SFU computes; a scheduler comparing")
    print("   fusion_cost.estimate_us(fused) with the sum over the five kernels picks the faster one; the compiler's")
    print("   scheduler weighs fused, fused without down (down separate) and the kernels its other rules form")
    for m in (1, 16, 128, 1024):
        nodes, bufs = mlp_nodes(m, HIDDEN, INTERMEDIATE)
        fused, tc = _compile(NodeGroup("mlp", nodes, "mlp", ["x", "wg", "wu", "wd"], ["y"], ["g", "u", "s", "p"]),
                             bufs, SPYRE, CompileOptions())
        separate = [_compile(_single(nd), bufs, SPYRE, CompileOptions())[0] for nd in nodes]
        tf = fused.simulate().time_us
        ts = sum(k.simulate().time_us for k in separate)
        dram_f = fused.simulate().dram_bytes / 1e6
        dram_s = sum(k.simulate().dram_bytes for k in separate) / 1e6
        pick = "fused" if tf < ts else "separate"
        print(f"   M={m:>4}: separate {ts:8.1f} us, util {_mean_util(separate):5.1%}, DRAM {dram_s:7.1f} MB | fused "
              f"{tf:8.1f} us, util {_mean_util([fused]):5.1%}, DRAM {dram_f:7.1f} MB, split "
              f"{_fmt(fused.division.splits)}, row tile {fused.tiles['M']} | change {100 * (tf / ts - 1):+6.1f}% "
              f"-> {pick} | codegen {tc:.2f} s")
        print(f"          compile_graph's {_mlp_choice(m)}")


def _mlp_choice(m: int) -> str:
    """The scheduler's own cost-based choice for the MLP at M rows (meta tensors: no data)."""
    from spyre_lab.compiler.backend import compile_graph

    def mlp(x, wg, wu, wd):
        return (torch.nn.functional.silu(x @ wg) * (x @ wu)) @ wd

    shapes = [(m, HIDDEN), (HIDDEN, INTERMEDIATE), (HIDDEN, INTERMEDIATE), (INTERMEDIATE, HIDDEN)]
    program = compile_graph(mlp, [torch.empty(s, dtype=F16, device="meta") for s in shapes])
    return next(k.decision for k in program.kernels if k.decision)


# --- attention: one online-softmax kernel vs the unfused pattern, alone and in the 8B-shaped prefill layer ----

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128


def _layer(x, ln1, wq, wk, wv, wo, ln2, wg, wu, wd):
    """A Granite-3.3-8B-shaped decoder layer at prefill (no RoPE: it does not change the attention pattern)."""
    s = x.shape[0]

    def rms(t, w):
        return t * torch.rsqrt(t.float().pow(2).mean(-1, keepdim=True) + 1e-5).to(t.dtype) * w

    h = rms(x, ln1)
    q = (h @ wq).view(1, s, HEADS, HEAD_DIM).transpose(1, 2)
    k = (h @ wk).view(1, s, KV_HEADS, HEAD_DIM).transpose(1, 2)
    v = (h @ wv).view(1, s, KV_HEADS, HEAD_DIM).transpose(1, 2)
    a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    x = x + a.transpose(1, 2).reshape(s, HIDDEN) @ wo
    h = rms(x, ln2)
    return x + (torch.nn.functional.silu(h @ wg) * (h @ wu)) @ wd


def _layer_inputs(s: int) -> list[torch.Tensor]:
    shapes = [(s, HIDDEN), (HIDDEN,), (HIDDEN, HIDDEN), (HIDDEN, KV), (HIDDEN, KV), (HIDDEN, HIDDEN), (HIDDEN,),
              (HIDDEN, INTERMEDIATE), (HIDDEN, INTERMEDIATE), (INTERMEDIATE, HIDDEN)]
    return [torch.empty(sh, dtype=F16, device="meta") for sh in shapes]


def _program_us(program) -> tuple[float, dict[str, float]]:
    """Modeled time of a Program's device kernels (analytic), and the time per fusion rule."""
    by_rule: dict[str, float] = {}
    for launch in program.launches:
        if hasattr(launch, "simulate"):
            t = launch.simulate().time_us
            by_rule[launch.rule] = by_rule.get(launch.rule, 0.0) + t
    return sum(by_rule.values()), by_rule


def bench_attention() -> None:
    """Fused attention (online softmax, scores in LX) on/off: SDPA alone, the 8B-shaped prefill layer vs its floor."""
    from spyre_lab.compiler.backend import compile_graph

    print("\n== attention: rule 'attention' on vs off (CompileOptions().without('attention')), fp16, 32 cores ==")
    print("   floor = every matmul FLOP (projections, MLP and full Q K^T and P V) at the PE arrays' peak")
    on_opts, off_opts = CompileOptions(), CompileOptions().without("attention")

    def sdpa(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    for s in (128, 1024):
        ins = [torch.empty(1, h, s, HEAD_DIM, dtype=F16, device="meta") for h in (HEADS, KV_HEADS, KV_HEADS)]
        t0 = time.perf_counter()
        on, off = (compile_graph(sdpa, ins, o) for o in (on_opts, off_opts))
        tc = time.perf_counter() - t0
        (t_on, _), (t_off, _) = _program_us(on), _program_us(off)
        spec = next(x for x in on.launches if getattr(x, "rule", "") == "attention")
        r = spec.simulate()
        print(f"   SDPA causal GQA {HEADS}/{KV_HEADS} heads x {s} x {HEAD_DIM}: off {t_off:8.1f} us "
              f"({len(off.launches)} kernels) | on {t_on:8.1f} us ({len(on.launches)} kernels; attention kernel "
              f"{r.time_us:.1f} us, "
              f"{r.dram_bytes / 1e6:.1f} MB DRAM, bottleneck {r.bottleneck}) | on/off {t_on / t_off:5.2f} "
              f"| codegen {tc:.1f} s")
        print(f"      {spec.division.reason}")
    s = 1024
    linear = 2 * s * (2 * HIDDEN * HIDDEN + 2 * HIDDEN * KV + 3 * HIDDEN * INTERMEDIATE)
    attn = 2 * 2 * HEADS * s * s * HEAD_DIM
    floor_us = (linear + attn) / SPYRE.peak_flops * 1e6
    print(f"   8B-shaped prefill layer, sequence {s}: floor {floor_us / 1e3:.2f} ms "
          f"({linear / 1e9:.0f} GFLOP projections+MLP, {attn / 1e9:.1f} GFLOP attention)")
    for label, opts in (("off", off_opts), ("on ", on_opts)):
        t0 = time.perf_counter()
        program = compile_graph(_layer, _layer_inputs(s), opts)
        tc = time.perf_counter() - t0
        total, by_rule = _program_us(program)
        top = ", ".join(f"{rule} {t / 1e3:.2f}" for rule, t in sorted(by_rule.items(), key=lambda kv: -kv[1])[:5])
        print(f"   rule {label}: {total / 1e3:6.2f} ms modeled = {floor_us / total:5.1%} of the floor "
              f"({len(program.launches)} kernels; ms by rule: {top}) | compile {tc:.1f} s")


def _eager_paged_us(batch: int, context: int, block_size: int) -> tuple[float, int]:
    """The engine's eager attention ops (`grouped_paged_attention`) for one decode step of this shape, timed on the
    card in timing-only mode: (modeled device us summed over its launches, launches)."""
    import math

    from spyre_lab.engine.layers.attention import AttentionMetadata, causal_bias
    from spyre_lab.engine.platforms.paged_attention_op import grouped_paged_attention
    from spyre_lab.runtime.launch import timing_only
    from spyre_lab.runtime.timeline import recording

    blocks = math.ceil((context + 1) / block_size)
    num_blocks = batch * blocks
    cache = (num_blocks + 1, block_size, KV_HEADS, HEAD_DIM)
    tables = torch.arange(num_blocks).view(batch, blocks)
    positions = torch.full((batch, 1), context)
    meta = AttentionMetadata(tables[:, -1] * block_size + context % block_size, tables, torch.arange(batch).view(-1, 1),
                             causal_bias(positions, blocks * block_size, F16), torch.arange(batch))
    with timing_only():
        dev = AttentionMetadata(*(t.to("spyre") for t in (meta.slot_mapping, meta.block_tables, meta.query_index,
                                                           meta.attn_bias, meta.out_index)))
        q = torch.empty(batch, HEADS * HEAD_DIM, dtype=F16, device="spyre")
        kv = torch.empty(batch, KV_HEADS * HEAD_DIM, dtype=F16, device="spyre")
        kc, vc = (torch.empty(cache, dtype=F16, device="spyre") for _ in range(2))
        with recording() as trace:
            grouped_paged_attention(q, kv, kv, kc, vc, dev, HEADS, KV_HEADS, HEAD_DIM, HEAD_DIM ** -0.5)
    computes = [e for e in trace.events if e.lane.startswith("stream") and e.args.get("kind") == "Compute"]
    return sum(e.dur_us for e in computes), len(computes)


def bench_paged() -> None:
    """Paged decode attention as one kernel (KV write + attention through block tables) vs its DRAM floor."""
    from spyre_lab.compiler.tiling_paged_attention import PagedShape, context_blocks, plan_paged_attention

    block_size = 16                                   # the engine's default block size
    print(f"\n== paged attention: Granite-3.3-8B shape ({HEADS} q / {KV_HEADS} KV heads x {HEAD_DIM}), decode, "
          f"block size {block_size}, fp16 ==")
    print("   floor = context K/V bytes + Q + out at DRAM bandwidth; kernel time includes its launch "
          f"({SPYRE.kernel_launch_cycles / SPYRE.clock_hz * 1e6:.1f} us); eager = the engine's ~11-13 eager ops "
          "with the 'attention' rule off, device time summed")
    print(f"   {'batch':>5} {'context':>7} | {'kernel us':>9} {'floor us':>9} {'floor/kernel':>12} "
          f"{'(after launch)':>14} | {'cores':>5} {'split-KV':>8} {'bound':>7} | {'eager us':>9} {'ops':>4} "
          f"{'kernel/eager':>12} | plan s")
    for batch in (1, 4, 16):
        for context in (512, 2048, 8192):
            shape = PagedShape(HEADS, KV_HEADS, HEAD_DIM, block_size,
                               tuple((context_blocks(context, block_size), 1) for _ in range(batch)))
            t0 = time.perf_counter()
            plan = plan_paged_attention(shape, SPYRE)
            r = simulate(plan.kernel, SPYRE, mode="analytic", trace=False)
            tp = time.perf_counter() - t0
            floor = (shape.context_kv_bytes([context + 1] * batch) + shape.qo_bytes()) / SPYRE.dram_bandwidth * 1e6
            eager, ops = _eager_paged_us(batch, context, block_size)
            print(f"   {batch:>5} {context:>7} | {r.time_us:9.1f} {floor:9.1f} {floor / r.time_us:12.0%} "
                  f"{floor / (r.time_us - r.launch_us):14.0%} | {len(r.active_cores):>5} "
                  f"{'yes' if plan.split_kv else 'no':>8} {r.bottleneck:>7} | {eager:9.1f} {ops:>4} "
                  f"{r.time_us / eager:12.2f} | {tp:.1f}")
    one = PagedShape(HEADS, KV_HEADS, HEAD_DIM, block_size, ((context_blocks(8192, block_size), 1),))
    print(f"   plan (batch 1, context 8192): {plan_paged_attention(one, SPYRE).reason}")


SECTIONS = {"matmul": bench_matmul, "roofline": bench_roofline, "softmax": bench_softmax, "mlp": bench_mlp,
            "attention": bench_attention, "paged": bench_paged}


def main(argv: list[str]) -> None:
    names = chosen(parser(__doc__, SECTIONS).parse_args(argv).sections, SECTIONS)
    print(SPYRE.describe())
    print("all times are modeled microseconds on the simulator, not measurements of hardware\n")
    for name in names:
        SECTIONS[name]()


if __name__ == "__main__":
    main(sys.argv[1:])
