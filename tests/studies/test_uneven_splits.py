"""Every shape plans: awkward sizes (primes, the Granite-8B vocabulary) split unevenly, numerics intact."""

import math
import warnings

import pytest
import torch

from spyre_lab.compiler import CompileOptions, compile_graph
from spyre_lab.compiler.executor import execute
from spyre_lab.compiler.kernel_spec import KernelSpec
from spyre_lab.compiler.work_division import chunk_counts, divide_matmul, imbalance, slice_ranges
from spyre_lab.device.config import SPYRE

FP16 = torch.float16
EPS = SPYRE.elems_per_stick(FP16)


def _head(x, w):
    return (x @ w) / 8.0


def _plan(m, vocab, hidden, options=None):
    x = torch.empty(m, hidden, dtype=FP16, device="meta")
    w = torch.empty(hidden, vocab, dtype=FP16, device="meta")
    return compile_graph(_head, [x, w], options or CompileOptions())


@pytest.mark.parametrize("vocab", [49155, 49159])
@pytest.mark.parametrize("m", [1, 1024])
def test_granite_8b_lm_head_plans_and_is_timed(m, vocab):
    # 769 sticks of vocabulary (a prime): no even split brings the 403 MB weight under the 256 MB
    # per-core span, so torch-spyre's even rule leaves the kernel unplanned and the model untimed.
    with pytest.warns(UserWarning, match="no tile plan"):
        even = _plan(m, vocab, 4096, CompileOptions(uneven_splits=False))
    assert even.modeled_time_us() is None
    program = _plan(m, vocab, 4096)
    spec = program.launches[0]
    assert isinstance(spec, KernelSpec)
    assert spec.division.uneven and spec.division.splits["N"] > 1
    assert program.modeled_time_us() > 0


def test_chunk_counts_leave_no_slice_empty():
    assert 31 in chunk_counts(769, 32) and 32 not in chunk_counts(769, 32)
    for n in (1, 2, 7, 65, 769, 1024):
        for s in chunk_counts(n, 32):
            chunk = math.ceil(n / s)
            assert 0 < n - (s - 1) * chunk <= chunk
    assert chunk_counts(1, 32) == [1]


def test_uneven_slices_cover_the_space_once_and_start_on_sticks():
    d = divide_matmul(1, 1, 49159, 4096, FP16, SPYRE, uneven=True)
    ranges = [r for r in slice_ranges(d, {"B": 1, "M": 1, "N": 49159, "K": 4096}, ("N", "K"), EPS, SPYRE.cores) if r]
    assert len(ranges) == d.cores_used
    assert sum(math.prod(hi - lo for lo, hi in r.values()) for r in ranges) == 49159 * 4096
    assert all(r["N"][0] % EPS == 0 and r["K"][0] % EPS == 0 for r in ranges)


def test_imbalance_is_charged_by_the_cost_model():
    # the same core count, one split even and one not: the uneven one carries the imbalance on compute
    even = divide_matmul(1, 1024, 64 * EPS, 4096, FP16, SPYRE, hint={"M": 1, "N": 32}, uneven=True)
    lop = divide_matmul(1, 1024, 63 * EPS, 4096, FP16, SPYRE, hint={"M": 1, "N": 32}, uneven=True)
    assert imbalance({"N": 32}, {"N": 63}) == pytest.approx(64 / 63)
    assert lop.imbalance > 1 and even.imbalance == 1
    # the busiest core holds 2 sticks in both, so compute is the same though the uneven one has less work
    assert lop.cost.compute_us == pytest.approx(even.cost.compute_us)
    assert lop.cost.compute_us > even.cost.compute_us * 63 / 64


def test_even_rule_is_unchanged_without_uneven():
    d = divide_matmul(1, 1024, 65 * EPS, 4096, FP16, SPYRE)
    assert 65 % d.splits["N"] == 0 and 1024 % d.splits["M"] == 0
    assert "uneven" not in d.reason


@pytest.mark.parametrize("m,hidden,vocab", [(1, 128, 1), (3, 128, 97), (5, 192, 4099), (2, 128, 49159),
                                            (1, 64, 49155), (17, 128, 1031)])
def test_awkward_vocab_sizes_match_cpu_core_by_core(m, hidden, vocab):
    torch.manual_seed(vocab)
    x = torch.randn(m, hidden, dtype=FP16)
    w = (torch.randn(hidden, vocab) / hidden ** 0.5).to(FP16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")           # no "no tile plan" warning: every kernel plans
        program = compile_graph(_head, [x, w])
    assert program.modeled_time_us() is not None
    if vocab >= 4099:
        assert any(getattr(spec, "division", None) is not None and spec.division.uneven for spec in program.launches)
    ref = ((x.float() @ w.float()) / 8.0)
    whole = execute(program, [x, w]).outputs[0]
    cores = execute(program, [x, w], tile_by_tile=True).outputs[0]
    assert torch.equal(whole, cores)
    torch.testing.assert_close(whole.float(), ref, atol=2e-2, rtol=2e-2)


def _gather(table, index):
    return table.index_select(0, index)


@pytest.mark.parametrize("rows", [1, 64])
def test_a_gather_reads_the_rows_it_selects_not_the_whole_table(rows):
    # the 8B rotary table (131072 positions) or a KV cache: a gather's cost follows the index, not the table
    times = []
    for table_rows in (2048, 131072):
        table = torch.empty(table_rows, 128, dtype=FP16, device="meta")
        index = torch.empty(rows, dtype=torch.long, device="meta")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            times.append(compile_graph(_gather, [table, index]).modeled_time_us())
    assert times[0] == pytest.approx(times[1])


def test_gather_numerics_match_cpu():
    table = torch.randn(300, 128, dtype=FP16)
    index = torch.tensor([5, 299, 0, 5, 17])
    program = compile_graph(_gather, [table, index])
    assert torch.equal(execute(program, [table, index]).outputs[0], table.index_select(0, index))
