"""Compiled kernels -> KTIR -> back: the imported kernel computes the compiled kernel's numbers and takes its modeled
time, within 1%, on the ``datasheet`` machine (a 4 us launch per kernel) and on ``measured`` (no fixed term: these
small kernels take a fraction of a microsecond, so any difference shows in full). The text carries the plan's
stick-padded strides and its buffer phases (docs/ktir.md). A kernel outside what the writer covers must say so
with KTIRUnsupported, never write a wrong kernel.

Two kernels of the granite layer are held at their own bound: fused attention (its online softmax is written as
the dialect's ops, a different set of SFU passes from the compiler's attention plan: within 2%), and a
restickify whose core slices cut the source's stick dim off a stick boundary (the compiler counts each piece
as whole sticks, the reader the sticks its addresses touch: never faster, at most 12% slower). A cat along a
dim the plan splits is held at its own bound too: the plan loads a piece at each core's own tile of the cat
dim, the text loads it whole as one broadcast to the cores of its rows (never slower, at most 2% faster)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from spyre_lab.compiler.backend import compile_graph
from spyre_lab.compiler.examples import granite_layer, layer_inputs
from spyre_lab.device.config import DATASHEET, MEASURED
from spyre_lab.ktir.roundtrip import round_trip

BAND = {"attention": 0.02}


def _check(records, must_export: int) -> None:
    exported = [r for r in records if r.exported]
    assert len(exported) >= must_export, [r.reason for r in records if not r.exported]
    for r in records:
        if not r.exported:
            assert r.reason.startswith("not written as KTIR: "), r.reason
            continue
        # silu is written x / (1 + exp(-x)): one fp16 rounding from the compiled kernel's torch silu
        assert r.max_abs_error <= 8e-3, f"{r.kernel}: KTIR differs from the compiled kernel by {r.max_abs_error}"
        # fused attention: the reader shares the K/V tiles one head's cores load at the same step, the compiled
        # plan claims no such broadcast; with each core loading its own the two agree, and sharing only helps
        ktir_us = r.ktir_private_us or r.ktir_us
        if r.ktir_private_us:
            assert all(r.ktir_us[m] <= r.ktir_private_us[m] * 1.001 for m in r.ktir_us), r.kernel
        for mode, t in r.compiled_us.items():
            if r.rule == "restickify" and ktir_us[mode] > t * 1.01:   # a slice cut off a stick boundary
                assert ktir_us[mode] <= 1.12 * t, f"{r.kernel} {mode}: {ktir_us[mode]} vs {t} us"
                continue
            if "tensor.extract_slice" in r.text and ktir_us[mode] < t * 0.99:   # a cat along a split dim
                # the compiler's plan loads a piece that runs along the cat dim at each core's tile of it (its
                # own sticks on every core, even a core whose tile lies past the piece); the text loads each
                # piece whole, one DRAM broadcast to the cores sharing its rows: never slower
                assert ktir_us[mode] >= 0.98 * t, f"{r.kernel} {mode}: {ktir_us[mode]} vs {t} us"
                continue
            band = BAND.get(r.rule, 0.01)
            assert abs(ktir_us[mode] - t) <= band * t, f"{r.kernel} {mode}: {ktir_us[mode]} vs {t} us"


def test_granite_layer_round_trips() -> None:
    inputs = layer_inputs(256, 4, 2, 512, 64)
    program = compile_graph(lambda *a: granite_layer(*a, heads=4, kv_heads=2), inputs, cfg=DATASHEET)
    records = round_trip(program, inputs)
    _check(records, must_export=24)
    assert {"reduction_fusion", "restickify", "single"} <= {r.rule for r in records if r.exported}
    assert sum(r.rule == "single" and "matmul" in r.kernel for r in records if r.exported) == 4, "four projections"
    assert sum("cat" in r.kernel for r in records if r.exported) == 2, "the rotary embedding of q and of k"
    assert all(r.exported for r in records), [r.reason for r in records if not r.exported]
    attention = next(r for r in records if r.rule == "attention")
    assert "tensor.extract" in attention.text and "math.exp" in attention.text, "row table and online softmax"
    assert attention.ktir_private_us is not None, "the compiled attention plan claims no K/V broadcast"


@pytest.mark.parametrize("fn", [
    lambda x, y: torch.softmax(x, -1),
    lambda x, y: torch.tanh(x) * 0.5 + y,
    lambda x, y: x - x.amax(-1, keepdim=True),
    lambda x, y: x / (x.abs().sum(-1, keepdim=True) + 1),
    lambda x, y: F.silu(x) * y,
    lambda x, y: torch.where(y > 0.25, x, y * 0.5),
    lambda x, y: torch.where(x < y, x, y) + 1,
    lambda x, y: F.gelu(x) + torch.relu(y),
    lambda x, y: x.clamp(-0.5, 0.75) * y.clamp(min=0.25) - y.clamp(max=-1.5),
], ids=["softmax", "pointwise", "amax", "sum", "silu_mul", "where_threshold", "where_compare", "gelu_relu", "clamp"])
def test_row_families_round_trip(fn) -> None:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(48, 150, generator=g).half(), torch.randn(48, 150, generator=g).half()
    for cfg in (DATASHEET, MEASURED):
        records = round_trip(compile_graph(fn, [x, y], cfg=cfg), [x, y])
        _check(records, must_export=1)
        assert all(r.exported for r in records), [r.reason for r in records if not r.exported]


def test_rotate_half_round_trips_whole_and_on_a_split_cat_dim() -> None:
    """cat of two half rows (the rotary embedding's rotate_half): each piece at its own extent, tensor.concat
    joins them. When the plan splits the cat dim (300 columns in slices of 64), every core joins the whole pieces
    and takes its tile of the join with tensor.extract_slice (the tile of columns 128..191 straddles the two)."""
    g = torch.Generator().manual_seed(0)

    def rotate(x, y):
        half = x.shape[-1] // 2
        return torch.cat([-x[..., half:], x[..., :half]], -1) * y

    x, y = torch.randn(4, 48, 64, generator=g).half(), torch.randn(4, 48, 64, generator=g).half()
    records = round_trip(compile_graph(rotate, [x, y], cfg=DATASHEET), [x, y])
    _check(records, must_export=len(records))
    assert any("tensor.concat" in r.text for r in records)
    x, y = torch.randn(48, 300, generator=g).half(), torch.randn(48, 300, generator=g).half()
    records = round_trip(compile_graph(rotate, [x, y], cfg=DATASHEET), [x, y])
    _check(records, must_export=len(records))
    cat = next(r.text for r in records if "cat" in r.kernel)
    assert "tensor.extract_slice %cat[0, %d1_start]" in cat, "the cat dim is split and each core's tile sliced"


def test_a_kernel_over_no_dims_runs_on_one_core() -> None:
    """``x / (x.abs().sum() + 1)``: the ``+ 1`` on the 0-d sum is a kernel of its own. The compiler's plan lists
    no busy core for it (its modeled time is the launch alone); its KTIR loads the one element on tile 0, adds,
    and stores it, so it takes that little more."""
    x = torch.randn(48, 150, generator=torch.Generator().manual_seed(0)).half()
    program = compile_graph(lambda t: t / (t.abs().sum() + 1), [x], cfg=DATASHEET)
    records = round_trip(program, [x])
    _check(records, must_export=len(records))
    spec = next(s for s in program.launches if not getattr(s, "dims", True))
    r = next(r for r in records if r.kernel == spec.name)
    assert "grid = [1]" in r.text and not any(p.ops for p in spec.tile_kernel.programs)
    assert all(r.ktir_us[m] > t for m, t in r.compiled_us.items()), "the text does the load and store"


@pytest.mark.parametrize("fn, combiner", [(lambda t: t.amax(0), "arith.maximumf"),
                                          (lambda t: t.amin(), "arith.minimumf")], ids=["amax", "amin"])
def test_a_lone_reduction_split_across_cores_folds_its_partials(fn, combiner) -> None:
    """2048 rows reduced on 32 cores: each core reduces its slice, the partners fold their partials over the ring
    through the reduction's own combiner (from -inf for a max, +inf for a min), the first partner stores. (A split
    sum is held by the random programs' test: its fp16 partials round in another order than the compiler's.)"""
    x = torch.randn(2048, 64, generator=torch.Generator().manual_seed(0)).half()
    records = round_trip(compile_graph(fn, [x], cfg=DATASHEET), [x])
    _check(records, must_export=len(records))
    (r,) = records
    assert "ktdp.inter_tile_reduce" in r.text and f"= {combiner} %lhs, %rhs" in r.text, r.text[-600:]
    assert all(abs(r.ktir_us[m] - t) <= 0.01 * t for m, t in r.compiled_us.items()), (r.compiled_us, r.ktir_us)


def test_layer_norm_round_trips() -> None:
    """var_mean is written as its definition (mean, subtract, square, sum, divide by n - correction)."""
    x = torch.randn(48, 150, generator=torch.Generator().manual_seed(0)).half()
    program = compile_graph(lambda t: F.layer_norm(t, t.shape[-1:]), [x], cfg=DATASHEET)
    records = round_trip(program, [x])
    _check(records, must_export=len(records))
    text = next(r.text for r in records if "var" in r.kernel)
    assert text.count("linalg.reduce") >= 3, "mean, then the sum of squares about it"


def test_explain_shows_the_ktir_next_to_the_loopir() -> None:
    from spyre_lab.compiler.explain import explain

    x = torch.randn(48, 150, generator=torch.Generator().manual_seed(0)).half()
    text = explain(compile_graph(lambda t: torch.softmax(t, -1), [x]), ktir=True)
    assert "// LoopIR of" in text and "ktdp.get_compute_tile_id" in text and "linalg.reduce" in text
