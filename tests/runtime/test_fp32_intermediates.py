"""Norms, variances and lerp: one path for eager and compiled, with fp32 intermediates kept on the card.

The compiler's decompositions compute these in fp32 (a sum of squares of fp16 values overflows fp16);
a compiled program keeps such intermediates in the card's fp32 format, so an eager op (a one-op
compiled program) and ``torch.compile`` give the same numbers, and both match the CPU.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from spyre_lab.runtime import eager_programs

CASES = {
    "rms_norm": lambda x, y, w: F.rms_norm(x, [64], w),
    "layer_norm": lambda x, y, w: F.layer_norm(x, [64], w, w),
    "var": lambda x, y, w: torch.var(x, -1),
    "std": lambda x, y, w: torch.std(x, -1, keepdim=True),
    "lerp": lambda x, y, w: torch.lerp(x, y, 0.3),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_eager_equals_compiled_and_the_cpu_for_large_inputs(name):
    g = torch.Generator().manual_seed(0)
    x, y = ((torch.randn(8, 64, generator=g) * 100).half() for _ in range(2))   # squares far beyond fp16's range
    w = torch.randn(64, generator=g).half()
    fn = CASES[name]
    eager_programs.clear_program_cache()
    eager = fn(x.to("spyre"), y.to("spyre"), w.to("spyre")).cpu()
    assert all(p.compiled is not None for p in eager_programs.cached_programs() if "copy" not in p.name), \
        "every device op of the eager call ran its compiled one-op program"
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="spyre")(x.to("spyre"), y.to("spyre"), w.to("spyre")).cpu()
    assert torch.equal(eager, compiled)
    cpu = fn(x, y, w)
    reference = fn(x.float(), y.float(), w.float())
    assert bool(torch.isfinite(eager).all()) and bool(torch.isfinite(cpu).all())
    # as close to the fp32 result as the CPU's fp16 op, within a few fp16 units of the result's scale (lerp's
    # decomposition rounds ``end - start`` to fp16 before the multiply; the CPU kernel does not)
    bound = (cpu.float() - reference).abs() + 4 * 2**-10 * reference.abs().max()
    assert bool(((eager.float() - reference).abs() <= bound).all())


def test_fp32_intermediates_stay_fp32_in_dram():
    """Unfused, the sum of squares crosses DRAM between kernels: it is stored in the card's fp32 format
    (fp16 would overflow), while the output follows the fp16 policy."""
    from spyre_lab.compiler.backend import compile_graph
    from spyre_lab.compiler.options import CompileOptions
    from spyre_lab.runtime import programs
    from spyre_lab.runtime.tensor import buffer_of

    x = (torch.randn(4, 64) * 100).half()
    program = compile_graph(lambda t: F.rms_norm(t, [64]), [x], CompileOptions(fusion=frozenset()))
    internal = {b for b, info in program.buffers.items() if info.dtype == torch.float32 and info.role == "intermediate"}
    assert internal, "the decomposition computes in fp32"
    (out,) = programs.run_program(program, [x.to("spyre")])
    _, plan = programs.load(program).binding_plan(0)
    placed = plan.intermediates.slots
    assert internal <= set(placed)                     # intermediates live in the intermediates segment
    assert {placed[b].buffer.layout.dtype for b in internal} == {torch.float32}
    assert buffer_of(out).layout.dtype == torch.float16
    torch.testing.assert_close(out.cpu(), F.rms_norm(x, [64]), atol=1e-3, rtol=2 * 2**-10)


def test_a_programs_fp32_constants_are_uploaded_exactly():
    """Compiler-made fp32 constants (a mask, an epsilon) keep the card's fp32 format like fp32 intermediates: the
    value on the card is the compiler's, not its fp16 rounding, and no storage warning is given."""
    import warnings

    from spyre_lab.runtime.programs import upload_constant

    values = torch.tensor([1.0001, -float("inf"), 3.14159265, 1e-6])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        on_card = upload_constant(values, 0)
    assert not [w for w in caught if "spyre stores" in str(w.message)]
    assert on_card.device.type == "spyre" and on_card.dtype == torch.float32
    assert torch.equal(on_card.cpu(), values)
    assert not torch.equal(values.half().float(), values)          # fp16 storage would have changed them
