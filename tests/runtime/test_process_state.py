"""Process-wide state has one list and one reset: ``spyre_lab.runtime.process_state``.

The list is held complete by reading the source: every module-level mutable object of the runtime (and of the
compiler's program cache) is either listed there or named below as a table written once at import.
"""

from __future__ import annotations

import ast
import pathlib
import sys
import warnings

import pytest
import torch

import spyre_lab
from spyre_lab.runtime import process_state

ROOT = pathlib.Path(spyre_lab.__file__).parent
MUTABLE_CALLS = {"dict", "list", "set", "OrderedDict", "WeakKeyDictionary", "WeakValueDictionary", "defaultdict"}
IMMUTABLE_CALLS = {"DispatchKeySet"}
TABLES = {
    # (module, name): written once at import and only read afterwards
    ("spyre_lab.runtime", "_EXPORTS"), ("spyre_lab.runtime.launch.plan", "UNIT"),
    ("spyre_lab.runtime.generic_api", "ACCELERATOR_ROUTES"), ("spyre_lab.runtime.ops_special", "SPECIAL"),
    *(("spyre_lab.compiler.op_tables", name) for name in ("DEVICE_POINTWISE", "DEVICE_REDUCTIONS", "HOST_ONLY_REASON",
                                                          "MATMUL_OPS", "MULTI_OUTPUT_NAMES", "SHAPE_ONLY_OPS",
                                                          "SPLIT_OPS", "VIEW_OPS")),
    *(("spyre_lab.compiler.ktir_rows", name) for name in ("BINARY", "COMPARE", "REDUCE", "INFINITY_BITS", "UNARY")),
    ("spyre_lab.compiler.ktir_matmul", "TILE_AXES"),
    ("spyre_lab.compiler.ktir_writer", "NAMES"), ("spyre_lab.compiler.codegen", "_PLANNERS"),
    ("spyre_lab.compiler.pattern_attention", "_MASK_BRANCH_OPS"), ("spyre_lab.compiler.per_core", "PARTIAL_COMBINE"),
    ("spyre_lab.compiler.tiling_common", "COMBINE_OP"),
}


def _module(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _mutable_globals(path: pathlib.Path) -> set[str]:
    """Module-level names bound to a dict/list/set (or weak/ordered one), an instance made at import, or rebound
    with ``global``."""
    tree = ast.parse(path.read_text())
    names = set()
    for node in tree.body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        mutable = isinstance(value, (ast.Dict, ast.List, ast.Set))
        if isinstance(value, ast.Call):
            func = value.func
            called = (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")).lstrip("_")
            mutable = called in MUTABLE_CALLS or (called[:1].isupper() and called[1:2].islower()  # an instance
                                                   and called not in IMMUTABLE_CALLS)
        if mutable:
            names |= {t.id for t in targets if isinstance(t, ast.Name) and t.id != "__all__"}
    names |= {name for node in ast.walk(tree) if isinstance(node, ast.Global) for name in node.names}
    return names


def test_every_module_level_mutable_object_is_listed():
    listed = {(h.module, h.attribute) for h in process_state.STATE}
    paths = [p for part in ("runtime", "compiler") for p in sorted((ROOT / part).rglob("*.py"))]
    missing = sorted(f"{_module(p)}.{name}" for p in paths for name in _mutable_globals(p)
                     if (_module(p), name) not in listed | TABLES)
    assert not missing, f"list these in spyre_lab/runtime/process_state.py (or keep them on the card): {missing}"


def test_every_listed_object_exists_and_names_a_known_part():
    for held in process_state.STATE:
        module = __import__(held.module, fromlist=["_"])
        assert hasattr(module, held.attribute), f"{held.module}.{held.attribute} is listed but does not exist"
        assert held.part in (*process_state.PARTS, "kept"), held
        assert (held.put_back is None) == (held.part == "kept"), held


def test_reset_clock_puts_time_streams_and_the_current_card_back():
    x = torch.ones(8, 8, dtype=torch.float16, device="spyre")
    side = torch.spyre.Stream()
    with side:
        (x + x).cpu()
    if torch.spyre.device_count() > 1:
        torch.spyre.set_device(1)
    torch.spyre.set_stream(side)
    assert torch.spyre.modeled_time_us() > 0
    process_state.reset("clock")
    assert torch.spyre.modeled_time_us() == 0.0 and side.ready_us == 0.0
    assert torch.spyre.current_device() == 0 and torch.spyre.current_stream().stream_id == 0
    assert torch.spyre.Stream().stream_id == 1                     # the pools' cursors start again


def test_reset_warnings_gives_a_one_time_warning_again():
    x = torch.zeros(4, dtype=torch.float64)
    process_state.reset("warnings")
    with pytest.warns(UserWarning, match="float64"):
        x.to("spyre")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        x.to("spyre")                                              # once per process ...
    process_state.reset("warnings")
    with pytest.warns(UserWarning, match="float64"):
        x.to("spyre")                                              # ... until the reset


def test_reset_caches_changes_no_result():
    from spyre_lab.compiler import cache
    from spyre_lab.runtime import eager_programs

    a = torch.randn(16, 16).half()
    before = (a.to("spyre").exp() * 2).cpu()
    process_state.reset("caches")
    assert eager_programs.program_cache_size() == 0 and cache.stats()["entries"] == 0
    assert torch.equal((a.to("spyre").exp() * 2).cpu(), before)


def test_reset_touches_only_modules_already_imported():
    gone = "spyre_lab.runtime.dynamo_backend" not in sys.modules
    process_state.reset()
    assert gone == ("spyre_lab.runtime.dynamo_backend" not in sys.modules)


def test_an_unknown_part_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="'clock'"):
        process_state.reset("time")


def test_describe_lists_every_entry():
    text = process_state.describe()
    assert all(f"{h.module}.{h.attribute}" in text for h in process_state.STATE)


def test_reset_caches_forgets_the_kernel_plans():
    from spyre_lab.compiler import compile_graph, plan_memo

    compile_graph(lambda x: (x * 2).relu(), [torch.ones(64, 64, dtype=torch.float16)])
    assert plan_memo.stats()["plans"] > 0
    process_state.reset("caches")
    assert plan_memo.stats()["plans"] == 0
