"""The hand-written KTIR kernels: each computes what torch computes, simulates in both modes, opens in the views."""

from __future__ import annotations

import pytest
import torch

from spyre_lab.compiler.examples import rms_norm
from spyre_lab.device.config import SPYRE
from spyre_lab.device.isa import OpKind
from spyre_lab.ktir.examples import NAMES, load_example

G = torch.Generator().manual_seed(0)


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=G).half()


def _case(name: str) -> tuple[list[torch.Tensor], str, torch.Tensor, float]:
    """(inputs, output argument, torch reference, tolerance)."""
    if name == "vector_add":
        x, y = _randn(8192), _randn(8192)
        return [x, y, torch.zeros(8192, dtype=torch.half)], "out_ptr", x + y, 0.0
    if name == "row_softmax":
        x = _randn(64, 256)
        return [x, torch.zeros(64, 256, dtype=torch.half)], "out_ptr", torch.softmax(x.float(), -1), 1e-3
    if name == "rms_norm":
        x, w = _randn(128, 512), _randn(512)
        return [x, w, torch.zeros(128, 512, dtype=torch.half)], "out_ptr", rms_norm(x, w), 0.0
    if name == "matmul_2d":
        a, b = _randn(128, 256), _randn(256, 256)
        return [a, b, torch.zeros(128, 256, dtype=torch.half)], "c_ptr", (a.float() @ b.float()).half(), 0.07
    if name == "ring_reduce":
        x = _randn(32, 128)
        return [x, torch.zeros(128, dtype=torch.half)], "out_ptr", x.float().sum(0), 0.05
    raise AssertionError(f"no numeric case for example {name}")


def test_every_example_has_a_case() -> None:
    assert {"vector_add", "row_softmax", "rms_norm", "matmul_2d"} <= set(NAMES)
    for name in NAMES:
        _case(name)


@pytest.mark.parametrize("name", NAMES)
def test_example_matches_torch(name: str) -> None:
    fn = load_example(name).main
    inputs, out, ref, tol = _case(name)
    result = fn.run(*inputs)
    got = result.outputs[out].reshape(ref.shape).float()
    torch.testing.assert_close(got, ref.float(), atol=tol, rtol=tol)
    assert result.program.active_cores == list(range(fn.cores)), "every tile id of the grid does work"


@pytest.mark.parametrize("name", NAMES)
def test_example_simulates_in_both_modes(name: str) -> None:
    fn = load_example(name).main
    analytic, event = fn.simulate(mode="analytic"), fn.simulate(mode="event")
    assert analytic.time_us > 0 and event.time_us > 0
    assert event.trace is not None and event.trace.events
    # the modes model the same bytes: only the scheduling differs
    assert analytic.bytes_loaded == event.bytes_loaded > 0


def test_fewer_cores_take_longer_on_a_smaller_card() -> None:
    """The grid is the work division: the same 32-tile kernel does not fit a 16-core card."""
    fn = load_example("vector_add").main
    with pytest.raises(ValueError, match="asks for 32 cores"):
        fn.run(*_case("vector_add")[0], cfg=SPYRE.replace(cores=16))


def test_example_opens_in_the_views() -> None:
    from spyre_lab.viz import DataflowView, Roofline, WorkDivisionView

    fn = load_example("matmul_2d").main
    saved = fn.saved_program()
    matmul_flops = fn.tile_program().total("flops", OpKind.MATMUL)
    assert matmul_flops == 2 * 128 * 256 * 256
    assert saved["launches"][0]["modeled"]["flops"] >= matmul_flops
    for view in (DataflowView(fn.tile_program()), Roofline(saved), WorkDivisionView(saved)):
        assert view.figure.data
