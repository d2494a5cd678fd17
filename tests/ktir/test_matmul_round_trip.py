"""Matmul kernels -> KTIR -> back: split K (partial sums folded by inter_tile_reduce), bmm, batched weights,
transposed weights and an uneven last slice all compute the compiled kernel's numbers, and their modeled
time is the compiled kernel's plus one SFU pass per output tile (the text's ``arith.truncf`` of the fp32
accumulator, which the compiler's store does without an op)."""

from __future__ import annotations

import pytest
import torch

from spyre_lab.compiler.backend import compile_graph
from spyre_lab.ktir.module import load
from spyre_lab.ktir.roundtrip import round_trip

G = torch.Generator().manual_seed(0)


def _h(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=G).half()


CASES = {
    "split_k": (lambda a, b: a @ b, lambda: [_h(64, 256), _h(256, 128)]),
    "uneven_transposed": (lambda a, b: a @ b.t(), lambda: [_h(96, 256), _h(192, 256)]),
    "bmm": (lambda a, b: torch.bmm(a, b), lambda: [_h(4, 64, 128), _h(4, 128, 64)]),
    "batched_weight": (lambda a, b: torch.matmul(a, b), lambda: [_h(4, 64, 128), _h(128, 64)]),
    "tall": (lambda a, b: a @ b, lambda: [_h(2048, 64), _h(64, 64)]),
}


def _fp16_ulp(t: torch.Tensor) -> float:
    """One fp16 step at the output's largest magnitude: fp32 partials summed in another order may round there."""
    return float(2.0 ** (torch.floor(torch.log2(t.float().abs().max())) - 10))


@pytest.mark.parametrize("case", list(CASES))
def test_matmul_round_trips(case: str) -> None:
    fn, make = CASES[case]
    inputs = make()
    program = compile_graph(fn, inputs)
    records = [r for r in round_trip(program, inputs) if "matmul" in r.kernel]
    assert records and all(r.exported for r in records), [r.reason for r in records]
    ref = fn(*[x.float() for x in inputs])
    for r in records:
        assert r.max_abs_error <= _fp16_ulp(ref), f"{r.kernel}: {r.max_abs_error}"
        for mode, t in r.compiled_us.items():
            assert t <= r.ktir_us[mode] <= t * 1.01, f"{r.kernel} {mode}: {r.ktir_us[mode]} vs {t} us"


def test_split_k_folds_partials_over_the_ring() -> None:
    """K split 4 ways: every output tile's partners form a reduce group; the ring carries the fp32 partials."""
    inputs = CASES["split_k"][1]()
    program = compile_graph(CASES["split_k"][0], inputs)
    spec = next(s for s in program.launches if "matmul" in getattr(s, "name", ""))
    assert spec.division.splits.get("K", 1) > 1, "the case must split K across cores"
    text = spec.to_ktir(program.kernels[program.launches.index(spec)].nodes)
    assert "ktdp.inter_tile_produce" in text and "ktdp.inter_tile_reduce" in text and "scf.if" in text
    ktir = load(text).main.simulate(spec.cfg)
    assert ktir.ring_bytes == spec.ring_bytes > 0


def test_fused_mlp_round_trips() -> None:
    """gate and up over K, silu * up in LX, the down projection folded over the I partners by inter_tile_reduce."""
    from spyre_lab.ktir.compile_examples import EXAMPLES

    fn, make = EXAMPLES["mlp"]
    inputs = make()
    program = compile_graph(fn, inputs)
    records = round_trip(program, inputs)
    mlp = [r for r in records if r.rule == "mlp"]
    assert mlp and all(r.exported for r in mlp), [r.reason for r in records]
    text = mlp[0].text
    assert text.count("linalg.matmul") == 3 and "ktdp.inter_tile_reduce" in text and "math.exp" in text
    ref = fn(*[x.float() for x in inputs])
    for r in mlp:
        assert r.max_abs_error <= _fp16_ulp(ref), f"{r.kernel}: {r.max_abs_error}"
        for mode, t in r.compiled_us.items():
            assert t <= r.ktir_us[mode] <= t * 1.01, f"{r.kernel} {mode}: {r.ktir_us[mode]} vs {t} us"
