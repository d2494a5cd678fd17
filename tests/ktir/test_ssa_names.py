"""Exported KTIR defines every SSA name once, as MLIR requires (a function argument included)."""

from __future__ import annotations

import re

import torch

from spyre_lab.compiler.backend import compile_graph
from spyre_lab.compiler.kernel_spec import KernelSpec
from spyre_lab.compiler.ktir_errors import KTIRUnsupported

DEFINED = re.compile(r"^\s*(%\w+)(?:\s*,\s*(%\w+))*\s*=", re.M)


def _programs():
    x = torch.randn(64, 256, dtype=torch.float16)
    yield compile_graph(lambda x: torch.softmax(x * 2, -1), [x])
    yield compile_graph(lambda x: torch.nn.functional.silu(x) + x.sum(-1, keepdim=True), [x])
    yield compile_graph(lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6), [x])


def test_every_ssa_name_is_defined_once() -> None:
    checked = 0
    for program in _programs():
        for spec, kernel in zip(program.launches, program.kernels):
            if not isinstance(spec, KernelSpec):
                continue
            try:
                text = spec.to_ktir(kernel.nodes)
            except KTIRUnsupported:
                continue
            names = re.findall(r"(%\w+): index", text)
            names += [n for m in DEFINED.finditer(text) for n in m.groups() if n]
            names += re.findall(r"scf\.for (%\w+)", text)
            twice = sorted({n for n in names if names.count(n) > 1})
            assert not twice, f"{spec.name}: {twice} defined more than once\n{text}"
            checked += 1
    assert checked >= 4
