"""The LX-planning steps as CompileOptions: what each switch moves through DRAM, and that values never change."""

import pytest
import torch

from spyre_lab.compiler import CompileOptions, compile_graph
from spyre_lab.compiler.executor import execute
from spyre_lab.device.config import SPYRE
from spyre_lab.device.isa import OpKind

OFF = dict(lx_pin_reductions=False, lx_in_place=False, lx_clone_inputs=False)


def _softmax(x):
    return torch.softmax(x, dim=-1)


def _rmsnorm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def _dram_bytes(program):
    return _dram_bytes_all(program.launches[0])


@pytest.mark.parametrize("flags", [OFF, dict(OFF, lx_pin_reductions=True), dict(lx_clone_inputs=False), {}])
def test_lx_planning_steps_change_traffic_not_values(flags):
    x = torch.randn(64, 256, dtype=torch.float16)
    program = compile_graph(_softmax, [x], CompileOptions(**flags), SPYRE.replace(cores=1))
    assert len(program.launches) == 1                       # one fused softmax kernel whatever LX holds
    out = execute(program, [x]).outputs[0]
    torch.testing.assert_close(out.float(), torch.softmax(x.float(), -1), atol=2e-3, rtol=2e-3)


def test_each_step_off_moves_more_bytes_through_dram():
    x = torch.empty(512, 1024, dtype=torch.float16, device="meta")
    one = SPYRE.replace(cores=1)
    ladder = [OFF, dict(OFF, lx_pin_reductions=True), dict(lx_clone_inputs=False), {}]
    traffic = [_dram_bytes(compile_graph(_softmax, [x], CompileOptions(**f), one)) for f in ladder]
    assert traffic[0] > traffic[1] > traffic[2] > traffic[3]
    assert traffic[3] == pytest.approx(2 * 512 * 1024 * 2, rel=0.01)     # x in, softmax out: 2MN bytes


def test_a_fused_norm_spills_its_intermediates_too():
    x, w = torch.empty(256, 512, dtype=torch.float16, device="meta"), torch.empty(512, dtype=torch.float16,
                                                                                     device="meta")
    on = compile_graph(_rmsnorm, [x, w], CompileOptions())
    off = compile_graph(_rmsnorm, [x, w], CompileOptions(**OFF))
    assert [k.rule for k in off.kernels] == [k.rule for k in on.kernels]   # same kernels, only LX use differs
    assert sum(map(_dram_bytes_all, off.launches)) > sum(map(_dram_bytes_all, on.launches))
    assert off.modeled_time_us() > on.modeled_time_us()


def _dram_bytes_all(spec):
    return sum(op.nbytes for p in spec.tile_kernel.programs for op in p if op.kind in (OpKind.LOAD, OpKind.STORE))
