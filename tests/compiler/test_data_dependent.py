"""Data-dependent shapes under torch.compile: a graph break (eager on the host), never a bare StopIteration.

``x[x > 0]``, ``nonzero``, ``masked_select``, ``unique`` ... have output sizes a static Spyre program
cannot hold. Dynamo splits the graph there and runs the op eagerly; the runtime's own Python (the
PrivateUse1 kernel) is never traced by Dynamo. Graphs that return plain numbers (``n * 2`` for a
dynamic int) compute them on the host. With Dynamo told to capture such ops, the error names the switch.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from warning_checks import only_warnings

import spyre_lab.runtime  # noqa: F401  (registers the device even with autoload switched off)
from spyre_lab.compiler import lowering
from spyre_lab.runtime.fallback import reset_fallback_warnings

CASES = {
    "bool_mask": lambda x: x[x > 0] * 2,
    "nonzero": lambda x: torch.nonzero(x > 0) + 1,
    "masked_select": lambda x: torch.masked_select(x, x > 0) * 2,
    "unique": lambda x: torch.unique(x.round()) + 1,
    "where_cond": lambda x: torch.where(x > 0)[0] + 1,
    "repeat_interleave": lambda x: torch.repeat_interleave(x[0], (x[1] > 0).long()),
    "item": lambda x: x * x.sum().item(),
}


def _x() -> torch.Tensor:
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(0)).to(torch.float16)


@pytest.mark.parametrize("device", ["cpu", "spyre"])
@pytest.mark.parametrize("name", list(CASES))
def test_data_dependent_ops_graph_break_and_match_eager(name, device):
    fn = CASES[name]
    torch._dynamo.reset()
    reset_fallback_warnings()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        expected = fn(_x().to(device)).cpu()
        got = torch.compile(fn, backend="spyre")(_x().to(device))
    assert got.device.type == device
    torch.testing.assert_close(got.cpu(), expected)
    # the only warnings: ops the card has no kernel for, named (the graph break itself is Dynamo's log line), and
    # the fp16 storage notice (``.item()`` comes back into the graph as a float32 scalar tensor made on the card)
    assert all("no spyre kernel" in str(w.message) or "runs on the host CPU" in str(w.message)
               or "spyre stores torch.float32 tensors as float16" in str(w.message) for w in caught), \
        [str(w.message)[:120] for w in caught]


def test_the_runtime_is_never_traced_by_dynamo():
    """On main Dynamo compiled spyre_lab's dispatch code after the graph break, handed a SymInt-only
    graph to the backend and ended in StopIteration."""
    torch._dynamo.reset()
    with only_warnings("aten::index has no spyre kernel"):
        torch.compile(CASES["bool_mask"], backend="spyre")(_x().to("spyre"))
    from spyre_lab.runtime.dynamo_backend import compiled_graphs

    graphs = [str(g.gm.graph) for g in compiled_graphs()]
    assert graphs and all("numel" not in g for g in graphs), graphs  # only the user's x > 0 and * 2


@pytest.mark.parametrize("device", ["cpu", "spyre"])
def test_graphs_that_return_numbers_compute_them_on_the_host(device):
    def f(x: torch.Tensor, n: int) -> tuple[torch.Tensor, int, int]:
        return x * n, n * 2, x.shape[0] + n

    compiled = torch.compile(f, backend="spyre")
    x = _x().to(device)
    for n in (3, 4, 5):  # the third call makes n a dynamic SymInt: its arithmetic is a graph output
        y, doubled, plus = compiled(x, n)
        assert (doubled, plus) == (2 * n, 4 + n)
        torch.testing.assert_close(y.cpu(), (_x() * n))


def test_capturing_data_dependent_ops_gives_a_clear_error():
    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True), \
            pytest.raises(Exception, match=r"output shape depends on data.*capture_dynamic_output_shape_ops"):
        torch.compile(CASES["nonzero"], backend="spyre")(_x().to("spyre"))
    torch._dynamo.reset()


def test_a_compiled_host_op_warns_at_the_user_line(monkeypatch):
    monkeypatch.setattr(lowering, "_WARNED", set())
    torch._dynamo.reset()
    table = torch.randn(16, 8).to(torch.float16)
    ids = torch.tensor([1, 3, 5])
    with pytest.warns(UserWarning, match="aten.embedding runs on the host CPU") as caught:
        torch.compile(torch.nn.functional.embedding, backend="spyre")(ids.to("spyre"), table.to("spyre"))
    (w,) = [w for w in caught if "aten.embedding" in str(w.message)]
    assert w.filename == __file__  # on main: spyre_lab/compiler/lowering.py
