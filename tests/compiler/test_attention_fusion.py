"""The ``attention`` fusion rule: SDPA and the hand-written form become one online-softmax kernel, numerically SDPA."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spyre_lab.compiler.backend import compile_graph
from spyre_lab.compiler.executor import execute
from spyre_lab.compiler.options import CompileOptions
from spyre_lab.compiler.tiling_attention import online_attention

OFF = CompileOptions().without("attention")
ATOL = 2e-2          # fp16 storage of Q, K, V, P and the output against an fp32 CPU SDPA


def _sdpa(q, k, v, mask=None, causal=False):
    gqa = q.shape[1] != k.shape[1]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=gqa)


def _plain(q, k, v):
    return _sdpa(q, k, v)


def _causal(q, k, v):
    return _sdpa(q, k, v, causal=True)


def _attention_kernels(program):
    return [k for k in program.kernels if k.rule == "attention"]


def _qkv(b, h, hkv, m, n, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, heads, s, d, generator=g).half() for heads, s in ((h, m), (hkv, n), (hkv, n))]


def test_sdpa_becomes_one_attention_kernel_and_the_switch_restores_todays_kernels():
    q, k, v = _qkv(1, 4, 4, 96, 96, 64)
    on = compile_graph(_plain, [q, k, v])
    off = compile_graph(_plain, [q, k, v], OFF)
    assert len(_attention_kernels(on)) == 1
    assert not _attention_kernels(off) and any(k.rule == "softmax" for k in off.kernels)
    ref = _sdpa(q.float(), k.float(), v.float())
    for program in (on, off):
        out = execute(program, [q, k, v]).outputs[0]
        torch.testing.assert_close(out.float(), ref, atol=ATOL, rtol=0)


def test_the_score_matrix_never_travels_through_dram():
    q, k, v = _qkv(1, 4, 4, 128, 128, 64)
    on = compile_graph(_plain, [q, k, v])
    off = compile_graph(_plain, [q, k, v], OFF)

    def score_sized(program):
        return [b for kern in program.kernels for b in kern.outputs if program.buffers[b].numel >= 4 * 128 * 128]
    assert score_sized(off), "without the rule the scores are a kernel output"
    assert score_sized(on) == []
    spec = next(launch for launch in on.launches if getattr(launch, "rule", "") == "attention")
    assert "s" in spec.lx_plan.sizes and "p" in spec.lx_plan.sizes
    assert spec.simulate().dram_bytes < sum(x.simulate().dram_bytes for x in off.launches if hasattr(x, "simulate"))


def test_explain_shows_the_division_and_the_tile_choice():
    q, k, v = _qkv(1, 8, 2, 256, 256, 64)
    program = compile_graph(_causal, [q, k, v])
    spec = next(launch for launch in program.launches if getattr(launch, "rule", "") == "attention")
    text = spec.explain()
    assert "heads over" in text and "query tile" in text and "fit LX" in text
    assert set(spec.division.splits) == {"B", "M"} and math.prod(spec.division.splits.values()) <= 32


def test_causal_blocks_above_the_diagonal_are_skipped():
    q, k, v = (torch.empty(1, 32, 1024, 128, dtype=torch.float16, device="meta") for _ in range(3))
    causal = compile_graph(_causal, [q, k, v])
    full = compile_graph(_plain, [q, k, v])
    spec_c, spec_f = (next(x for x in p.launches if getattr(x, "rule", "") == "attention") for p in (causal, full))
    assert spec_c.flops < 0.8 * spec_f.flops and spec_c.simulate().time_us < spec_f.simulate().time_us
    names = [op.name for prog in spec_c.tile_kernel.programs for op in prog.ops]
    assert any(n.startswith("causal mask") for n in names), "diagonal blocks make their mask from indices"
    assert not any(n.startswith("load mask") for n in names), "a causal mask is never loaded"


def test_a_non_causal_constant_mask_is_loaded_tile_by_tile():
    def banded(q, k, v):
        i = torch.arange(q.shape[-2]).unsqueeze(1)
        mask = torch.where((i - torch.arange(k.shape[-2])).abs() < 8, 0.0, -math.inf).to(q.dtype)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    q, k, v = _qkv(1, 2, 2, 64, 64, 32)
    program = compile_graph(banded, [q, k, v])
    spec = next(x for x in program.launches if getattr(x, "rule", "") == "attention")
    assert any(op.name.startswith("load mask") for prog in spec.tile_kernel.programs for op in prog.ops)
    torch.testing.assert_close(execute(program, [q, k, v]).outputs[0].float(),
                               banded(q.float(), k.float(), v.float()), atol=ATOL, rtol=0)


def test_hand_written_attention_with_an_additive_mask_is_matched():
    def attn(q, k, v, mask):
        s = q @ k.transpose(-1, -2) * (1 / math.sqrt(q.shape[-1])) + mask
        return torch.softmax(s, dim=-1) @ v
    q, k, v = _qkv(2, 3, 3, 40, 72, 32)
    mask = torch.randn(40, 72).half()
    program = compile_graph(attn, [q, k, v, mask])
    assert len(_attention_kernels(program)) == 1
    out = execute(program, [q, k, v, mask]).outputs[0]
    torch.testing.assert_close(out.float(), _sdpa(q.float(), k.float(), v.float(), mask.float()), atol=ATOL, rtol=0)


def test_online_softmax_is_independent_of_the_tile_sizes():
    g = torch.Generator().manual_seed(1)
    q, kt, v = (torch.randn(*shape, generator=g) for shape in ((2, 33, 16), (2, 16, 70), (2, 70, 8)))
    outs = [online_attention(q, kt, v, [], lambda s, _: s, False, torch.float32, tq, tk)
            for tq, tk in ((1, 7), (64, 64))]
    torch.testing.assert_close(outs[0], outs[1], atol=2e-3, rtol=0)
    torch.testing.assert_close(outs[1], torch.softmax(q @ kt, -1) @ v, atol=2e-3, rtol=0)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(b=st.integers(1, 2), hkv=st.integers(1, 2), group=st.sampled_from([1, 2, 4]),
       m=st.sampled_from([1, 5, 33, 70]), n=st.sampled_from([1, 9, 64, 100]), d=st.sampled_from([16, 64]),
       kind=st.sampled_from(["none", "causal", "mask"]), seed=st.integers(0, 2**16))
def test_random_shapes_match_cpu_sdpa_within_fp16_tolerance(b, hkv, group, m, n, d, kind, seed):
    q, k, v = _qkv(b, hkv * group, hkv, m, n, d, seed)
    args = [q, k, v]
    if kind == "mask":
        g = torch.Generator().manual_seed(seed + 1)
        mask = torch.randn(m, n, generator=g).half()
        mask[torch.rand(m, n, generator=g) < 0.3] = -math.inf      # whole rows may be masked
        mask[0] = -math.inf
        args.append(mask)
        fn = lambda q, k, v, mask: _sdpa(q, k, v, mask)
    else:
        fn = lambda q, k, v: _sdpa(q, k, v, causal=kind == "causal")
    program = compile_graph(fn, args)
    assert len(_attention_kernels(program)) == 1
    out = execute(program, args).outputs[0].float()
    ref = fn(*[a.float() for a in args])
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=0, equal_nan=True)


@pytest.mark.parametrize("seq", [1, 17])
def test_torch_compile_on_the_device_runs_the_fused_kernel(seq):
    import spyre_lab  # noqa: F401  (registers the device)

    q, k, v = _qkv(1, 4, 2, seq, seq, 64, seed=seq)
    model = torch.compile(_causal, backend="spyre")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = model(*(x.to("spyre") for x in (q, k, v))).cpu()
    # the causal mask is an fp32 constant of the graph (with or without the rule): the runtime says it stores fp16
    assert all("stores torch.float32 tensors as float16" in str(w.message) for w in caught), [str(w.message)
                                                                                               for w in caught]
    torch.testing.assert_close(out.float(), _sdpa(q.float(), k.float(), v.float(), causal=True), atol=ATOL, rtol=0)


def _over_queries(q, k, v):
    return torch.softmax(q @ k.transpose(-1, -2) / 8, dim=-2) @ v


def _exp_of_max_minus_scores(q, k, v):
    s = q @ k.transpose(-1, -2) / 8
    e = torch.exp(s.amax(-1, keepdim=True) - s)
    return (e / e.sum(-1, keepdim=True)) @ v


def _sum_over_exp(q, k, v):
    s = q @ k.transpose(-1, -2) / 8
    e = torch.exp(s - s.amax(-1, keepdim=True))
    return (e.sum(-1, keepdim=True) / e) @ v


def _zero_where_every_score_is_finite(q, k, v):
    s = q @ k.transpose(-1, -2) / 8
    p = torch.softmax(s, dim=-1)
    return torch.where(s.ne(float("-inf")).all(-1, keepdim=True), torch.zeros_like(p), p) @ v


@pytest.mark.parametrize("fn", [_over_queries, _exp_of_max_minus_scores, _sum_over_exp,
                                _zero_where_every_score_is_finite], ids=lambda f: f.__name__.strip("_"))
def test_a_softmax_look_alike_is_not_taken_for_attention(fn):
    """Only a softmax over the keys (x - max, exp, / sum), and only SDPA's every-key-masked test before P V, is
    the online softmax; a chain with the same ops in another order, over another axis or under another
    condition must compile to what it computes."""
    q, k, v = _qkv(1, 2, 2, 32, 32, 16, seed=3)
    program = compile_graph(fn, [q, k, v])
    assert not _attention_kernels(program)
    out = execute(program, [q, k, v]).outputs[0].float()
    ref = fn(q.float(), k.float(), v.float())
    torch.testing.assert_close(out, ref, atol=ATOL * max(1.0, ref.abs().max().item() / 8), rtol=2e-2)
