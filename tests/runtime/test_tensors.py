"""Spyre tensors: real DRAM allocations, stickified payloads, shared views, traced PCIe copies."""

from __future__ import annotations

import gc
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spyre_lab.device.layout import StickLayout, stickify
from spyre_lab.device.memory import DeviceOutOfMemoryError
from spyre_lab.runtime import last_trace
from spyre_lab.runtime.errors import SpyreInferenceOnlyError, SpyreUsageError
from spyre_lab.runtime.tensor import buffer_of


def half(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(torch.float16)


def test_round_trip_is_exact_for_device_dtypes():
    for cpu in (half(5, 100, 150), torch.arange(-7, 300).reshape(1, -1), torch.tensor([True, False, True]),
                torch.randint(-100, 100, (3, 65), dtype=torch.int32), torch.tensor(2.5, dtype=torch.float16)):
        back = cpu.to("spyre").cpu()
        assert back.dtype == cpu.dtype and back.shape == cpu.shape
        assert torch.equal(back, cpu)


def test_payload_is_stickified_in_a_dram_allocation():
    cpu = half(1024, 256)
    x = cpu.to("spyre")
    buf = buffer_of(x)
    assert buf.layout == StickLayout.default((1024, 256), torch.float16)
    assert buf.data.shape == (4, 1024, 64)                  # the documented device size
    assert torch.equal(buf.data, stickify(cpu))
    assert x.data_ptr() == buf.address == buf.allocation.address
    assert buf.allocation.size >= buf.layout.device_nbytes


def test_views_share_the_storage_and_writes_through_views_are_visible():
    base_cpu = half(6, 8)
    base = base_cpu.to("spyre")
    alloc_before = torch.spyre.memory_allocated()
    t = base.t()
    window = base[1:4, ::2]
    assert t.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    assert torch.spyre.memory_allocated() == alloc_before    # views allocate nothing
    assert torch.equal(window.cpu(), base_cpu[1:4, ::2])
    assert torch.equal(t.cpu(), base_cpu.t())
    window.fill_(5.0)
    base_cpu[1:4, ::2] = 5.0
    assert torch.equal(base.cpu(), base_cpu)
    assert torch.equal(base.view(48).cpu(), base_cpu.view(48))
    assert torch.equal(base.detach().cpu(), base_cpu)


def test_repr_reads_like_any_tensor():
    x = torch.tensor([[1.5, 2.0], [3.0, -4.0]], dtype=torch.float16).to("spyre")
    text = repr(x)
    assert text.startswith("tensor([[ 1.5000,  2.0000],") and "device='spyre:0'" in text
    assert "dtype=torch.float16" in text
    assert "device='spyre:0'" in repr(torch.arange(3).to("spyre"))


def test_memory_is_freed_when_the_last_reference_goes():
    gc.collect()
    gc.collect()   # an earlier test's cycles can free more on a second pass (finalizers dropping card buffers)
    before = torch.spyre.memory_allocated()
    x = half(256, 256).to("spyre")
    view = x[:10]
    held = torch.spyre.memory_allocated()
    assert held - before == 256 * 256 * 2
    del x
    gc.collect()
    assert torch.spyre.memory_allocated() == held            # the view keeps the storage alive
    del view
    gc.collect()
    assert torch.spyre.memory_allocated() == before
    assert torch.spyre.max_memory_allocated() >= held


def test_copies_are_traced_pcie_dmas_with_bytes():
    cpu = half(512, 128)
    x = cpu.to("spyre")
    h2d = [e for e in last_trace() if e.lane == "pcie"]
    assert len(h2d) == 1 and h2d[0].args["bytes"] == 512 * 128 * 2 and h2d[0].args["kind"] == "H2D"
    cfg = torch.spyre.get_device(0).config
    assert h2d[0].dur_us == pytest.approx(cfg.pcie_latency_us + 512 * 128 * 2 / cfg.pcie_bandwidth * 1e6)
    x.cpu()
    d2h = [e for e in last_trace() if e.lane == "pcie"]
    assert [e.args["kind"] for e in d2h] == ["D2H"]


def test_int64_indices_drive_embedding_and_indexing():
    weight = half(10, 4)
    emb = torch.nn.Embedding.from_pretrained(weight).to("spyre")
    idx = torch.tensor([[1, 9, 3]])
    assert torch.equal(emb(idx.to("spyre")).cpu(), weight[idx])
    v = torch.arange(10, dtype=torch.float16).to("spyre")
    assert torch.equal(v[torch.tensor([7, 2]).to("spyre")].cpu(), torch.tensor([7.0, 2.0], dtype=torch.float16))


def test_nn_linear_on_spyre_matches_cpu():
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 32).half()
    x = half(8, 64)
    expected = lin(x)
    with torch.no_grad():
        got = lin.to("spyre")(x.to("spyre")).cpu()
    torch.testing.assert_close(got, expected.detach(), atol=1e-2, rtol=1e-2)


