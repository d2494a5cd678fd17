import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spyre_lab.device.layout import DmaNest, StickLayout, iter_device_positions, stickify, unstickify

FP16 = torch.float16
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.int32, torch.int64, torch.int8, torch.uint8, torch.bool,
          torch.float8_e4m3fn, torch.float8_e5m2]
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --- the documented examples (torch-spyre spyre_tensor_impl.cpp, tensors_and_layouts.md) -------
@pytest.mark.parametrize(
    "shape, dim_order, device_size, stride_map",
    [
        ((1024, 256), None, (4, 1024, 64), (64, 256, 1)),
        ((5, 100, 150), None, (100, 3, 5, 64), (150, 64, 15000, 1)),
        ((5, 100, 150), [1, 0, 2], (5, 3, 100, 64), (15000, 64, 150, 1)),
        ((), None, (1, 64), (-1, -1)),
        ((50, 10, 200), None, (10, 4, 50, 64), (200, 64, 2000, 1)),
        ((128, 256, 512), None, (256, 8, 128, 64), (512, 64, 131072, 1)),
    ],
)
def test_documented_default_layouts(shape, dim_order, device_size, stride_map):
    layout = StickLayout.default(shape, FP16, dim_order)
    assert layout.device_size == device_size
    assert layout.stride_map == stride_map


def test_documented_dci():
    nests = StickLayout.default((1024, 256), FP16).dci()
    assert nests == (DmaNest((4, 1024, 64), (65536, 64, 1), (64, 256, 1)),)
    assert nests[0][:3] == ((4, 1024, 64), (65536, 64, 1), (64, 256, 1))


def test_padding_of_the_stick_dim():
    layout = StickLayout.default((5, 100, 150), FP16)
    assert layout.stick_dim == 2
    assert layout.num_sticks == 100 * 3 * 5
    assert layout.device_nbytes == 1500 * 128
    assert layout.host_nbytes == 5 * 100 * 150 * 2
    assert layout.padding_fraction == pytest.approx(1 - 150 / 192)
    # element 149 is the last real one of its row; 150..191 are padding
    assert layout.host_offset((0, 2, 0, 149 - 128)) == 149
    with pytest.raises(ValueError, match="padding"):
        layout.host_offset((0, 2, 0, 150 - 128))


@pytest.mark.parametrize("dtype, eps", [(torch.float16, 64), (torch.bfloat16, 64), (torch.float32, 32),
                                        (torch.int32, 32), (torch.int64, 32), (torch.int8, 128), (torch.bool, 64)])
def test_elements_per_stick_follow_the_device_format(dtype, eps):
    layout = StickLayout.default((3, 300), dtype)
    assert layout.elems_per_stick == eps
    assert layout.stick_bytes == 128
    assert stickify(torch.zeros(3, 300, dtype=dtype)).nbytes == layout.device_nbytes


def test_int64_is_narrowed_to_int32_and_refuses_values_that_do_not_fit():
    layout = StickLayout.default((4,), torch.int64)
    assert layout.device_dtype == torch.int32
    t = torch.tensor([0, -5, 2**31 - 1, -(2**31)])
    assert torch.equal(unstickify(stickify(t), layout), t)
    with pytest.raises(ValueError, match="int32"):
        stickify(torch.tensor([2**31]))


def test_rank_one_and_size_one_dims():
    assert StickLayout.default((300,), FP16).device_size == (5, 64)
    # size-1 dims are dropped before the rule, so these share one device layout
    a, b = StickLayout.default((512, 1, 256), FP16), StickLayout.default((512, 256), FP16)
    assert (a.device_size, a.stride_map) == (b.device_size, b.stride_map)
    # a size-1 stick dim hands the stick to the next dim of dim_order
    col = StickLayout.default((256, 1), FP16)
    assert col.stick_dim == 0 and col.device_size == (4, 64)
    every_dim_one = StickLayout.default((1, 1, 1), FP16)
    assert every_dim_one.stick_dim is None
    assert (every_dim_one.device_size, every_dim_one.stride_map) == ((1, 64), (-1, -1))
    assert every_dim_one.host_offset((0, 0)) == 0
    with pytest.raises(ValueError, match="synthetic"):
        every_dim_one.host_offset((0, 1))


def test_device_coords_invert_host_offset_on_a_traced_element():
    layout = StickLayout.default((5, 100, 150), FP16, [1, 0, 2])
    coords = layout.device_coords((3, 42, 131))
    assert coords == (3, 2, 42, 3)
    assert layout.host_offset(coords) == 3 * 15000 + 42 * 150 + 131
    assert layout.device_offset(coords) == sum(c * s for c, s in zip(coords, layout.device_strides))


def test_describe_mentions_what_a_learner_needs():
    text = StickLayout.default((5, 100, 150), FP16).describe()
    for needle in ("(5, 100, 150)", "(100, 3, 5, 64)", "(150, 64, 15000, 1)", "21.9%", "1,500", "remainder"):
        assert needle in text


@pytest.mark.parametrize(
    "call, error, needle",
    [
        (lambda: StickLayout.default((4, 4), FP16, [0, 0]), ValueError, "permutation"),
        (lambda: StickLayout.default((4, -1), FP16), ValueError, "negative"),
        (lambda: StickLayout.default((4, 4), torch.float64), TypeError, "float64"),
        (lambda: StickLayout.default((4, 4), FP16, stick_bytes=96), ValueError, "power of two"),
        (lambda: StickLayout((4, 4), FP16, (0, 1), (1, 4, 64), (64, 4, 2), 64), ValueError, "StickLayout.default"),
        (lambda: stickify(torch.zeros(4, 4), StickLayout.default((4, 4), FP16)), ValueError, "layout is for"),
        (lambda: unstickify(torch.zeros(4, 64), StickLayout.default((4, 4), FP16)), ValueError, "expects"),
        (lambda: StickLayout.default((4, 4), FP16).host_offset((0, 9, 0)), IndexError, "outside"),
    ],
)
def test_bad_input_names_the_problem(call, error, needle):
    with pytest.raises(error, match=needle):
        call()


