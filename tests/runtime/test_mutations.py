"""In-place updates land in the caller's tensors on every launch path (eager, compiled, engine pieces).

A compiled graph is functional; its in-place updates are a list the runtime must apply after the
run. Forgetting them on one path is a silent wrong answer, so each path is enumerated here, and a
structural check holds that every device launch goes through the one function that applies them.
"""

from __future__ import annotations

import ast
import contextlib
import pathlib
import warnings

import pytest
import torch
from torch import nn

import spyre_lab
from spyre_lab.compiler.backend import compile_graph
from spyre_lab.engine.platforms.piecewise import piecewise_backend
from spyre_lab.runtime import process_state
from spyre_lab.runtime.launch import RuntimeOptions, last_plan, set_default_options
from spyre_lab.runtime.programs import run_program

DISPATCH = ["aot_patch", "rebuild"]


@pytest.fixture(params=DISPATCH)
def dispatch(request):
    previous = set_default_options(RuntimeOptions(dispatch=request.param))
    yield request.param
    set_default_options(previous)


def _add_(x):
    x.add_(1)
    return x * 2


def _slice_zero(x):
    x[:, 0] = 0
    return x.sum(-1)


def _cache_write(cache, index, value):
    cache.index_copy_(0, index, value)
    return cache.sum(0)


def _two_updates(x, y):
    x.mul_(2)
    y.sub_(x)
    return x + y


CASES = {
    "add_": (_add_, lambda: [torch.zeros(4, 8)]),
    "x[:, 0] = 0": (_slice_zero, lambda: [torch.randn(4, 8, generator=torch.Generator().manual_seed(1))]),
    "index_copy_": (_cache_write, lambda: [torch.zeros(6, 8), torch.tensor([1, 4]), torch.ones(2, 8)]),
    "two inputs": (_two_updates, lambda: [torch.full((3, 5), 1.5), torch.full((3, 5), 0.25)]),
}


@contextlib.contextmanager
def only_fallbacks(*ops: str):
    """Any warning raised inside is a CPU-fallback notice for one of ``ops`` (the compiler's
    index_put has no device lowering); anything else fails the test."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for w in caught:
        assert any(op in str(w.message) for op in ops) and "host" in str(w.message), str(w.message)


def _half(tensors):
    return [t.half() if t.is_floating_point() else t for t in tensors]


def _expected(fn, make):
    inputs = _half(make())
    out = fn(*inputs)
    return out, inputs


def _assert_state(got_out, got_inputs, want_out, want_inputs):
    torch.testing.assert_close(got_out.cpu(), want_out)
    for got, want in zip(got_inputs, want_inputs):
        torch.testing.assert_close(got.cpu(), want)


@pytest.mark.parametrize("case", sorted(CASES))
def test_compiled_function_on_spyre(case, dispatch):
    fn, make = CASES[case]
    want_out, want_inputs = _expected(fn, make)
    inputs = [t.to("spyre") for t in _half(make())]
    torch._dynamo.reset()
    with only_fallbacks("aten.index_put"):
        out = torch.compile(fn, backend="spyre")(*inputs)
    _assert_state(out, inputs, want_out, want_inputs)
    assert any(s.name.startswith("write back") for s in last_plan().steps)


@pytest.mark.parametrize("case", sorted(CASES))
def test_compiled_function_on_cpu(case):
    fn, make = CASES[case]
    want_out, want_inputs = _expected(fn, make)
    inputs = _half(make())
    torch._dynamo.reset()
    with only_fallbacks("aten.index_put"):
        out = torch.compile(fn, backend="spyre")(*inputs)
    _assert_state(out, inputs, want_out, want_inputs)


@pytest.mark.parametrize("device", ["spyre", "cpu"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_run_program_directly(case, device, dispatch):
    fn, make = CASES[case]
    want_out, want_inputs = _expected(fn, make)
    inputs = [t.to(device) for t in _half(make())]
    with only_fallbacks("aten.index_put"):
        program = compile_graph(fn, [t.cpu() for t in inputs])
    assert program.mutations
    (out,) = run_program(program, inputs, options=RuntimeOptions(dispatch=dispatch))
    _assert_state(out, inputs, want_out, want_inputs)


class Counter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("n", torch.zeros(2, 8, dtype=torch.float16))
        self.lin = nn.Linear(8, 8).half()

    def forward(self, x):
        self.n.add_(1)
        return self.lin(x) + self.n


@pytest.mark.parametrize("backend", ["spyre", "piecewise"])
def test_module_buffer_updates_every_call(backend, dispatch):
    """A module's buffer updated in forward: after 3 calls it reads 3, as in eager (engine pieces too)."""
    torch.manual_seed(0)
    eager = Counter()
    model = Counter()
    model.load_state_dict(eager.state_dict())
    model = model.to("spyre")
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="spyre" if backend == "spyre" else piecewise_backend)
    x = torch.randn(2, 8).half()
    for _ in range(3):
        want = eager(x)
        got = compiled(x.to("spyre"))
    torch.testing.assert_close(got.cpu(), want, atol=1e-2, rtol=1e-2)
    assert model.n.cpu().eq(3).all()
    torch.testing.assert_close(model.n.cpu(), eager.n)


def test_eager_paths_update_in_place(dispatch):
    """Eager one-op programs: an in-place device op, an out= op (compiled one-op program), a fallback op."""
    a = torch.randn(4, 8).half()
    b = torch.randn(4, 8).half()
    sa, sb = a.to("spyre"), b.to("spyre")
    sa.add_(sb)                                     # device op, written in place by its kernel
    a.add_(b)
    torch.testing.assert_close(sa.cpu(), a)
    out = torch.empty(4, 8, dtype=torch.float16, device="spyre")
    torch.mul(sa, sb, out=out)                      # out=: the compiled one-op program writes the caller's tensor
    torch.testing.assert_close(out.cpu(), a * b)
    values = torch.empty(4, 8, dtype=torch.float16, device="spyre")
    indices = torch.empty(4, 8, dtype=torch.long, device="spyre")
    process_state.reset("warnings")
    with pytest.warns(UserWarning, match="cummax"):
        torch.cummax(sa, 1, out=(values, indices))  # CPU fallback writing arguments it does not return
    want = torch.cummax(a, 1)
    torch.testing.assert_close(values.cpu(), want.values)
    torch.testing.assert_close(indices.cpu(), want.indices)


def test_writeback_is_on_the_launch_plan():
    """The in-place update is a traced kernel of the launch, after the program's own kernels."""
    x = torch.zeros(4, 8, dtype=torch.float16, device="spyre")
    program = compile_graph(_add_, [x.cpu()])
    run_program(program, [x])
    names = [s.name for s in last_plan().steps if s.kind.value == "Compute"]
    assert names[-1] == f"write back {program.inputs[0]}"
    assert x.cpu().eq(1).all()


ROOT = pathlib.Path(spyre_lab.__file__).parent


def test_every_device_launch_goes_through_the_one_launch_route():
    """Only ``runtime/launch/route.py`` queues a program's steps (``CorrectionArea.queued``, ``Stream.enqueue_all``):
    every launch goes through ``launch``, so none can run a program and drop its in-place updates' write-backs."""
    offenders = []
    for path in ROOT.rglob("*.py"):
        if path.relative_to(ROOT).as_posix() == "runtime/launch/route.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in ("queued", "enqueue_all"):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} calls {node.func.attr}")
    assert not offenders, offenders