def test_backward_is_refused_with_a_clear_message():
    w = torch.ones(3, dtype=torch.float16, device="spyre", requires_grad=True)
    loss = (w * 2).sum()
    with pytest.raises(SpyreInferenceOnlyError, match="inference-only"):
        loss.backward()


def test_complex_dtypes_are_refused():
    with pytest.raises(TypeError, match="complex"):
        torch.ones(2, dtype=torch.complex64).to("spyre")


def test_out_of_memory_names_requested_and_free_bytes():
    with pytest.raises(DeviceOutOfMemoryError) as info:
        torch.empty(200 * 2**30, dtype=torch.uint8, device="spyre")
    message = str(info.value)
    assert "200.00 GiB" in message and "free" in message
    assert isinstance(info.value, torch.OutOfMemoryError)   # caught as a full CUDA device is


def test_tensor_used_after_a_device_reset_says_what_happened():
    keep = torch.ones(4, dtype=torch.float16).to("spyre")
    torch.spyre.reset_device()
    assert torch.spyre.memory_allocated() == 0
    with pytest.raises(SpyreUsageError, match="reset_device"):
        keep.cpu()
    fresh = torch.ones(4, dtype=torch.float16).to("spyre")    # the device works again
    assert fresh.sum().item() == 4


def test_resize_and_out_growth_keep_contents():
    x = torch.arange(4, dtype=torch.float16).to("spyre")
    x.resize_(8)
    assert torch.equal(x[:4].cpu(), torch.arange(4, dtype=torch.float16))
    out = torch.empty(0, dtype=torch.float16, device="spyre")
    torch.add(half(3, 5).to("spyre"), 1, out=out)
    assert out.shape == (3, 5)
    assert torch.equal(out.cpu(), half(3, 5) + 1)


def test_cross_device_copy_moves_data():
    if torch.spyre.device_count() < 2:
        pytest.skip("needs SPYRE_LAB_DEVICES >= 2")
    a = half(4, 4).to("spyre:0")
    b = a.to("spyre:1")
    assert b.device == torch.device("spyre", 1)
    assert torch.equal(b.cpu(), half(4, 4))
    assert torch.spyre.memory_allocated(1) >= 4 * 4 * 2


def test_deepcopy_of_a_spyre_model_copies_through_the_device():
    import copy

    model = torch.nn.BatchNorm1d(4).half().eval().to("spyre")     # parameters and plain-tensor buffers
    twin = copy.deepcopy(model)
    assert twin.running_mean.device.type == "spyre"
    assert twin.running_mean.data_ptr() != model.running_mean.data_ptr()
    assert torch.equal(twin.running_var.cpu(), model.running_var.cpu())


def test_saving_spyre_tensors_asks_for_cpu_copies():
    import io

    with pytest.raises(SpyreUsageError, match=r"t\.cpu\(\)"):
        torch.save(torch.ones(3, dtype=torch.float16).to("spyre"), io.BytesIO())


_VIEWS = {
    "t": lambda t: t.transpose(0, -1),
    "slice": lambda t: t[1:] if t.shape[0] > 1 else t,
    "step": lambda t: t[..., ::2],
    "narrow": lambda t: t.narrow(-1, 0, max(1, t.shape[-1] // 2)),
    "unsqueeze": lambda t: t.unsqueeze(0),
    "flip_view": lambda t: t.permute(*reversed(range(t.dim()))),
}


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.lists(st.integers(1, 9), min_size=1, max_size=3),
       chain=st.lists(st.sampled_from(sorted(_VIEWS)), max_size=3))
def test_random_view_chains_read_and_write_like_cpu(shape, chain):
    cpu = torch.arange(math.prod(shape), dtype=torch.float16).reshape(shape)
    dev = cpu.to("spyre")
    v_cpu, v_dev = cpu, dev
    for name in chain:
        v_cpu, v_dev = _VIEWS[name](v_cpu), _VIEWS[name](v_dev)
    assert v_dev.shape == v_cpu.shape and v_dev.stride() == v_cpu.stride()
    assert torch.equal(v_dev.cpu(), v_cpu)
    assert torch.equal((v_dev * 2 + 1).cpu(), v_cpu * 2 + 1)
    v_cpu.mul_(-1)
    v_dev.mul_(-1)                                   # in place through the view: the base sees it
    assert torch.equal(dev.cpu(), cpu)
