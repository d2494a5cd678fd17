"""The cached eager op's short road: one dispatch per structured op, a launch bound once per program and card,
DRAM freed with the storage, and nothing the caller sees changed by any of it."""

from __future__ import annotations

import pytest
import torch

from spyre_lab.compiler import compile_graph
from spyre_lab.runtime import last_trace, ops
from spyre_lab.runtime.programs import run_program


def _pair(shape=(8, 64)):
    torch.manual_seed(0)
    a, b = torch.randn(shape, dtype=torch.float16), torch.randn(shape, dtype=torch.float16)
    return a, b, a.to("spyre"), b.to("spyre")


def _kernel_events(trace):
    return [(e.lane, e.name, e.dur_us) for e in trace.events if e.lane.startswith(("stream", "spyre0", "core"))]


def test_a_structured_op_reaches_the_backend_once_not_as_empty_plus_out(monkeypatch):
    _, _, x, y = _pair()
    w = y.t()                                        # a view: it has a dispatch of its own
    seen = []
    real = ops.launch_eager                          # what a structured op's own kernel enters, once per call
    monkeypatch.setattr(ops, "launch_eager", lambda op, a, k: seen.append(str(op)) or real(op, a, k))
    torch.add(x, y)
    torch.mm(x, w)
    torch.nn.functional.silu(x)
    assert seen == ["aten.add.Tensor", "aten.mm.default", "aten.silu.default"]


def test_in_place_forms_keep_torch_composite_and_write_their_input():
    a, b, x, y = _pair()
    x.add_(y)
    x.mul_(2)
    assert torch.equal(x.cpu(), (a + b) * 2)
    assert ops.STRUCTURED_DIRECT and not any(op.overloadpacket.__name__.endswith("_") for op in ops.STRUCTURED_DIRECT)


@pytest.mark.parametrize("fn", [torch.add, torch.mul, torch.sub, torch.maximum])
def test_a_direct_op_times_and_computes_like_its_out_form(fn):
    a, b, x, y = _pair()
    direct = fn(x, y)
    direct_events = _kernel_events(last_trace())
    out = torch.empty_like(x)
    fn(x, y, out=out)
    assert _kernel_events(last_trace()) == direct_events
    assert torch.equal(direct.cpu(), fn(a, b)) and torch.equal(out.cpu(), direct.cpu())


def test_results_that_die_give_their_dram_back():
    _, _, x, y = _pair((64, 64))
    before = torch.spyre.memory_allocated()
    for _ in range(20):
        z = x + y
    kept = torch.spyre.memory_allocated()
    assert kept == before + z.numel() * 2            # only the last result is alive
    view = (x + y)[1:3]                             # a view keeps its storage alive
    assert torch.spyre.memory_allocated() == kept + z.numel() * 2
    del view, z
    assert torch.spyre.memory_allocated() == before


def test_a_program_launched_again_after_a_device_reset_binds_afresh():
    program = compile_graph(lambda p, q: (p * q + p,), [torch.ones(4, 64, dtype=torch.float16)] * 2)
    a, b, x, y = _pair((4, 64))
    first = run_program(program, [x, y])[0].cpu()
    torch.spyre.reset_device()
    x, y = a.to("spyre"), b.to("spyre")
    again = run_program(program, [x, y])[0].cpu()
    assert torch.equal(first, again) and torch.equal(again, a * b + a)


def test_an_input_on_another_card_is_refused_by_name():
    program = compile_graph(lambda p, q: (p + q,), [torch.ones(4, 64, dtype=torch.float16)] * 2)
    a, b, _, _ = _pair((4, 64))
    with pytest.raises(ValueError, match="spyre:0 needs every bound tensor there"):
        run_program(program, [a.to("spyre:0"), b.to("spyre:1")])


def test_only_a_result_with_memory_of_its_own_is_adopted_without_a_copy():
    from spyre_lab.runtime.tensor import owns_its_memory

    base = torch.randn(8, 64)
    with torch.inference_mode():                     # views have no _base here: ask the storage instead
        fresh = base + 1
        assert owns_its_memory(fresh)
        assert not owns_its_memory(fresh[2:])        # an offset into another tensor's storage
        assert not owns_its_memory(fresh.view(-1))   # the whole storage, but shared with ``fresh``
        assert not owns_its_memory(fresh.t())        # not in order
        assert not owns_its_memory(fresh[:4])        # part of a storage


def test_a_compiled_slice_of_an_input_under_inference_mode_reads_back_right():
    program = compile_graph(lambda p: (p[2:] * 1, p[2:]), [torch.ones(6, 64, dtype=torch.float16)])
    a = torch.arange(6 * 64, dtype=torch.float16).reshape(6, 64) / 64
    with torch.inference_mode():
        scaled, sliced = run_program(program, [a.to("spyre")])
        again = run_program(program, [a.to("spyre")])[0]
    assert torch.equal(scaled.cpu(), a[2:]) and torch.equal(sliced.cpu(), a[2:]) and torch.equal(again.cpu(), a[2:])


