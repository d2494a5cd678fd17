"""Work division: the documented passes, their invariants, and the mechanism behind planned vs naive."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from spyre_lab.compiler.work_division import (
    divide_iteration_space,
    divide_matmul,
    divide_mlp,
    matmul_candidates,
    matmul_cost,
    ring_hops,
    slice_ranges,
)
from spyre_lab.device.config import SPYRE

FP16 = torch.float16
EPS = SPYRE.elems_per_stick(FP16)


def test_documented_span_example():
    # A[8192, 32768] @ W[32768, 4096]: A's 512 MB span forces K=2, then M takes the other 16 cores.
    d = divide_matmul(1, 8192, 4096, 32768, FP16, SPYRE)
    assert d.splits == {"M": 16, "N": 1, "K": 2}
    assert "span" in d.reason


def _matmul_spans(d, b, m, n, k):
    """Per-core span of A (outermost device dim K-sticks for 2-D) and W (N-sticks) in bytes."""
    s = d.splits
    a = math.ceil(k / EPS) // s["K"] * m * EPS * 2
    w = math.ceil(n / EPS) // s["N"] * k * EPS * 2
    return a, w


def _span_feasible(m, n, k):
    """Is there a K x N split (<= 32 cores) that keeps A, W and C within 256 MB per core (2-D default layouts)?"""
    ks, ns = math.ceil(k / EPS), math.ceil(n / EPS)
    limit = SPYRE.core_span_bytes
    return any(ks % sk == 0 and ns % sn == 0 and sk * sn <= SPYRE.cores
               and ks // sk * m * EPS * 2 <= limit and ns // sn * k * EPS * 2 <= limit
               and ns // sn * m * EPS * 2 <= limit
               for sk in range(1, 33) for sn in range(1, 33))


@settings(max_examples=40, deadline=None)
@given(m=st.sampled_from([1, 8, 96, 1024, 8192, 16384]), n=st.sampled_from([64, 320, 4096, 12800]),
       k=st.sampled_from([64, 4096, 12800, 32768, 65536]), strategy=st.sampled_from(["planned", "naive"]))
def test_matmul_splits_divide_evenly_in_whole_sticks(m, n, k, strategy):
    if strategy == "planned" and not _span_feasible(m, n, k):
        with pytest.raises(ValueError, match="chunk the tensor"):
            divide_matmul(1, m, n, k, FP16, SPYRE, strategy)
        return
    d = divide_matmul(1, m, n, k, FP16, SPYRE, strategy)
    s = d.splits
    assert d.cores_used <= SPYRE.cores
    assert m % s["M"] == 0
    assert math.ceil(n / EPS) % s["N"] == 0 and math.ceil(k / EPS) % s["K"] == 0  # whole sticks
    assert sorted(d.core_of_slice) == list(range(d.cores_used))
    if strategy == "naive":
        assert sum(v > 1 for v in s.values()) <= 1 and s["K"] == 1
    else:
        a_span, w_span = _matmul_spans(d, 1, m, n, k)
        assert a_span <= SPYRE.core_span_bytes and w_span <= SPYRE.core_span_bytes


@settings(max_examples=40, deadline=None)
@given(shape=st.lists(st.sampled_from([1, 3, 8, 48, 64, 100, 512, 1024]), min_size=1, max_size=3),
       reduce_last=st.booleans())
def test_iteration_space_invariants(shape, reduce_last):
    dims = {f"d{i}": s for i, s in enumerate(shape)}
    stick = f"d{len(shape) - 1}"
    reds = (stick,) if reduce_last else ()
    d = divide_iteration_space(dims, stick, reds, FP16, SPYRE)
    assert d.cores_used <= SPYRE.cores
    assert sum(d.splits[r] > 1 for r in reds) <= 1
    for dim, count in d.splits.items():
        units = math.ceil(dims[dim] / EPS) if dim == stick else dims[dim]
        assert units % count == 0
    ranges = slice_ranges(d, dims, (stick,), EPS, SPYRE.cores)
    busy = [r for r in ranges if r]
    assert len(busy) == d.cores_used
    for r in busy:
        assert r[stick][0] % EPS == 0  # every slice starts on a stick
    covered = sum(math.prod(hi - lo for lo, hi in r.values()) for r in busy)
    assert covered == math.prod(shape)


def test_a_span_no_split_can_fix_is_an_error_that_says_what_to_do():
    assert not _span_feasible(16384, 12800, 65536)
    with pytest.raises(ValueError, match="chunk the tensor"):
        divide_matmul(1, 16384, 12800, 65536, FP16, SPYRE)


def test_span_reduction_also_guards_pointwise_kernels():
    # [32768, 8192] fp16 = 512 MB laid out stick-column-major: one core would span all of it, so Pass 1
    # commits a 2-way split of the stick dim before the core split gives d0 the remaining 16 cores.
    d = divide_iteration_space({"d0": 32768, "d1": 8192}, "d1", (), FP16, SPYRE)
    assert d.splits == {"d0": 16, "d1": 2}
    assert "span" in d.reason


def test_core_split_counts_sticks():
    # 48 sticks on 32 cores: the largest divisor of 48 that fits is 24, so 8 cores idle.
    d = divide_iteration_space({"d0": 48 * EPS}, "d0", (), FP16, SPYRE)
    assert d.splits == {"d0": 24}


def test_at_most_one_reduction_dim_split():
    d = divide_iteration_space({"d0": 2, "d1": 64, "d2": 4096}, "d2", ("d1", "d2"), FP16, SPYRE)
    assert sum(d.splits[r] > 1 for r in ("d1", "d2")) <= 1
    assert d.cores_used == SPYRE.cores


def test_reduction_split_can_be_forbidden():
    d = divide_iteration_space({"d0": 4, "d1": 1024}, "d1", ("d1",), FP16, SPYRE, allow_reduction_split=False)
    assert d.splits == {"d1": 1, "d0": 4}


def test_naive_splits_one_output_dim_and_n_for_decode():
    d = divide_matmul(1, 1, 4096, 4096, FP16, SPYRE, "naive")
    assert d.splits == {"K": 1, "M": 1, "N": 32}
    d = divide_matmul(1, 4096, 1024, 4096, FP16, SPYRE, "naive")
    assert d.splits == {"K": 1, "M": 32, "N": 1}


def test_planned_4096_cube_uses_all_cores():
    d = divide_matmul(1, 4096, 4096, 4096, FP16, SPYRE)
    assert d.cores_used == 32
    assert d.cost.total_us == pytest.approx(min(
        c.total_us for s, c in matmul_candidates(1, 4096, 4096, 4096, FP16, SPYRE) if math.prod(s.values()) == 32))


def test_decode_planned_beats_naive_in_the_cost_model():
    planned = divide_matmul(1, 1, 4096, 4096, FP16, SPYRE)
    naive = divide_matmul(1, 1, 4096, 4096, FP16, SPYRE, "naive")
    assert planned.splits["K"] > 1  # M=1 cannot feed the PT rows, so K is split instead of 32-way N broadcasts
    assert planned.cost.total_us < naive.cost.total_us


def test_cost_terms_follow_the_formula():
    c = matmul_cost(1, 4, 8, 1, 1, 1024, 4096, 4096, SPYRE)
    mac_per_us = SPYRE.macs_per_cycle_per_core * SPYRE.clock_hz / 1e6
    assert c.compute_us == pytest.approx(1024 * 4096 * 4096 / 32 / mac_per_us)  # 256 rows: PT fully efficient
    assert c.hbm_us == pytest.approx((1024 * 4096 + 4096 * 4096 + 1024 * 4096) * 2 / SPYRE.dram_bandwidth * 1e6)
    assert c.psum_us == 0 and c.tiebreak_us == 0
    thin = matmul_cost(1, 32, 1, 1, 1, 128, 64, 64, SPYRE)  # 4 rows per core: half a PT pass
    assert thin.tiebreak_us == pytest.approx(math.log2(8 / 0.5) * 50)


def test_k_fast_places_partners_adjacent():
    for k_fast, expected in ((True, 1), (False, 16)):
        d = divide_matmul(1, 8192, 4096, 32768, FP16, SPYRE, k_fast=k_fast)
        m_n = d.splits["M"] * d.splits["N"]
        for s in range(d.cores_used):
            cores = [d.core_of_slice[p] for p in d.partners(s)]
            assert len(cores) == 2
            assert ring_hops(cores[0], cores[1], SPYRE.cores) == min(expected, m_n)


def test_hint_overrides_and_bad_hints_explain_themselves():
    d = divide_matmul(1, 1024, 4096, 4096, FP16, SPYRE, hint={"M": 2, "K": 4})
    assert d.splits == {"K": 4, "M": 2, "N": 1} and d.strategy == "hint"
    with pytest.raises(ValueError, match="must divide"):
        divide_matmul(1, 1024, 4096, 4096, FP16, SPYRE, hint={"M": 3})
    with pytest.raises(ValueError, match="names dim"):
        divide_matmul(1, 1024, 4096, 4096, FP16, SPYRE, hint={"Q": 2})
    with pytest.raises(ValueError, match="strategy"):
        divide_matmul(1, 64, 64, 64, FP16, SPYRE, strategy="clever")


@pytest.mark.parametrize("m", [1, 16, 128, 1024])
def test_mlp_division_splits_evenly_and_the_reduced_i_goes_first(m):
    i_sticks = math.ceil(12800 / EPS)
    for strategy in ("naive", "planned"):
        d = divide_mlp(m, 12800, 4096, True, FP16, SPYRE, strategy)
        assert next(iter(d.splits)) == "N" and d.split_reduction_dim in (None, "N")
        assert i_sticks % d.splits["N"] == 0 and m % d.splits["M"] == 0 and d.cores_used <= SPYRE.cores
    assert divide_mlp(m, 12800, 4096, True, FP16, SPYRE, "naive").splits["M"] == 1


def test_mlp_division_weighs_weight_rereads_per_row_tile():
    # rows that LX must cut into many tiles re-read the weights each time: splitting rows over more
    # cores (which share the weight reads as a broadcast) then beats splitting I
    free = divide_mlp(256, 2048, 1024, True, FP16, SPYRE)
    cramped = divide_mlp(256, 2048, 1024, True, FP16, SPYRE, row_tiles=lambda sn, sm: max(1, 256 // sm // 8))
    assert cramped.splits["M"] > free.splits["M"]
    assert "critical path" in cramped.reason


def test_decode_mlp_uses_every_core_its_i_sticks_allow():
    d = divide_mlp(1, 12800, 4096, True, FP16, SPYRE)
    assert d.splits["M"] == 1 and d.splits["N"] == 25  # 200 sticks: 25 is the largest divisor <= 32


def test_mlp_division_rejects_bad_dims():
    with pytest.raises(ValueError, match="MLP dim m"):
        divide_mlp(0, 128, 128, True, FP16, SPYRE)
