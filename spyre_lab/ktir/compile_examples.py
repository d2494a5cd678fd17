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
from spyre_lab.ktir.roundtrip import KernelRoundTrip, round_trip


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


def compile_example(name: str, out: str | Path) -> tuple[list[Path], list[tuple[str, str]], list[KernelRoundTrip]]:
    """Compile example ``name``, write one ``.mlir`` per kernel into ``out``, and hold each written kernel
    against the compiled one (re-imported and run on the values the program feeds it, timed analytically).

    Returns the KTIR files written, ``(kernel, reason)`` for each kernel the exporter refused (the reason is
    also written to ``<kernel>.unsupported.txt`` beside the files) and the round trip of each written kernel.
    """
    from spyre_lab.compiler import compile_graph

    if name not in EXAMPLES:
        raise ValueError(f"no example program {name!r}; choose one of {sorted(EXAMPLES)}")
    fn, make_inputs = EXAMPLES[name]
    torch.manual_seed(0)
    inputs = make_inputs()
    program = compile_graph(fn, inputs)
    paths = write_program(program, out)
    written = [p for p in paths if p.suffix == ".mlir"]
    refused = [(p.name.removesuffix(".unsupported.txt"), p.read_text().strip()) for p in paths
               if p.name.endswith(".unsupported.txt")]
    checks = [r for r in round_trip(program, inputs, modes=("analytic",)) if r.exported]
    return written, refused, checks


def main(name: str, out: str) -> int:
    """Print what was written (with its round trip) and what was refused; exit status 0 (a refusal is
    reported, not an error)."""
    written, refused, checks = compile_example(name, out)
    by_kernel = {c.kernel: c for c in checks}
    print(f"{name}: {len(written)} kernel(s) written as KTIR to {out}")
    for path in written:
        check = by_kernel.get(path.stem)
        held = "" if check is None else (
            f"  (read back: max |error| {check.max_abs_error:.3g}; modeled {check.ktir_us['analytic']:.2f} us, "
            f"compiled {check.compiled_us['analytic']:.2f} us)")
        print(f"  {path}{held}")
    for kernel, reason in refused:
        print(f"  refused {kernel}: {reason}")
    return 0
