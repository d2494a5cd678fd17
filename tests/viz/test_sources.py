"""viz/sources.py: every view turns its input into data in one place, through the lower layers' public types."""

import ast
import json
from pathlib import Path

import pytest
import torch

from spyre_lab.compiler.backend import compile_graph
from spyre_lab.compiler.kernel_spec import KernelSpec
from spyre_lab.compiler.program import HostFallback
from spyre_lab.viz import sources
from spyre_lab.viz.dataflow import DataflowView
from spyre_lab.viz.fusion import FusionView
from spyre_lab.viz.roofline import Roofline
from spyre_lab.viz.work_division import WorkDivisionView

VIZ = Path(sources.__file__).parent


def _softmax_then_scale(x):
    return torch.softmax(x, dim=-1) * 2


@pytest.fixture(scope="module")
def program():
    torch.manual_seed(0)
    return compile_graph(_softmax_then_scale, [torch.randn(64, 256, dtype=torch.float16)])


def test_timed_launches_are_the_kernel_specs_in_launch_order(program):
    timed = sources.timed_launches(program)
    assert timed and all(isinstance(spec, KernelSpec) for spec, _ in timed)
    assert [spec.name for spec, _ in timed] == [launch.name for launch in program.launches
                                                 if isinstance(launch, KernelSpec)]
    assert [group.name for _, group in timed] == [spec.name for spec, _ in timed]
    assert all(sources.is_timed(spec) and not sources.is_host(spec) for spec, _ in timed)


def test_a_host_fallback_is_host_and_not_timed():
    with pytest.warns(UserWarning, match="special_erfcx runs on the host CPU"):
        program = compile_graph(lambda x: torch.special.erfcx(x), [torch.randn(8, 64)])
    hosts = [launch for launch in program.launches if isinstance(launch, HostFallback)]
    assert hosts, "erfcx has no device lowering: it runs on the host"
    assert all(sources.is_host(h) and not sources.is_timed(h) for h in hosts)
    assert all(not isinstance(spec, HostFallback) for spec, _ in sources.timed_launches(program))


def test_a_program_and_its_one_kernel_give_the_same_trace(program):
    spec, _ = sources.timed_launches(program)[0]
    one = compile_graph(lambda x: torch.softmax(x, dim=-1), [torch.randn(64, 256, dtype=torch.float16)])
    (only, _), = sources.timed_launches(one)
    from_program = sources.as_trace(one).builders["event"]()
    from_spec = sources.as_trace(only).builders["event"]()
    assert [(e.lane, e.start_us, e.dur_us) for e in from_program.events] == \
        [(e.lane, e.start_us, e.dur_us) for e in from_spec.events]
    found = sources.as_trace(program)
    assert found.name == program.name and found.cfg == program.cfg and found.default_mode == "event"
    assert set(found.plans) == {s.name for s, _ in sources.timed_launches(program)}
    assert found.plans[spec.name] is spec.lx_plan


def test_a_saved_program_opens_where_it_can_and_says_why_where_it_cannot(program, tmp_path):
    path = tmp_path / "program.json"
    program.save_json(str(path))
    doc = json.loads(path.read_text())
    assert sources.is_saved_program(doc) and sources.is_program(doc) and sources.is_program(program)
    assert sources.device_config(doc) == program.cfg and sources.program_name(doc) == program.name
    saved = sources.as_recompilable(doc)
    assert saved.program is None and saved.saved is doc and not saved.can_recompile
    with pytest.raises(ValueError, match="holds no tile programs"):
        sources.as_trace(doc)
    with pytest.raises(ValueError, match="needs a saved program"):
        sources.as_recompilable({"name": "x"})
    assert Roofline.from_json(path).name == program.name      # the views read it through the same functions
    assert WorkDivisionView.from_json(path).saved is not None


def test_a_program_is_recompilable_from_the_function_the_cache_keeps(program):
    found = sources.as_recompilable(program)
    assert found.program is program and found.fn is _softmax_then_scale and found.can_recompile
    assert [tuple(x.shape) for x in found.inputs] == [(64, 256)] and found.inputs[0].device.type == "meta"
    view = FusionView(program)
    assert view.can_recompile and view.program is program


def test_wrong_inputs_name_what_each_view_takes():
    with pytest.raises(TypeError, match="WorkDivisionView takes a Program or a compiled model"):
        sources.as_program(3, "WorkDivisionView")
    with pytest.raises(TypeError, match="DataflowView takes a Trace, Program, KernelSpec"):
        DataflowView(3)
    with pytest.raises(TypeError, match="expected an LLM, EngineStats"):
        sources.as_stats(3)
    with pytest.raises(ValueError, match="nothing compiled for"):
        sources.as_recompilable(torch.nn.Linear(4, 4))


def test_views_probe_no_attributes_and_read_no_private_member_of_another_layer():
    """No ``hasattr`` duck-typing of another layer's objects, and underscore names read only on the view itself
    (``self`` / ``view``) or on a plotly figure (``fig``: plotly's own internals, read for speed in ``base.py``)."""
    found = []
    for path in sorted(VIZ.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "hasattr":
                found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
            private = isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.endswith("_")
            if private and ast.unparse(node.value) not in ("self", "view", "fig"):
                found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    assert found == []
