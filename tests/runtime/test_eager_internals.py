"""The eager path says why it did not use a compiled program, and its modules import one way only."""

from __future__ import annotations

import ast
import pathlib

import pytest
import torch

from spyre_lab.runtime import one_op_compile, ops, process_state

RUNTIME = pathlib.Path(ops.__file__).parent


def test_a_compiler_failure_warns_with_its_reason_and_the_op_still_runs(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("lowering exploded")

    monkeypatch.setattr(one_op_compile, "compile_graph", broken)
    process_state.reset("records", "caches")          # no op refused yet, no one-op program built
    x = torch.randn(3, 5).half()
    with pytest.warns(RuntimeWarning, match=r"no compiled one-op program for aten::tanh: the compiler raised "
                                            r"RuntimeError: lowering exploded.*reference kernel"):
        got = torch.tanh(x.to("spyre")).cpu()
    torch.testing.assert_close(got, torch.tanh(x))
    process_state.reset("records", "caches")          # forget the refusal the broken compiler caused


def test_a_program_that_disagrees_with_the_cpu_is_refused_with_a_warning(monkeypatch):
    real = one_op_compile.compile_graph

    def wrong_op(fn, examples, *args, aten_graph=None, **kwargs):  # compile a different op than the one asked for
        return real(lambda *t: fn(*t) + 1, examples, *args, **kwargs)

    monkeypatch.setattr(one_op_compile, "compile_graph", wrong_op)
    process_state.reset("records", "caches")
    x = torch.randn(4, 6).half()
    with pytest.warns(RuntimeWarning, match=r"compiled program for aten::sigmoid disagrees with the CPU op"):
        got = torch.sigmoid(x.to("spyre")).cpu()
    torch.testing.assert_close(got, torch.sigmoid(x))      # the reference kernel ran: the value is right
    process_state.reset("records", "caches")


def _imports(module: str) -> set[str]:
    tree = ast.parse((RUNTIME / f"{module}.py").read_text())
    return {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}


def test_ops_special_does_not_import_ops_back():
    assert "spyre_lab.runtime.ops_special" in _imports("ops")
    assert "spyre_lab.runtime.ops" not in _imports("ops_special")
