"""The scheduler never takes a fusion its own cost model prices higher than the option it rejected.

At decode (M = 1) a SiLU reading one half of a merged gate_up matmul's output ties the matmul's division to
the epilogue's: the fused kernel is modeled slower than the matmul alone plus a small SiLU x mul kernel, so
the ``matmul_epilogue`` rule leaves it out there, and fuses where the fused kernel is no slower.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from spyre_lab.compiler.backend import compile_graph, to_aten
from spyre_lab.compiler.examples import granite_layer, layer_inputs
from spyre_lab.compiler.fusion import schedule
from spyre_lab.compiler.layout_propagation import propagate_layouts
from spyre_lab.compiler.lowering import lower
from spyre_lab.compiler.options import CompileOptions
from spyre_lab.device.config import SPYRE

HIDDEN, INTERMEDIATE = 4096, 12800      # Granite-3.3-8B


def gate_up_silu_mul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The engine's MLP front: one merged gate_up matmul, then SiluAndMul over its two halves."""
    gate, up = (x @ w).chunk(2, dim=-1)
    return F.silu(gate) * up


def gate_up_inputs(m: int) -> list[torch.Tensor]:
    return [torch.empty(m, HIDDEN, dtype=torch.float16, device="meta"),
            torch.empty(HIDDEN, 2 * INTERMEDIATE, dtype=torch.float16, device="meta")]


def choices_of(fn, inputs):
    lowered = lower(to_aten(fn, inputs))
    propagate_layouts(lowered, SPYRE)
    return schedule(lowered, CompileOptions(), SPYRE).choices


CASES = {   # name: (function, inputs, does the scheduler weigh a choice there)
    "gate_up decode batch 1": (gate_up_silu_mul, lambda: gate_up_inputs(1), True),
    # at M >= 2 a half of the gate_up output is a strided view: no epilogue can read it in place, nothing to weigh
    "gate_up decode batch 2": (gate_up_silu_mul, lambda: gate_up_inputs(2), False),
    "gate_up prefill 64": (gate_up_silu_mul, lambda: gate_up_inputs(64), False),
    "small layer seq 64": (lambda *a: granite_layer(*a, heads=4, kv_heads=2),
                           lambda: layer_inputs(256, 4, 2, 512, 64, "meta"), True),
    "small layer decode": (lambda *a: granite_layer(*a, heads=4, kv_heads=2),
                           lambda: layer_inputs(256, 4, 2, 512, 1, "meta"), True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_fusion_taken_is_priced_no_worse_than_what_it_rejected(case: str) -> None:
    fn, make_inputs, weighs = CASES[case]
    choices = choices_of(fn, make_inputs())
    assert bool(choices) == weighs
    for c in choices:
        assert c.taken in c.prices_us and len(c.prices_us) >= 2
        assert c.taken_us <= c.cheapest_rejected_us, c
    # held against a compile that never weighs the rule: the program the choices made is no slower
    program = compile_graph(fn, make_inputs())
    for rule in sorted({c.rule for c in choices}):
        without = compile_graph(fn, make_inputs(), CompileOptions().without(rule))
        assert program.modeled_time_us() <= without.modeled_time_us() * (1 + 1e-9), rule


@pytest.mark.parametrize("m", [1, 2])
def test_the_decode_gate_up_program_is_no_slower_than_without_epilogues(m: int) -> None:
    program = compile_graph(gate_up_silu_mul, gate_up_inputs(m))
    without = compile_graph(gate_up_silu_mul, gate_up_inputs(m), CompileOptions().without("matmul_epilogue"))
    assert program.modeled_time_us() <= without.modeled_time_us()


def test_at_batch_1_the_silu_leaves_the_gate_up_kernel_and_says_why() -> None:
    program = compile_graph(gate_up_silu_mul, gate_up_inputs(1))
    (matmul,) = [k for k in program.kernels if any(n.op == "matmul" for n in k.nodes)]
    assert [n.op for n in matmul.nodes] == ["matmul"]
    (rejected,) = [c for c in choices_of(gate_up_silu_mul, gate_up_inputs(1)) if c.rule == "matmul_epilogue"]
    assert rejected.taken == "separate" and rejected.prices_us["fused"] > rejected.prices_us["separate"]
    notes = [k.decision for k in program.kernels if k.decision.startswith("matmul_epilogue")]
    assert len(notes) == 1 and "kernel of its own" in notes[0]
