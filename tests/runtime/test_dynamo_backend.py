"""The "spyre" torch.compile backend: registration, options, output structure, Program JSON, explain."""

from __future__ import annotations

import json
from importlib.metadata import entry_points

import pytest
import torch

from spyre_lab.compiler.backend import compile_graph, options_from
from spyre_lab.compiler.explain import Explanation
from spyre_lab.compiler.lowering import LoweringError
from spyre_lab.compiler.options import CompileOptions
from spyre_lab.runtime.dynamo_backend import explain, last_result, spyre_backend


def pair(x, y):
    return torch.relu(x @ y), (x * 2).sum(-1)


@pytest.fixture(autouse=True, scope="module")
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_backend_is_registered_by_entry_point_and_name():
    (ep,) = [ep for ep in entry_points(group="torch_dynamo_backends") if ep.name == "spyre"]
    assert ep.load() is spyre_backend
    assert "spyre" in torch._dynamo.list_backends()


def test_torch_compile_passes_options_and_keeps_output_structure():
    x, y = torch.randn(32, 64).half(), torch.randn(64, 48).half()
    compiled = torch.compile(pair, backend="spyre", fullgraph=True,
                             options={"fusion": [], "work_division": "naive"})
    out = compiled(x, y)
    assert isinstance(out, tuple) and len(out) == 2
    torch.testing.assert_close(out[0], torch.relu(x @ y), atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(out[1], (x * 2).sum(-1), atol=1e-1, rtol=1e-2)
    program = explain(pair)
    assert "work division: naive" in program and "fusion rules on: none" in program
    result = last_result()
    assert result.trace.on("stream0") and result.total_us > 0


def test_unknown_option_is_named():
    with pytest.raises(ValueError, match="fusoin"):
        options_from({"fusoin": []})
    with pytest.raises(ValueError, match="unknown fusion rule"):
        options_from({"fusion": ["softmx"]})
    assert options_from({"fusion": "softmax"}).fusion == frozenset({"softmax"})
    assert options_from(None) == CompileOptions()
    with pytest.raises(TypeError, match=r"compile_graph\(fn, \[x\]\)"):
        compile_graph(pair, torch.randn(2, 2))
    with pytest.raises(TypeError, match="CompileOptions"):
        compile_graph(pair, [torch.randn(2, 2).half()] * 2, options={"fusion": []})


def test_grad_mode_and_parameters_still_compile_for_inference():
    model = torch.nn.Linear(64, 32).half()
    compiled = torch.compile(model, backend="spyre")
    x = torch.randn(4, 64).half()
    out = compiled(x)
    torch.testing.assert_close(out, model(x).detach(), atol=1e-2, rtol=1e-2)


def test_program_json_lists_launches_slots_and_pool():
    x, y = torch.randn(32, 64).half(), torch.randn(64, 48).half()
    program = compile_graph(pair, [x, y])
    doc = json.loads(json.dumps(program.to_json(), default=str))
    assert [i["name"] for i in doc["inputs"]] == program.inputs
    assert len(doc["launches"]) == len(program.launches)
    for launch in doc["launches"]:
        assert launch["address_slots"] and "superdsc" in launch
    assert program.address_slots()[0][:2] == program.inputs


def test_explain_is_printable_in_notebooks():
    x, y = torch.randn(32, 64).half(), torch.randn(64, 48).half()
    text = explain(compile_graph(pair, [x, y]))
    assert isinstance(text, Explanation) and text._repr_html_().startswith("<pre")
    for needle in ("ATen ops", "LoopIR nodes", "division", "LX plan", "us modeled", "program cache"):
        assert needle in text


def test_explain_before_first_call_says_what_to_do():
    model = torch.nn.Linear(8, 8)
    with pytest.raises(ValueError, match="call the compiled model once"):
        explain(torch.compile(model, backend="spyre"))


def test_data_dependent_shapes_run_eagerly_between_graphs():
    def f(x):
        y = x * 2
        idx = torch.nonzero(y > 0)
        return y.sum() + idx.shape[0]

    x = torch.randn(8, 64).half()
    torch.testing.assert_close(torch.compile(f, backend="spyre")(x), f(x))
    with pytest.raises(LoweringError, match="depends on data"):
        compile_graph(f, [x])


def test_spyre_device_tensors_in_spyre_tensors_out():
    model = torch.nn.Linear(64, 32).half()
    x = torch.randn(8, 64).half()
    ref = model(x).detach()
    compiled = torch.compile(model.to("spyre"), backend="spyre")
    out = compiled(x.to("spyre"))
    assert out.device.type == "spyre"
    torch.testing.assert_close(out.cpu(), ref, atol=1e-2, rtol=1e-2)
