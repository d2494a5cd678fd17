"""Split reductions run core by core: the executor's fast path gives bit for bit what a plain per-core emulation gives.

``reference_run_sliced`` below is the emulation written the obvious way (each core narrows its inputs, converts
them to fp32, runs its own matmul or reduction; partners' fp32 partials are combined in slice order and rounded
once). The executor shares the fp32 conversions between cores and assembles outputs without indexing, so
these tests compare the two on random shapes, layouts and (uneven) splits, outputs and every core's tile.
"""

from __future__ import annotations

import itertools
import random
import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spyre_lab.compiler import core_operands, per_core
from spyre_lab.compiler.backend import compile_graph
from spyre_lab.compiler.core_operands import ALIGNMENT, core_ranges, narrowed, plan_operands
from spyre_lab.compiler.per_core import (
    PARTIAL_COMBINE,
    CoreTile,
    _finish,
    _partial,
    _sliceable,
    _split_dims,
    run_kernel,
)
from spyre_lab.compiler.program import Program

# --- the per-core emulation, written the obvious way ----------------------------------------------


def _ref_narrow(t, axes, s, full):
    for i, name in enumerate(axes):
        if name in s and t.shape[i] == full[name] and s[name] != (0, full[name]):
            a, b = s[name]
            t = t.narrow(i, a, b - a)
    return t


def _ref_core_values(nodes, anchor, access, env, s, local=None):
    local = {} if local is None else local
    for node in nodes:
        acc = access[node.name]
        ins = [local[r.buffer] if r.buffer in local else _ref_narrow(r.apply(env[r.buffer]), r.axes, s, node.dims)
               for r in acc.reads]
        if node is anchor and any(d in node.reduction_dims for d in s):
            local[node.output] = _partial(node, ins, acc)
        else:
            local[node.output] = _ref_narrow(acc.op_fn(*ins), acc.out_axes, s, node.dims)
    return local


def reference_run_sliced(kernel, program: Program, env, slices) -> list[CoreTile]:
    access, anchor = program.access, kernel.anchor
    split = _split_dims(kernel, slices)
    partial_dims = [d for d in anchor.dims if d in split and d in anchor.reduction_dims]
    first = kernel.nodes[:1] if partial_dims else kernel.nodes
    tiles = [CoreTile(c, dict(s), _ref_core_values(first, anchor, access, env, {d: r for d, r in s.items()
                                                                                   if d in split}))
             for c, s in enumerate(slices) if s]
    if partial_dims:
        combine = PARTIAL_COMBINE[anchor.op]
        kept = [d for d in anchor.dims if d not in partial_dims]
        blocks: dict[tuple, list[CoreTile]] = {}
        for t in tiles:
            blocks.setdefault(tuple(t.slice.get(d, (0, anchor.dims[d])) for d in kept), []).append(t)
        for group in blocks.values():
            group.sort(key=lambda t: tuple(t.slice[d][0] for d in partial_dims))
            total = group[0].values[anchor.output]
            for t in group[1:]:
                total = combine(total, t.values[anchor.output])
            for t in group[1:]:
                t.values[anchor.output + ".partial"] = t.values.pop(anchor.output)
            leader = group[0]
            leader.values[anchor.output + ".partial"] = leader.values[anchor.output]
            leader.values[anchor.output] = _finish(anchor, total, access[anchor.name],
                                                   program.buffers[anchor.output].dtype)
            s = {d: r for d, r in leader.slice.items() if d in split and d not in partial_dims}
            _ref_core_values(kernel.nodes[1:], anchor, access, env, s, local=leader.values)
    for name in kernel.outputs:
        info = program.buffers[name]
        node = next(n for n in kernel.nodes if n.output == name)
        out_axes = access[node.name].out_axes
        full = torch.empty(info.shape, dtype=info.dtype)
        for t in tiles:
            if name in t.values:
                index = tuple(slice(*t.slice[a]) if a in split and info.shape[i] == node.dims[a] else slice(None)
                              for i, a in enumerate(out_axes))
                full[index] = t.values[name]
        env[name] = full
    return tiles


# --- random splits --------------------------------------------------------------------------------


