"""The cores' matmuls in one bmm: taken only where it is every core's own product, bit for bit, and then the
outputs and every core's tile are what the plain per-core emulation gives."""

from __future__ import annotations

import torch
from compiler.test_executor_split import _compile, _same, assert_kernels_match_reference

from spyre_lab.compiler import batched_cores, per_core
from spyre_lab.compiler.batched_cores import Tiles, batch_is_exact
from spyre_lab.compiler.core_operands import core_ranges, narrowed


def _decode_slices(kern):
    dims = kern.anchor.dims
    return [{**{d: (0, s) for d, s in dims.items()}, "K": (k, k + 64), "N": (n, n + 64)}
            for n in range(0, dims["N"], 64) for k in range(0, dims["K"], 64)]


def _counting_bmm(monkeypatch) -> list[int]:
    calls = []
    real = torch.bmm
    monkeypatch.setattr(torch, "bmm", lambda a, b: calls.append(a.shape[0]) or real(a, b))
    return calls


def test_a_decode_projection_runs_its_cores_in_one_bmm_with_the_per_core_numbers(monkeypatch):
    # one row, K split in two 64s, N in four: eight cores, the products from one call where the probe agrees
    torch.manual_seed(3)
    x, w = torch.randn(1, 128).half(), (torch.randn(128, 256) / 12).half()
    program = _compile(lambda x, w: x @ w, [x, w])
    (kernel,) = program.kernels
    slices = _decode_slices(kernel)
    calls = _counting_bmm(monkeypatch)
    assert assert_kernels_match_reference(program, [x, w], lambda k: slices) == 1
    plan = per_core._sliced_plan(kernel, program, slices)
    layouts = [next(iter(t.values())).own for t in plan.tilings]
    if batch_is_exact(layouts[0], layouts[1], 8):
        assert calls and all(c == 8 for c in calls)
    else:
        assert not calls


def test_where_the_probe_disagrees_every_core_keeps_its_own_call(monkeypatch):
    monkeypatch.setattr(per_core, "batch_is_exact", lambda *a: False)
    torch.manual_seed(4)
    x, w = torch.randn(1, 192).half(), (torch.randn(192, 128) / 14).half()
    program = _compile(lambda x, w: x @ w, [x, w])
    calls = _counting_bmm(monkeypatch)
    assert assert_kernels_match_reference(program, [x, w], _decode_slices) == 1
    assert not calls


def test_the_probe_answers_what_a_direct_comparison_answers():
    # layouts of the decode step's operands, the lm head's odd 46 columns among them
    batched_cores._EXACT.clear()
    for a, b, cores in [(((1, 64), (128, 1)), ((64, 64), (64, 1)), 8), (((1, 64), (128, 1)), ((64, 46), (46, 1)), 2),
                        (((4, 64), (64, 1)), ((64, 32), (32, 1)), 4)]:
        g = torch.Generator().manual_seed(11)
        sa = torch.randn(cores, *a[0], generator=g).half().float()
        sb = torch.randn(cores, *b[0], generator=g).half().float()
        own = [torch.matmul(torch.empty_strided(*a).copy_(sa[c]), torch.empty_strided(*b).copy_(sb[c]))
               for c in range(cores)]
        direct = all(_same(p, q) for p, q in zip(torch.bmm(sa, sb), own))
        assert batch_is_exact(a, b, cores) == direct


def test_a_stack_holds_every_core_s_own_conversion():
    x = torch.randn(128, 256).half()
    dims = {"M": 1, "K": 128, "N": 256}
    own = [{"K": (k, k + 64), "N": (n, n + 64)} for k in (0, 64) for n in range(0, 256, 64)]
    ranges = [core_ranges(("K", "N"), x.shape, dims, s) for s in own]
    tiles = Tiles.of(x, ranges)
    assert tiles is not None and tiles.grid == (2, 4) and tiles.index is None
    stacked = tiles(x)
    for item, r in zip(stacked, ranges):
        assert _same(item, narrowed(x, r).float())
    a = torch.randn(1, 128).half()
    a_ranges = [core_ranges(("M", "K"), a.shape, dims, s) for s in own]
    a_tiles = Tiles.of(a, a_ranges)
    assert a_tiles is not None and a_tiles.index is not None
    for item, r in zip(a_tiles(a), a_ranges):
        assert _same(item, narrowed(a, r).float())
    uneven = [core_ranges(("K", "N"), x.shape, dims, {"K": (0, 100)}), core_ranges(("K", "N"), x.shape, dims,
                                                                                 {"K": (100, 128)})]
    assert Tiles.of(x, uneven) is None
    assert Tiles.of(x.float(), ranges) is None          # an fp32 source's operands are its own views: not stacked


def test_layers_weights_read_in_turn_keep_their_stacks_and_a_changed_one_is_stacked_again(monkeypatch):
    # one program piece runs once per layer: each layer's weight comes back every step; the numbers are always
    # the per-core emulation's, a weight changed in place included
    torch.manual_seed(5)
    x = torch.randn(1, 128).half()
    weights = [(torch.randn(128, 256) / 12).half() for _ in range(3)]
    program = _compile(lambda x, w: x @ w, [x, weights[0]])
    (kernel,) = program.kernels
    slices = _decode_slices(kernel)
    made = []
    real = Tiles.__call__
    monkeypatch.setattr(Tiles, "__call__", lambda self, t: made.append(t.shape) or real(self, t))

    def weight_stacks(w) -> int:
        before = sum(1 for shape in made if shape == w.shape)
        assert_kernels_match_reference(program, [x, w], lambda k: slices)
        return sum(1 for shape in made if shape == w.shape) - before

    plan_layouts = None
    for w in weights:
        weight_stacks(w)
        plan = per_core._sliced_plan(kernel, program, slices)
        plan_layouts = [next(iter(t.values())).own for t in plan.tilings]
    if not batch_is_exact(plan_layouts[0], plan_layouts[1], 8):
        return                                  # (this BLAS gives a batch item other numbers: no stacks at all)
    assert [weight_stacks(w) for w in weights] == [0, 0, 0]
    weights[1].mul_(-1)
    assert [weight_stacks(w) for w in weights] == [0, 1, 0]


def test_every_stack_is_dense_whatever_the_source_layout():
    # a row-major or transposed source, one row or a grid of tiles, picked or in grid order: the stack is what
    # the probe multiplied, a fresh dense tensor, and each item holds its core's own conversion
    dims = {"M": 4, "K": 128, "N": 128}
    for source in (torch.randn(4, 128).half(), torch.randn(128, 4).half().t()):
        for own in ([{"K": (0, 64)}, {"K": (64, 128)}], [{"K": (64, 128)}, {"K": (0, 64)}]):
            ranges = [core_ranges(("M", "K"), source.shape, dims, s) for s in own]
            tiles = Tiles.of(source, ranges)
            stacked = tiles(source)
            assert stacked.stride() == (4 * 64, 64, 1)
            for item, r in zip(stacked, ranges):
                assert _same(item, narrowed(source, r).float())
