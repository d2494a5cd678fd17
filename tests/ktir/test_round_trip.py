"""Compiled kernels -> KTIR -> back: the imported kernel computes the compiled kernel's numbers and its modeled
time stays close (the text does not carry the compiler's double-buffer slots, so times may differ a little).
A kernel outside what the writer covers must say so with KTIRUnsupported, never write a wrong kernel.

The 6% time band is checked on the ``datasheet`` machine, where every kernel pays a 4 us launch. On ``measured``
(no fixed per-kernel term) these small kernels are a fraction of a microsecond and the lost double buffering shows
in full: the imported kernel is up to about 1.8x slower. That is asserted as it is (never faster, the same
numbers), so the gap stays visible until the KTIR text carries the buffer slots."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from spyre_lab.compiler.backend import compile_graph
from spyre_lab.compiler.examples import granite_layer, layer_inputs
from spyre_lab.device.config import DATASHEET, MEASURED
from spyre_lab.ktir.roundtrip import round_trip


def _check(records, must_export: int, close: bool = True) -> None:
    exported = [r for r in records if r.exported]
    assert len(exported) >= must_export, [r.reason for r in records if not r.exported]
    for r in records:
        if not r.exported:
            assert r.reason.startswith("not written as KTIR: "), r.reason
            continue
        # silu is written x / (1 + exp(-x)): one fp16 rounding from the compiled kernel's torch silu
        assert r.max_abs_error <= 8e-3, f"{r.kernel}: KTIR differs from the compiled kernel by {r.max_abs_error}"
        for mode, t in r.compiled_us.items():
            if close:
                assert abs(r.ktir_us[mode] - t) <= 0.06 * t, f"{r.kernel} {mode}: {r.ktir_us[mode]} vs {t} us"
            else:   # without double buffering the imported kernel can only be slower, never faster
                assert r.ktir_us[mode] >= 0.98 * t, f"{r.kernel} {mode}: {r.ktir_us[mode]} vs {t} us"


def test_granite_layer_round_trips() -> None:
    inputs = layer_inputs(256, 4, 2, 512, 64)
    program = compile_graph(lambda *a: granite_layer(*a, heads=4, kv_heads=2), inputs, cfg=DATASHEET)
    records = round_trip(program, inputs)
    _check(records, must_export=14)
    assert {"reduction_fusion", "restickify", "single"} <= {r.rule for r in records if r.exported}


@pytest.mark.parametrize("fn", [
    lambda x, y: torch.softmax(x, -1),
    lambda x, y: torch.tanh(x) * 0.5 + y,
    lambda x, y: x - x.amax(-1, keepdim=True),
    lambda x, y: x / (x.abs().sum(-1, keepdim=True) + 1),
    lambda x, y: F.silu(x) * y,
], ids=["softmax", "pointwise", "amax", "sum", "silu_mul"])
def test_row_families_round_trip(fn) -> None:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(48, 150, generator=g).half(), torch.randn(48, 150, generator=g).half()
    for cfg, close in ((DATASHEET, True), (MEASURED, False)):
        program = compile_graph(fn, [x, y], cfg=cfg)
        _check(round_trip(program, [x, y]), must_export=1, close=close)


def test_layer_norm_is_reported_not_written() -> None:
    """var_mean has no KTIR spelling in this writer yet: the kernel says so instead of exporting something else."""
    x = torch.randn(48, 150, generator=torch.Generator().manual_seed(0)).half()
    records = round_trip(compile_graph(lambda t: F.layer_norm(t, t.shape[-1:]), [x]), [x])
    assert records and all("reduction var is not written out" in r.reason for r in records if not r.exported)


def test_explain_shows_the_ktir_next_to_the_loopir() -> None:
    from spyre_lab.compiler.explain import explain

    x = torch.randn(48, 150, generator=torch.Generator().manual_seed(0)).half()
    text = explain(compile_graph(lambda t: torch.softmax(t, -1), [x]), ktir=True)
    assert "// LoopIR of" in text and "ktdp.get_compute_tile_id" in text and "linalg.reduce" in text
