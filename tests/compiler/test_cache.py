"""Program cache: same graph and shapes compile nothing; a new shape recompiles and explain() says so."""

from __future__ import annotations

import pytest
import torch

import spyre_lab.compiler  # noqa: F401
from spyre_lab.compiler import cache
from spyre_lab.compiler.backend import compile_graph
from spyre_lab.compiler.options import CompileOptions
from spyre_lab.device.config import SPYRE
from spyre_lab.runtime.dynamo_backend import explain


def fn(x):
    return torch.softmax(x, -1) * 2


def test_second_compile_is_a_hit_and_compiles_nothing():
    cache.clear()
    x = torch.randn(16, 64).half()
    first = compile_graph(fn, [x])
    assert cache.stats() == {"hits": 0, "misses": 1, "compiles": 1, "entries": 1}
    again = compile_graph(fn, [torch.randn(16, 64).half()])
    assert again is first and cache.stats()["compiles"] == 1 and cache.stats()["hits"] == 1
    assert "cache hit" in explain(again)


def test_key_covers_shapes_dtypes_options_and_config():
    cache.clear()
    x = torch.randn(16, 64).half()
    base = compile_graph(fn, [x])
    variants = [
        compile_graph(fn, [torch.randn(32, 64).half()]),
        compile_graph(fn, [x.float()]),
        compile_graph(fn, [x], CompileOptions(work_division="naive")),
        compile_graph(fn, [x], cfg=SPYRE.replace(cores=8)),
    ]
    assert all(v is not base for v in variants) and cache.stats()["compiles"] == 5
    assert "recompiled: new input shapes" in variants[0].cache_note


def test_torch_compile_recompiles_only_for_a_new_shape():
    cache.clear()
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU()).half()
    compiled = torch.compile(model, backend="spyre", dynamic=False)
    x = torch.randn(8, 64).half()
    compiled(x)
    compiles = cache.stats()["compiles"]
    compiled(torch.randn(8, 64).half())
    assert cache.stats()["compiles"] == compiles, "same shapes: nothing compiled"
    compiled(torch.randn(24, 64).half())
    assert cache.stats()["compiles"] == compiles + 1
    assert "recompiled" in explain(compiled)


def test_dynamic_graphs_still_get_one_static_program_per_shape():
    """Dynamo turns a graph symbolic after a shape change; the backend then compiles per concrete shape."""
    cache.clear()
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU()).half()
    compiled = torch.compile(model, backend="spyre")
    for rows in (8, 24, 40, 24):
        x = torch.randn(rows, 64).half()
        torch.testing.assert_close(compiled(x), model(x).detach(), atol=1e-2, rtol=1e-2)
    assert cache.stats()["compiles"] == 3 and cache.stats()["hits"] >= 1
    assert "new input shapes [64x64, 64, 40x64]" in explain(compiled)


def test_updating_a_modules_weights_in_place_recompiles():
    cache.clear()
    model = torch.nn.Linear(64, 16).half()
    x = torch.randn(4, 64).half()
    first = compile_graph(model, [x])
    assert compile_graph(model, [x]) is first
    with torch.no_grad():
        model.weight.mul_(2)
    second = compile_graph(model, [x])
    assert second is not first
    from spyre_lab.compiler.executor import execute

    torch.testing.assert_close(execute(second, [x]).outputs[0], model(x).detach(), atol=1e-2, rtol=1e-2)


def test_the_compilers_explain_points_a_compiled_model_to_spyre_lab_explain():
    from spyre_lab.compiler import explain as explain_programs

    with pytest.raises(TypeError, match=r"spyre_lab.explain\(model\)"):
        explain_programs(torch.nn.Linear(2, 2))
