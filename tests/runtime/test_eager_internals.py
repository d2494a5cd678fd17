"""The eager path says why it did not use a compiled program, and its modules import one way only."""

from __future__ import annotations

import ast
import pathlib

import pytest
import torch

import spyre_lab.compiler.backend as backend
from spyre_lab.runtime import ops

RUNTIME = pathlib.Path(ops.__file__).parent


def test_a_compiler_failure_warns_with_its_reason_and_the_op_still_runs(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("lowering exploded")

    monkeypatch.setattr(backend, "compile_graph", broken)
    monkeypatch.setattr(ops, "_compile_gaps", set())
    ops.clear_program_cache()
    x = torch.randn(3, 5).half()
    with pytest.warns(UserWarning, match=r"no compiled one-op program for aten::tanh: the compiler raised "
                                         r"RuntimeError: lowering exploded.*reference kernel"):
        got = torch.tanh(x.to("spyre")).cpu()
    torch.testing.assert_close(got, torch.tanh(x))
    ops.clear_program_cache()


def test_a_program_that_disagrees_with_the_cpu_is_refused_with_a_warning(monkeypatch):
    real = backend.compile_graph

    def wrong_op(fn, examples, *args, **kwargs):           # compile a different op than the one asked for
        return real(lambda *t: fn(*t) + 1, examples, *args, **kwargs)

    monkeypatch.setattr(backend, "compile_graph", wrong_op)
    monkeypatch.setattr(ops, "_compile_gaps", set())
    ops.clear_program_cache()
    x = torch.randn(4, 6).half()
    with pytest.warns(UserWarning, match=r"aten::sigmoid: its compiled program disagrees with the CPU op"):
        got = torch.sigmoid(x.to("spyre")).cpu()
    torch.testing.assert_close(got, torch.sigmoid(x))      # the reference kernel ran: the value is right
    ops.clear_program_cache()


def _imports(module: str) -> set[str]:
    tree = ast.parse((RUNTIME / f"{module}.py").read_text())
    return {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}


def test_ops_special_does_not_import_ops_back():
    assert "spyre_lab.runtime.ops_special" in _imports("ops")
    assert "spyre_lab.runtime.ops" not in _imports("ops_special")
