"""Eager ops: one launch function, cached one-op programs on the JobPlan path, traced CPU fallbacks."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from warning_checks import only_warnings

from spyre_lab.runtime import eager_programs, last_trace, one_op_compile
from spyre_lab.runtime.errors import SpyreUsageError


def half(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(torch.float16)


CASES = [
    ("add", lambda a, b: a + b),
    ("mul_scalar", lambda a, b: a * 3.5),
    ("sub_broadcast", lambda a, b: a - b[0]),
    ("div", lambda a, b: a / (b.abs() + 1)),
    ("softmax", lambda a, b: torch.softmax(a, dim=-1)),
    ("log_softmax", lambda a, b: F.log_softmax(a, dim=0)),
    ("silu_gelu", lambda a, b: F.silu(a) + F.gelu(b)),
    ("rsqrt_mean", lambda a, b: torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + 1e-6)),
    ("matmul", lambda a, b: a @ b.t()),
    ("bmm", lambda a, b: torch.bmm(a.view(4, 4, 16), b.view(4, 16, 4))),
    ("layer_norm", lambda a, b: F.layer_norm(a, (16,))),
    ("where", lambda a, b: torch.where(a > b, a, b)),
    ("amax_sum", lambda a, b: a.amax(0) + b.sum(1).sum()),
    ("cat_transpose", lambda a, b: torch.cat([a.t(), b.t()], dim=1)),
    ("masked_fill", lambda a, b: a.masked_fill(b > 0, -1.0)),
    ("clamp_tanh", lambda a, b: torch.tanh(a).clamp(-0.5, 0.5)),
]


@pytest.mark.parametrize("name,fn", CASES, ids=[c[0] for c in CASES])
def test_device_ops_match_cpu(name, fn):
    a, b = half(16, 16, seed=1), half(16, 16, seed=2)
    expected = fn(a, b)
    got = fn(a.to("spyre"), b.to("spyre"))
    assert got.device.type == "spyre"
    torch.testing.assert_close(got.cpu(), expected, atol=2e-2, rtol=2e-2)


def test_a_device_op_runs_as_a_compiled_one_kernel_program_with_correction_steps():
    x = half(64, 64).to("spyre")
    torch.exp(x)
    trace = last_trace()
    assert trace.meta["launch"] == "aten::exp" and trace.meta["compiled"]
    assert [e.args["kind"] for e in trace.on("host.callback")] == ["HostCompute"]
    blob = [e for e in trace.on("pcie") if e.name.startswith("correction blob")]
    assert len(blob) == 1 and blob[0].args["bytes"] == 16      # two patched addresses: input, output
    (compute,) = trace.on("stream0")
    assert compute.args["kind"] == "Compute" and compute.args["timing"] == "modeled (simulated, analytic)"
    assert compute.args["ops"] == ["exp"]
    cores = [lane for lane in trace.lanes() if lane.startswith("core")]
    assert cores and all(e.start_us >= compute.start_us for lane in cores for e in trace.on(lane))


def test_ops_the_compiler_does_not_take_use_a_labelled_roofline_kernel():
    x = half(64, 64).to("spyre")
    y = torch.sign(x)                                          # the compiler has no sign: reference kernel
    (compute,) = last_trace().on("stream0")
    assert compute.name == "aten::sign" and compute.args["timing"] == "modeled (roofline, no compiled program)"
    assert compute.args["not_compiled"] and compute.args["not_compiled"] == one_op_compile.not_compiled()["aten::sign"]
    cfg = torch.spyre.get_device(0).config
    assert compute.args["bytes"] == 2 * 64 * 64 * 2
    read = written = 64 * 64 * 2                               # reads x, writes sign(x): a balanced mix
    assert compute.dur_us == pytest.approx(compute.args["launch_us"] + max(
        compute.args["bytes"] / cfg.dram_bandwidth_at(read, written),
        compute.args["flops"] / (cfg.sfu_elems_per_cycle_per_core * cfg.cores * cfg.clock_hz)) * 1e6)
    assert torch.equal(y.cpu(), torch.sign(half(64, 64)))


def test_one_op_programs_are_cached_per_op_shape_and_dtype():
    x, y = half(32, 8).to("spyre"), half(8, 8).to("spyre")
    torch.sigmoid(x)
    size = eager_programs.program_cache_size()
    torch.sigmoid(x)
    torch.sigmoid(half(32, 8, seed=5).to("spyre"))          # same signature, other data
    assert eager_programs.program_cache_size() == size
    torch.sigmoid(y)                                         # new shape: a new program
    assert eager_programs.program_cache_size() == size + 1


def test_roofline_matmul_counts_two_flops_per_multiply_add():
    cfg = torch.spyre.get_device(0).config
    a, b = torch.empty(128, 256, device="meta"), torch.empty(256, 64, device="meta")
    c = torch.empty(128, 64, device="meta")
    time_us, detail = eager_programs.op_roofline_us("mm", [a, b], [c], cfg)
    assert detail["flops"] == 2 * 128 * 64 * 256
    assert detail["bytes"] == (128 * 256 + 256 * 64 + 128 * 64) * 2      # fp32 is held as fp16
    read, written = (128 * 256 + 256 * 64) * 2, 128 * 64 * 2
    assert (detail["read_bytes"], detail["write_bytes"]) == (read, written)
    rate = cfg.dram_bandwidth_at(read, written)           # the mix's rate, below the one-way peak on `measured`
    assert rate <= cfg.dram_bandwidth
    expected = max(detail["bytes"] / rate, detail["flops"] / (cfg.peak_flops * cfg.pt_sustained_fraction)) * 1e6
    assert time_us == pytest.approx(expected + cfg.cycles_to_us(cfg.kernel_launch_cycles))


def test_a_compiled_program_that_disagrees_with_the_cpu_op_is_not_used():
    x = torch.arange(6, dtype=torch.float16).reshape(2, 3).to("spyre")
    assert x.sum().item() == 15.0                              # whatever the compiler does with sum(dim=[])
    assert (x * 2).sum(dim=1).tolist() == [6.0, 24.0]


def test_in_place_and_out_variants_write_the_spyre_tensor():
    a, b = half(8, 8, seed=1), half(8, 8, seed=2)
    x = a.to("spyre")
    alias = x
    result = x.add_(b.to("spyre"))
    assert result is alias
    torch.testing.assert_close(x.cpu(), a + b)
    out = torch.empty(8, 8, dtype=torch.float16, device="spyre")
    torch.mul(a.to("spyre"), b.to("spyre"), out=out)
    torch.testing.assert_close(out.cpu(), a * b)


def test_zero_dim_cpu_tensors_act_as_scalars_but_others_are_refused():
    x = half(4, 4).to("spyre")
    torch.testing.assert_close((x * torch.tensor(2.0, dtype=torch.float16)).cpu(), half(4, 4) * 2)
    with pytest.raises((SpyreUsageError, RuntimeError), match="cpu"):
        x + half(4, 4)
    assert torch.equal(x[torch.tensor([2, 0])].cpu(), half(4, 4)[[2, 0]])  # host ops take CPU indices


def test_cpu_fallback_copies_both_ways_and_warns_once_naming_the_op(fresh_warnings):
    x = torch.arange(12, dtype=torch.float16).reshape(3, 4).to("spyre")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cumsum(x, dim=1)
        y = torch.cumsum(x, dim=1)
    trace = last_trace()
    named = [w for w in caught if "aten::cumsum" in str(w.message)]
    assert len(named) == 1
    assert torch.equal(y.cpu(), torch.cumsum(torch.arange(12, dtype=torch.float16).reshape(3, 4), dim=1))
    assert trace.meta["launch"] == "aten::cumsum (CPU fallback)"
    kinds = [e.args["kind"] for e in trace.on("pcie")]
    assert kinds == ["D2H", "H2D"]
    host = [e for e in trace.on("host") if e.name == "aten::cumsum on CPU"]
    assert host and host[0].args["timing"] == "modeled (host estimate)"


def test_data_dependent_ops_run_on_the_host_without_warning(fresh_warnings):
    x = torch.tensor([0.0, 2.0, -1.0, 0.0], dtype=torch.float16).to("spyre")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        nz = torch.nonzero(x)
        sel = torch.masked_select(x, x != 0)
    assert not [w for w in caught if "no spyre kernel" in str(w.message)]
    assert torch.equal(nz.cpu(), torch.tensor([[1], [2]]))
    assert torch.equal(sel.cpu(), torch.tensor([2.0, -1.0], dtype=torch.float16))


def test_item_and_tolist_read_back_through_a_d2h():
    x = torch.tensor([1.5, 2.5], dtype=torch.float16).to("spyre")
    assert x[1].item() == 2.5
    assert x.tolist() == [1.5, 2.5]
    assert [e.args["kind"] for e in last_trace().on("pcie")] == ["D2H"]


def test_view_dtype_reinterpretation_is_refused():
    with pytest.raises(SpyreUsageError, match="reinterprets"):
        half(4).to("spyre").view(torch.int16)


def test_autocast_on_the_device_falls_through():
    x = half(4, 4).to("spyre")
    with torch.autocast("spyre", dtype=torch.float16):
        y = x @ x
    torch.testing.assert_close(y.cpu(), half(4, 4) @ half(4, 4))


def test_a_tiny_granite_generates_the_same_tokens_on_spyre(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GraniteConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                     max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.GraniteForCausalLM(cfg).half().eval()
    ids = torch.tensor([[1, 5, 9, 23, 7]])
    with torch.no_grad(), only_warnings(r"has no spyre kernel", r"runs on the host CPU",   # generate()'s host ops
                                        r"spyre stores torch\.float32"):                 # the HF rotary tables
        expected = model.generate(ids, max_new_tokens=4, do_sample=False)
        got = model.to("spyre").generate(ids.to("spyre"), max_new_tokens=4, do_sample=False)
    assert got.device.type == "spyre"
    assert torch.equal(got.cpu(), expected)


@pytest.mark.parametrize("dtype,divisor",
                         [(torch.float16, 2), (torch.int64, 3), (torch.int32, 3), (torch.float16, 1.5)],
                         ids=["fp16-int", "int64", "int32", "fp16-float"])
def test_remainder_with_a_python_scalar_runs_as_cpu_fallback(dtype, divisor):
    """remainder.Scalar reaches the fallback as remainder.Tensor_out with the scalar unwrapped to a Python number."""
    x = (torch.arange(-6, 6) * 1.25).to(dtype)
    with only_warnings(r"aten::remainder has no spyre kernel"):
        out = torch.remainder(x.to("spyre"), divisor)
    assert out.device.type == "spyre" and out.dtype == torch.remainder(x, divisor).dtype
    torch.testing.assert_close(out.cpu(), torch.remainder(x, divisor))


def test_index_copy_scatters_rows_on_the_device():
    """The paged KV write (one index_copy_ of a step's rows by slot) stays on the card: no PCIe round trip."""
    from spyre_lab.runtime import recording

    cache = torch.zeros(16, 2, 64, dtype=torch.float16)
    slots = torch.tensor([3, 7, 1])
    rows = torch.randn(3, 2, 64, dtype=torch.float16)
    on_card = cache.to("spyre")
    slots_d, rows_d = slots.to("spyre"), rows.to("spyre")
    with recording() as trace:
        on_card.index_copy_(0, slots_d, rows_d)
    assert not trace.on("pcie") or all(e.name.startswith("correction") for e in trace.on("pcie"))
    assert torch.equal(on_card.cpu(), cache.index_copy_(0, slots, rows))
