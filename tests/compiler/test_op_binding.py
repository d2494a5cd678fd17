"""The overloads a bound node calls through their torch function resolve to that very overload, with its result."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from spyre_lab.compiler.op_binding import _TORCH_FUNCTIONS, Slot, bind


class _Calls(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def _overload(name: str) -> torch._ops.OpOverload:
    _, packet, overload = name.split(".")
    return getattr(getattr(torch.ops.aten, packet), overload)


@pytest.mark.parametrize("name", sorted(_TORCH_FUNCTIONS))
@pytest.mark.parametrize("second", ["tensor", "number"])
def test_a_torch_function_call_is_its_overload_call(name, second):
    op = _overload(name)
    a = torch.rand(4, 5, dtype=torch.float16) + 0.5
    positional = [x for x in op._schema.arguments if not x.kwarg_only]
    args = [a] if len(positional) == 1 else [a, torch.rand(4, 5, dtype=torch.float16) if second == "tensor" else 2.5]
    calls = _Calls()
    with calls:
        got = _TORCH_FUNCTIONS[name](*args)
    assert calls.seen == [name]
    want = op(*args)
    assert got.dtype == want.dtype and torch.equal(got, want)


def test_a_bound_node_fills_its_slots_whichever_way_it_calls():
    a, b = torch.randn(3, 3), torch.randn(3, 3)
    through_torch = bind(torch.ops.aten.add.Tensor, (Slot(0), Slot(1)), {"alpha": 2})
    boxed = bind(torch.ops.aten.addcmul.default, (Slot(0), Slot(1), Slot(0)), {"value": 0.5})
    assert torch.equal(through_torch(a, b), a + 2 * b)
    assert torch.equal(boxed(a, b), torch.addcmul(a, b, a, value=0.5))