@pytest.mark.parametrize("size, stride, dtype", [((8, 64), None, torch.float16), ((3, 5), (1, 3), torch.float32),
                                                 ((4,), None, torch.int64)])
@pytest.mark.filterwarnings("ignore:spyre stores")
def test_a_tensor_from_fresh_tensors_is_the_one_empty_spyre_makes(size, stride, dtype):
    from spyre_lab.runtime.tensor import DeviceBuffer, FreshTensors, buffer_of, empty_spyre

    made, ref = FreshTensors(size, stride, dtype, 0)(), empty_spyre(size, stride, dtype, 0)
    assert (made.device, made.shape, made.stride(), made.dtype, made.storage_offset()) == \
        (ref.device, ref.shape, ref.stride(), ref.dtype, ref.storage_offset())
    got, want = buffer_of(made), buffer_of(ref)
    assert got.address != want.address and torch.spyre.current_device() == 0
    for slot in DeviceBuffer.__slots__:                  # every field the constructor sets, set alike
        if slot == "__weakref__":
            continue
        if slot == "allocation":
            assert (got.allocation.nbytes, got.allocation.size, got.allocation.tag) == \
                (want.allocation.nbytes, want.allocation.size, want.allocation.tag)
        else:
            assert getattr(got, slot) == getattr(want, slot), slot
    assert torch.equal(made.cpu(), ref.cpu())
    before = torch.spyre.memory_allocated()
    del made, got
    assert torch.spyre.memory_allocated() == before - want.allocation.size   # its DRAM back with its storage


def test_the_backend_kernels_run_outside_dynamo_and_give_its_callback_back():
    from spyre_lab.runtime.outside_dynamo import outside_dynamo

    _set_eval_frame = torch._C._dynamo.eval_frame.set_eval_frame

    seen = []
    kernel = outside_dynamo(lambda: seen.append(_set_eval_frame(None)) or 7)
    assert kernel() == 7 and seen == [None]
    callback = torch._dynamo.eval_frame._callback_from_stance(False)   # Dynamo's run-only callback
    prior = _set_eval_frame(callback)
    try:
        assert kernel() == 7 and seen == [None, None]    # none inside the kernel
        assert _set_eval_frame(callback) is callback     # the caller's back afterwards
    finally:
        _set_eval_frame(prior)
    compiled = torch.compile(lambda p, q: torch.add(p, q).relu(), backend="eager")
    _, _, x, y = _pair()
    assert torch.equal(compiled(x, y).cpu(), torch.add(x, y).relu().cpu())


def _cached_launcher(x, y):
    from spyre_lab.runtime.eager_programs import cached_programs

    torch.add(x, y)
    torch.add(x, y)                                 # the second call takes the cached launcher and its image
    return next(iter(cached_programs()[-1].launchers.values()))


def test_a_cached_op_really_reads_the_buffer_its_patched_address_names(monkeypatch):
    a, b, x, y = _pair()
    made = _cached_launcher(x, y)
    other = torch.full(a.shape, 40.0, dtype=torch.float16, device="spyre")
    area = made.image.area

    class Tampered:                                 # a stale address for x written into the pinned buffer
        def __init__(self, pinned):
            self.pinned = pinned

        def __setitem__(self, key, values):
            values = list(values)
            if values and values[0] == x.data_ptr():
                values[0] = other.data_ptr()
            self.pinned[key] = values

        def __array__(self, dtype=None, copy=None):   # what the H2D copy reads
            return self.pinned

    monkeypatch.setattr(area, "pinned_views", [Tampered(view) for view in area.pinned_views])
    z = torch.add(x, y)
    assert area.last_patched[0][made.image.slots[0]] == other.data_ptr()
    assert torch.equal(z.cpu(), torch.add(torch.full(a.shape, 40.0, dtype=torch.float16), b))   # read `other`


def test_a_cached_op_follows_the_current_stream():
    a, b, x, y = _pair()
    made = _cached_launcher(x, y)
    side = torch.spyre.Stream()
    with torch.spyre.stream(side):
        z = torch.add(x, y)
    assert made.image.stream is side and side.lane in {e.lane for e in last_trace().events}
    w = torch.add(x, y)
    assert made.image.stream is torch.spyre.current_stream() and side.lane not in {e.lane for e in last_trace().events}
    assert torch.equal(z.cpu(), a + b) and torch.equal(w.cpu(), a + b)


def test_an_adopted_result_reads_back_flat_and_stickified():
    a, b, x, y = _pair((8, 64))
    z = torch.add(x, y)
    buffer = z.untyped_storage().spyre_buffer
    flat = buffer.host_flat()
    assert flat.dim() == 1 and buffer.host_flat() is flat and torch.equal(flat, (a + b).reshape(-1))
    assert torch.equal(z.cpu(), a + b) and torch.equal(z[2:4, 3:].cpu(), (a + b)[2:4, 3:])
    from spyre_lab.device.layout import unstickify
    assert torch.equal(unstickify(buffer.data, buffer.layout).reshape(-1), (a + b).reshape(-1))
