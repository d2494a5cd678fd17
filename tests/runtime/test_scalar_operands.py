"""Python numbers and CPU 0-dim tensors beside a spyre tensor behave as on the CPU, in every op form.

torch hands some scalar forms to the backend as the Tensor overload with the number unwrapped
(``int_tensor & 5`` arrives as ``bitwise_and.Tensor(t, 5)``); the device must take them as the CPU does:
same values, same result dtype, and an error exactly where the CPU raises one.
"""

from __future__ import annotations

import operator

import pytest
import torch
from warning_checks import only_warnings

VALUES = {
    torch.int32: torch.tensor([1, 2, 3, 12, -7], dtype=torch.int32),
    torch.int64: torch.tensor([1, 2, 3, 12, -7], dtype=torch.int64),
    torch.bool: torch.tensor([True, False, True, False, True]),
    torch.float16: torch.tensor([1.5, -2.0, 3.25, 0.0, 7.0], dtype=torch.float16),
}
SCALARS = {"int": 5, "bool": True, "float": 2.5, "cpu 0-dim int": torch.tensor(3), "cpu 0-dim bool": torch.tensor(True)}

BINARY = {
    "&": operator.and_, "|": operator.or_, "^": operator.xor, "<<": operator.lshift, ">>": operator.rshift,
    "+": operator.add, "*": operator.mul, "-": operator.sub, "==": operator.eq, "<": operator.lt,
    "maximum": lambda a, b: torch.maximum(a, b if isinstance(b, torch.Tensor) else torch.tensor(b)),
    "logical_and": lambda a, b: torch.logical_and(a, b if isinstance(b, torch.Tensor) else torch.tensor(b)),
    "where": lambda a, b: torch.where(a != 0, a, b),
}


def _run(fn, *args):
    try:
        return fn(*args), None
    except Exception as exc:            # the CPU's verdict is the reference: an error there is one here
        return None, exc


EXPECTED_WARNINGS = (
    r"aten::\w+ has no spyre kernel",                       # |, ^, <<, >> run as CPU fallbacks
    r"spyre stores torch\.float32 tensors as float16",      # int tensor * 2.5 is float32
    r"the compiled program for aten::\w+ disagrees with the CPU op",   # a compiler gap: the reference kernel runs
)


def _compare(cpu_fn, spyre_fn, label):
    want, cpu_error = _run(cpu_fn)
    with only_warnings(*EXPECTED_WARNINGS):
        got, spyre_error = _run(spyre_fn)
    if cpu_error is not None:
        assert spyre_error is not None, f"{label}: the CPU raises {cpu_error!r}, spyre returned {got}"
        return
    assert spyre_error is None, f"{label}: the CPU computes it, spyre raised {spyre_error!r}"
    assert got.device.type == "spyre" and got.dtype == want.dtype, f"{label}: {got.dtype} vs {want.dtype}"
    assert torch.equal(got.cpu(), want), f"{label}: {got.cpu()} vs {want}"


def _cases():
    for op in BINARY:
        for dtype in VALUES:
            for scalar in SCALARS:
                if dtype != torch.float16 and scalar == "float" and op in ("&", "|", "^", "<<", ">>"):
                    continue            # a float bit-op is an error on both sides: covered once below
                yield op, dtype, scalar


@pytest.mark.parametrize(("op", "dtype", "scalar"), list(_cases()))
def test_a_scalar_operand_gives_what_the_cpu_gives(op, dtype, scalar):
    fn, value, x = BINARY[op], SCALARS[scalar], VALUES[dtype]
    label = f"{dtype} {op} {scalar}"
    _compare(lambda: fn(x, value), lambda: fn(x.to("spyre"), value), label)
    if not isinstance(value, torch.Tensor) and op not in ("maximum", "logical_and", "where"):
        _compare(lambda: fn(value, x), lambda: fn(value, x.to("spyre")), f"reflected {label}")


@pytest.mark.parametrize("op", ["&=", "|=", "^=", "<<=", ">>="])
@pytest.mark.parametrize("dtype", [torch.int32, torch.bool])
def test_in_place_bit_ops_with_a_scalar_write_like_the_cpu(op, dtype):
    scalar = True if dtype == torch.bool else 6
    fn = {"&=": operator.iand, "|=": operator.ior, "^=": operator.ixor, "<<=": operator.ilshift,
          ">>=": operator.irshift}[op]

    def on(device):
        t = VALUES[dtype].clone().to(device)
        return fn(t, scalar).cpu()

    _compare(lambda: on("cpu"), lambda: on("spyre").to("spyre"), f"{dtype} {op} {scalar}")


def test_a_float_bit_op_is_refused_as_on_the_cpu():
    x = VALUES[torch.int32]
    with pytest.raises(RuntimeError):
        x & 2.5
    with pytest.raises(RuntimeError), only_warnings(*EXPECTED_WARNINGS):
        x.to("spyre") & 2.5
