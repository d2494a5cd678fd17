"""Fused attention -> KTIR -> back: the online softmax over key tiles (running max and sum), causal masking by
index arithmetic, the compiler's row ranges as an index table. The imported kernel matches torch's SDPA and the
compiled kernel; with every core loading its own K/V tiles (the compiled plan claims no broadcast) its modeled
time is the compiled kernel's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from spyre_lab.compiler.backend import compile_graph
from spyre_lab.device.config import DATASHEET
from spyre_lab.ktir.roundtrip import round_trip


def _attention(fn, shapes, dtype=torch.float16):
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(*s, generator=g).to(dtype) for s in shapes]
    records = [r for r in round_trip(compile_graph(fn, xs, cfg=DATASHEET), xs) if r.rule == "attention"]
    assert len(records) == 1
    return records[0], xs


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_attention_round_trips_over_several_key_tiles(causal: bool) -> None:
    r, _ = _attention(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                      [(1, 2, 320, 64)] * 3)
    assert r.exported, r.reason
    assert r.text.count("scf.for") >= 3 and "linalg.reduce { arith.maximumf }" in r.text
    assert ("arith.cmpf ogt" in r.text) == causal, "the causal mask comes from indices, no mask is loaded"
    assert r.max_abs_error <= 2e-3, r.max_abs_error
    for mode, t in r.compiled_us.items():
        assert abs(r.ktir_private_us[mode] - t) <= 0.01 * t, (mode, r.ktir_private_us[mode], t)
        assert r.ktir_us[mode] <= r.ktir_private_us[mode] * 1.001


def test_imported_attention_matches_torch_sdpa() -> None:
    """Feed the KTIR kernel the Q, K^T, V the compiled program gives it and hold its output against SDPA's."""
    from spyre_lab.compiler.kernel_spec import KernelSpec
    from spyre_lab.ktir.module import load

    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(1, 2, 320, 64, generator=g).half() for _ in range(3)]
    program = compile_graph(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), xs,
                            cfg=DATASHEET)
    env = dict(zip(program.inputs, xs)) | dict(program.constants)
    for launch, kernel in zip(program.launches, program.kernels):
        if isinstance(launch, KernelSpec) and launch.rule == "attention":
            break
        for node in kernel.nodes:
            env[node.output] = node.compute(*[env[b] for b in node.inputs])
    node = kernel.nodes[0]
    q, kt, v = (r.apply(env[r.buffer]).float() for r in node.reads[:3])
    want = F.scaled_dot_product_attention(q, kt.transpose(-1, -2), v, is_causal=True, scale=1.0)
    args = [env.get(b, torch.zeros(program.buffers[b].shape, dtype=program.buffers[b].dtype))
            for b in launch.address_slots]
    fn = load(launch.to_ktir(kernel.nodes)).main
    got = fn.run(*args, cfg=launch.cfg).outputs[fn.args[-1][0][1:]].reshape(want.shape).float()
    assert float((got - want).abs().max()) <= 2e-3


def test_an_attention_mask_input_is_refused_by_name() -> None:
    r, _ = _attention(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
                      [(1, 2, 128, 64)] * 3 + [(128, 128)])
    assert not r.exported and "constant causal mask" in r.reason, r.reason