def test_stickify_accepts_views_and_pads_with_zeros():
    base = torch.randn(70, 40, dtype=torch.float32)
    t = base.t()  # (40, 70), non-contiguous
    layout = StickLayout.default(t.shape, t.dtype)
    d = stickify(t, layout)
    assert d.is_contiguous() and d.shape == (3, 40, 32)
    assert torch.all(d[2, :, 70 - 64:] == 0)
    assert torch.equal(unstickify(d, layout), t)


# --- properties over random shapes, dtypes and dim orders --------------------------------------
@st.composite
def layouts(draw, max_numel=3000, dtypes=tuple(DTYPES)):
    rank = draw(st.integers(0, 5))
    shape, budget = [], max_numel
    for _ in range(rank):
        size = draw(st.one_of(st.just(1), st.integers(0, min(200, max(budget, 1)))))
        shape.append(size)
        budget = budget // max(size, 1)
    dim_order = draw(st.permutations(range(rank)))
    return StickLayout.default(shape, draw(st.sampled_from(dtypes)), dim_order)


def random_tensor(layout: StickLayout) -> torch.Tensor:
    shape, dtype = layout.host_shape, layout.dtype
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    if dtype.is_floating_point:
        return torch.randn(shape).to(dtype)
    low, high = (-(2**31), 2**31) if dtype == torch.int64 else (torch.iinfo(dtype).min, torch.iinfo(dtype).max)
    return torch.randint(low, high, shape, dtype=dtype)


@SETTINGS
@given(layouts())
def test_round_trip_is_exact(layout):
    t = random_tensor(layout)
    d = stickify(t, layout)
    assert d.shape == layout.device_size and d.dtype == layout.device_dtype and d.is_contiguous()
    back = unstickify(d, layout)
    assert back.shape == t.shape and back.dtype == t.dtype and back.is_contiguous()
    assert torch.equal(back, t)
    assert int(d.ne(0).sum()) == int(t.ne(0).sum())  # padding holds zeros only


@SETTINGS
@given(layouts(max_numel=400, dtypes=(torch.int32,)))
def test_host_offset_agrees_with_where_stickify_puts_each_element(layout):
    marker = torch.arange(1, layout.host_numel + 1, dtype=torch.int32).reshape(layout.host_shape)
    flat = stickify(marker, layout).reshape(-1)
    seen = []
    for coords in iter_device_positions(layout):
        value = int(flat[layout.device_offset(coords)])
        try:
            offset = layout.host_offset(coords)
        except ValueError:
            assert value == 0  # padding
            continue
        assert value == offset + 1
        assert layout.device_coords(_unravel(offset, layout.host_shape)) == coords
        seen.append(offset)
    assert sorted(seen) == list(range(layout.host_numel))


@SETTINGS
@given(layouts(max_numel=20000, dtypes=(torch.int32, torch.float16, torch.int8)))
def test_dci_moves_exactly_the_host_elements(layout):
    marker = torch.arange(1, layout.host_numel + 1).reshape(layout.host_shape)
    marker = (marker % 100 + 1).to(layout.dtype)  # never zero, fits every tested dtype
    device = stickify(marker, layout).reshape(-1)
    host_offsets, device_offsets = [], []
    for nest in layout.dci():
        host_offsets.append(nest.host_offset + _offsets(nest.loop_ranges, nest.host_strides))
        device_offsets.append(nest.device_offset + _offsets(nest.loop_ranges, nest.device_strides))
    host_all = torch.cat(host_offsets) if host_offsets else torch.zeros(0, dtype=torch.long)
    device_all = torch.cat(device_offsets) if device_offsets else torch.zeros(0, dtype=torch.long)
    assert torch.equal(host_all.sort().values, torch.arange(layout.host_numel))  # each host element once
    assert device_all.unique().numel() == device_all.numel()  # no device element written twice
    assert torch.equal(device[device_all], marker.reshape(-1)[host_all])
    assert int(device.ne(0).sum()) == layout.host_numel  # everything else is padding
    for nest in layout.dci():
        assert list(nest.device_strides) == sorted(nest.device_strides, reverse=True)


def _offsets(ranges, strides) -> torch.Tensor:
    """Every ``dot(i, strides)`` of the loop nest, in loop order; synthetic (-1) loops have range 1."""
    total = torch.zeros((), dtype=torch.long)
    for n, s in zip(ranges, strides):
        total = total.unsqueeze(-1) + torch.arange(n) * max(s, 0)
    return total.reshape(-1)


def _unravel(offset: int, shape) -> tuple[int, ...]:
    index = []
    for n in reversed(shape):
        offset, i = divmod(offset, n) if n else (offset, 0)
        index.append(i)
    return tuple(reversed(index))


def test_stick_math_matches_config():
    from spyre_lab.device.config import SPYRE

    for dtype in (torch.float16, torch.float32, torch.int8):
        assert StickLayout.default((8, 8), dtype).elems_per_stick == SPYRE.elems_per_stick(dtype)
    layout = StickLayout.default((8, 1000), torch.float16)
    assert layout.device_nbytes == SPYRE.sticks(1024 * 2) * SPYRE.stick_bytes * 8
    assert math.prod(layout.device_size) == layout.device_numel