def _cuts(rng: random.Random, size: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous ranges covering [0, size), uneven at random."""
    parts = max(1, min(parts, size))
    inner = sorted(rng.sample(range(1, size), parts - 1)) if parts > 1 else []
    bounds = [0, *inner, size]
    return list(itertools.pairwise(bounds))


def random_slices(rng: random.Random, dims: dict[str, int], parts: dict[str, int], idle: int = 0
                  ) -> list[dict[str, tuple[int, int]]]:
    """A grid of per-core slices over ``dims`` (``parts`` ranges per dim), in a random core order, plus idle cores."""
    axes = {d: _cuts(rng, n, parts.get(d, 1)) for d, n in dims.items()}
    slices = [dict(zip(axes, combo)) for combo in itertools.product(*axes.values())]
    slices += [{} for _ in range(idle)]
    rng.shuffle(slices)
    return slices


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit: same dtype, shape and bytes (NaNs included)."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(_bits(a), _bits(b))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(t.shape, dtype=t.dtype).copy_(t).view(-1).view(torch.uint8)


def assert_kernels_match_reference(program: Program, inputs, slices_for) -> int:
    """Run every kernel of ``program`` both ways with the slices ``slices_for(kernel)`` gives; every output
    and every tile value must match bit for bit. Returns how many kernels ran split."""
    env = dict(zip(program.inputs, inputs)) | dict(program.constants)
    ran_split = 0
    for kernel in program.kernels:
        slices = slices_for(kernel)
        fast_env, ref_env = dict(env), dict(env)
        if slices and _sliceable(kernel, program.access, slices):
            ran_split += any(d in kernel.anchor.reduction_dims for d in _split_dims(kernel, slices))
            ref = reference_run_sliced(kernel, program, ref_env, slices)
        else:
            ref = run_kernel(kernel, program, ref_env)
        fast = run_kernel(kernel, program, fast_env, slices)
        bare_env = dict(env)
        assert run_kernel(kernel, program, bare_env, slices, tiles=False) == []
        for name in kernel.outputs:
            for got in (fast_env[name], bare_env[name]):
                assert _same(got, ref_env[name]), f"{kernel.name}: output {name} differs"
                assert got.stride() == ref_env[name].stride(), f"{kernel.name}: output {name} laid out anew"
        assert [(t.core, t.slice, sorted(t.values)) for t in fast] == [(t.core, t.slice, sorted(t.values)) for t in ref]
        for f, r in zip(fast, ref):
            for key in r.values:
                assert _same(f.values[key], r.values[key]), f"{kernel.name}: core {f.core} {key} differs"
        env = ref_env
    return ran_split


def _compile(fn, inputs) -> Program:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")        # fp32 / fallback notices are not what these tests are about
        return compile_graph(fn, inputs)


# --- split matmuls --------------------------------------------------------------------------------

EPILOGUES = {
    "none": lambda y, b: y,
    "bias_relu": lambda y, b: torch.relu(y + b),
    "silu_mul": lambda y, b: F.silu(y) * b,
    "scale": lambda y, b: y * 0.125,
}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(m=st.integers(1, 40), k=st.integers(2, 300), n=st.integers(1, 200), batch=st.sampled_from([0, 1, 3]),
       weight=st.sampled_from(["kn", "nk"]), dtype=st.sampled_from([torch.float16, torch.float32]),
       epilogue=st.sampled_from(sorted(EPILOGUES)), parts=st.tuples(st.sampled_from([1, 1, 2, 3]),
                                                                   st.sampled_from([1, 2, 5]), st.integers(2, 5)),
       seed=st.integers(0, 2**16))
def test_split_matmuls_match_the_per_core_emulation(m, k, n, batch, weight, dtype, epilogue, parts, seed):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    lead = (batch,) if batch else ()
    x = (torch.randn(*lead, m, k) * rng.choice([1.0, 30.0, 1e-3])).to(dtype)
    w = torch.randn(*((n, k) if weight == "nk" else (k, n))).to(dtype) * 0.2
    b = torch.randn(n).to(dtype)

    def fn(x, w, b):
        return EPILOGUES[epilogue](x @ (w.t() if weight == "nk" else w), b)

    program = _compile(fn, [x, w, b])
    split = {"M": parts[0], "N": parts[1], "K": parts[2]}
    ran = assert_kernels_match_reference(
        program, [x, w, b], lambda kern: random_slices(rng, kern.anchor.dims, split, idle=rng.choice([0, 2])))
    if not batch or epilogue == "none":          # (a batched matmul's epilogue is computed whole)
        assert ran, "a K-split matmul ran core by core"


@pytest.mark.parametrize("weight", ["kn", "nk"])
@pytest.mark.parametrize("shape", [(1, 128, 256), (1, 256, 128), (1, 128, 46), (64, 128, 512), (5, 192, 97)])
def test_decode_shaped_projections_match_the_per_core_emulation(shape, weight):
    # the engine's decode projections: one row, the weight stored (K, N) or (N, K) read transposed, K split in 64s
    m, k, n = shape
    torch.manual_seed(k + n)
    x = torch.randn(m, k).half()
    w = (torch.randn(*((k, n) if weight == "kn" else (n, k))) / k ** 0.5).half()
    program = _compile(lambda x, w: x @ (w if weight == "kn" else w.t()), [x, w])

    def slices(kern):
        dims = kern.anchor.dims
        if "K" not in dims:
            return None
        grid = {"K": [(a, min(a + 64, dims["K"])) for a in range(0, dims["K"], 64)],
                "N": [(a, min(a + 64, dims["N"])) for a in range(0, dims["N"], 64)]}
        return [{**{d: (0, s) for d, s in dims.items()}, "K": kr, "N": nr} for nr in grid["N"] for kr in grid["K"]]

    assert assert_kernels_match_reference(program, [x, w], slices) == (k > 64)


# --- split lone reductions ------------------------------------------------------------------------

@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.lists(st.integers(1, 90), min_size=1, max_size=3), op=st.sampled_from(["sum", "mean", "amax", "amin"]),
       which=st.sampled_from(["last", "all", "first"]), keepdim=st.booleans(),
       dtype=st.sampled_from([torch.float16, torch.float32]), permuted=st.booleans(),
       parts=st.lists(st.integers(1, 4), min_size=3, max_size=3), seed=st.integers(0, 2**16))
def test_split_reductions_match_the_per_core_emulation(shape, op, which, keepdim, dtype, permuted, parts, seed):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    x = (torch.randn(*shape) * torch.randn(*shape).mul(4).exp()).to(dtype)     # wide range: inexact fp32 sums
    dims = {"last": [-1], "all": list(range(len(shape))), "first": [0]}[which]

    def fn(x):
        if permuted and x.dim() > 1:
            x = x.transpose(0, -1)
        return getattr(x, op)(dim=dims, keepdim=keepdim)

    program = _compile(fn, [x])
    ran = assert_kernels_match_reference(
        program, [x], lambda kern: random_slices(rng, kern.anchor.dims, dict(zip(kern.anchor.dims, parts)),
                                                 idle=rng.choice([0, 1])))
    reduced = {d for kern in program.kernels for d in kern.anchor.reduction_dims}
    if any(kern.anchor.dims.get(d, 1) > 1 and p > 1 for kern in program.kernels
           for d, p in zip(kern.anchor.dims, parts) if d in reduced) and len(program.kernels) == 1:
        assert ran, "a split reduction ran core by core"


def test_partials_meet_in_slice_order_not_any_order():
    # fp32 values over a wide range: adding the partners' partials in another order changes the last bits
    torch.manual_seed(3)
    x = torch.randn(6, 4096) * torch.randn(6, 4096).mul(6).exp()
    program = _compile(lambda t: t.sum(-1), [x])
    kern = program.kernels[0]
    cuts = [(a, a + 512) for a in range(0, 4096, 512)]
    slices = [{"d0": (r, r + 2), "d1": c} for r in (0, 2, 4) for c in cuts]
    assert assert_kernels_match_reference(program, [x], lambda k: slices) == 1
    env = {program.inputs[0]: x}
    run_kernel(kern, program, env, slices)
    parts = [x[:, a:b].sum(-1) for a, b in cuts]
    in_order, reversed_order = parts[0], parts[-1]
    for p, q in zip(parts[1:], reversed(parts[:-1])):
        in_order, reversed_order = in_order + p, reversed_order + q
    assert torch.equal(env[kern.outputs[0]], in_order)
    assert not torch.equal(in_order, reversed_order), "the data is chosen so that the order shows"


# --- the shared operands themselves ---------------------------------------------------------------

@settings(max_examples=80, deadline=None)
@given(shape=st.lists(st.integers(1, 70), min_size=1, max_size=3), order=st.randoms(use_true_random=False),
       dtype=st.sampled_from([torch.float16, torch.bfloat16, torch.float32, torch.float64]),
       convert=st.booleans(), parts=st.lists(st.integers(1, 4), min_size=3, max_size=3), seed=st.integers(0, 999))
def test_shared_operands_are_what_each_core_would_convert(shape, order, dtype, convert, parts, seed):
    rng = random.Random(seed)
    perm = list(range(len(shape)))
    order.shuffle(perm)
    x = torch.randn(*shape).to(dtype).permute(perm)              # any stride order
    axes = [f"a{i}" for i in range(x.dim())]
    dims = dict(zip(axes, x.shape))
    slices = [s for s in random_slices(rng, dims, dict(zip(axes, parts))) if s]
    ranges = [core_ranges(axes, x.shape, dims, s) for s in slices]
    got = plan_operands(x, ranges, convert)(x)
    for r, op in zip(ranges, got):
        own = narrowed(x, r)
        own = own.float() if convert else own
        assert op.dtype == own.dtype and op.shape == own.shape and op.stride() == own.stride()
        assert _same(op, own)
        if op.untyped_storage().data_ptr() == x.untyped_storage().data_ptr():    # a view of x, as the core's is
            assert own.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
            assert op.storage_offset() == own.storage_offset()
        else:                                         # a conversion: where a fresh one starts (64-byte aligned)
            assert op.data_ptr() % ALIGNMENT == own.data_ptr() % ALIGNMENT == 0


def test_decode_projection_operands_are_converted_once_per_group():
    # a (1, 128) activation and a (128, 256) row-major weight, K and N split in 64s: 8 cores
    x, w = torch.randn(1, 128).half(), torch.randn(128, 256).half()
    slices = [{"M": (0, 1), "K": (k, k + 64), "N": (n, n + 64)} for n in range(0, 256, 64) for k in (0, 64)]
    own = [{d: r for d, r in s.items() if d != "M"} for s in slices]
    dims = {"M": 1, "K": 128, "N": 256}
    a = plan_operands(x, [core_ranges(("M", "K"), x.shape, dims, s) for s in own], convert=True)
    b = plan_operands(w, [core_ranges(("K", "N"), w.shape, dims, s) for s in own], convert=True)
    assert len(a.sources.ranges) == 1 and len(b.sources.ranges) == 4    # one conversion per column block, not per core


@pytest.mark.parametrize("case", ["matmul", "sum"])
def test_large_sources_are_converted_core_by_core(monkeypatch, case):
    # above the share limit every core converts its own slice when it runs: the same numbers, no fp32 copy of
    # the whole source held while the cores run
    monkeypatch.setattr(core_operands, "SHARE_LIMIT_BYTES", 0)
    torch.manual_seed(7)
    rng = random.Random(7)
    if case == "matmul":
        x, w = torch.randn(3, 150).half(), torch.randn(150, 90).half()
        program, inputs, parts = _compile(lambda x, w: x @ w, [x, w]), [x, w], {"K": 3, "N": 2}
    else:
        x = torch.randn(5, 300).half()
        program, inputs, parts = _compile(lambda t: t.sum(-1), [x]), [x], {"d0": 2, "d1": 4}
    plans = []
    real = core_operands.plan_operands
    monkeypatch.setattr(per_core, "plan_operands", lambda *a: plans.append(real(*a)) or plans[-1])
    assert assert_kernels_match_reference(program, inputs, lambda k: random_slices(rng, k.anchor.dims, parts)) == 1
    assert plans and all(isinstance(p, core_operands.OnDemand) for p in plans)


def test_a_weight_read_again_unchanged_reuses_its_conversion_and_a_changed_one_does_not():
    """A launch that reads the very same, unchanged tensor as the last one (a weight) reuses its fp32 operands; the
    same tensor changed in place, or another tensor, is converted again. Every result is bit for bit the
    per-core emulation's."""
    torch.manual_seed(0)
    x, w = torch.randn(4, 256).half(), (torch.randn(256, 128) * 0.1).half()
    program = _compile(lambda x, w: x @ w, [x, w])
    (kernel,) = program.kernels
    rng = random.Random(0)
    slices = random_slices(rng, kernel.anchor.dims, {"N": 2, "K": 4})
    assert _sliceable(kernel, program.access, slices)
    conversions = []
    real_float = torch.Tensor.float

    def counting_float(t):
        conversions.append(t.shape)
        return real_float(t)

    def run(x_in, w_in):
        env = dict(zip(program.inputs, [x_in, w_in]))
        ref_env = dict(env)
        reference_run_sliced(kernel, program, ref_env, slices)
        torch.Tensor.float = counting_float
        try:
            run_kernel(kernel, program, env, slices, tiles=False)
        finally:
            torch.Tensor.float = real_float
        assert _same(env[kernel.anchor.output], ref_env[kernel.anchor.output])

    def conversions_in(x_in, w_in) -> int:
        before = len(conversions)
        run(x_in, w_in)
        return len(conversions) - before

    def activation():
        return torch.randn(4, 256).half()

    conversions_in(x, w)                           # the first launch also checks the shared layout
    only_x = conversions_in(activation(), w)       # a new activation, the same weight: only x is converted
    other = (torch.randn(256, 128) * 0.1).half()
    both = conversions_in(activation(), other)
    assert 0 < only_x < both
    other.mul_(2)                                  # the same tensor, changed in place: converted again
    assert conversions_in(activation(), other) == both
