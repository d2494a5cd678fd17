"""``spyre-lab compile --ktir OUT``: compile one of the compiler's example programs and write its kernels as KTIR.

A small, fixed set of programs (shapes that compile in a second on one core), so the command shows what the
exporter writes for each kernel family and which kernels it refuses, and why, without a model or weights.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from spyre_lab.compiler.examples import granite_layer, layer_inputs, rms_norm
from spyre_lab.ktir.export import write_program


def _softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x * 2, dim=-1)


def _silu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x)


def _mlp(x: torch.Tensor, wg: torch.Tensor, wu: torch.Tensor, wd: torch.Tensor) -> torch.Tensor:
    return (F.silu(x @ wg) * (x @ wu)) @ wd


def _layer(x, cos, sin, wq, wk, wv, wo, wg, wu, wd, n1, n2):
    return granite_layer(x, cos, sin, wq, wk, wv, wo, wg, wu, wd, n1, n2, heads=4, kv_heads=2)


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float16) * 0.5


EXAMPLES: dict[str, tuple[Callable, Callable[[], list[torch.Tensor]]]] = {
    "softmax": (_softmax, lambda: [_randn(64, 256)]),
    "silu": (_silu, lambda: [_randn(64, 256)]),
    "rms_norm": (rms_norm, lambda: [_randn(128, 512), _randn(512)]),
    "mlp": (_mlp, lambda: [_randn(64, 256), _randn(256, 512), _randn(256, 512), _randn(512, 256)]),
    "layer": (_layer, lambda: layer_inputs(d=256, heads=4, kv_heads=2, ff=512, seq=64)),
}


def compile_example(name: str, out: str | Path) -> tuple[list[Path], list[tuple[str, str]]]:
    """Compile example ``name`` and write one ``.mlir`` per kernel into ``out``.

    Returns the KTIR files written and ``(kernel, reason)`` for each kernel the exporter refused (the
    reason is also written to ``<kernel>.unsupported.txt`` beside the files).
    """
    from spyre_lab.compiler import compile_graph

    if name not in EXAMPLES:
        raise ValueError(f"no example program {name!r}; choose one of {sorted(EXAMPLES)}")
    fn, make_inputs = EXAMPLES[name]
    torch.manual_seed(0)
    program = compile_graph(fn, make_inputs())
    paths = write_program(program, out)
    written = [p for p in paths if p.suffix == ".mlir"]
    refused = [(p.name.removesuffix(".unsupported.txt"), p.read_text().strip()) for p in paths
               if p.name.endswith(".unsupported.txt")]
    return written, refused


def main(name: str, out: str) -> int:
    """Print what was written and what was refused; exit status 0 (a refusal is reported, not an error)."""
    written, refused = compile_example(name, out)
    print(f"{name}: {len(written)} kernel(s) written as KTIR to {out}")
    for path in written:
        print(f"  {path}")
    for kernel, reason in refused:
        print(f"  refused {kernel}: {reason}")
    return 0
