"""Reading a LoopIR node's compute back: is it the plain op its name says, and which scalar did it fold in.

The compiler keeps each node's exact torch computation, not a symbolic one; the KTIR writer needs the op and
its operands. Evaluating the node on probe values answers both, and a node that matches no plain form is
refused (KTIRUnsupported) rather than written as something else.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from spyre_lab.compiler.ir import IRNode
from spyre_lab.compiler.ktir_errors import KTIRUnsupported

KernelSpec = Any  # compiler.kernel_spec.KernelSpec; not imported, since kernel_spec.to_ktir imports the KTIR writer


def torch_unary(op: str, x: torch.Tensor) -> torch.Tensor:
    """The torch form of a unary op the writer spells (a KeyError for any other: never a silent identity)."""
    return {"exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "tanh": torch.tanh,
            "neg": torch.neg, "abs": torch.abs, "erf": torch.erf}[op](x)


def torch_binary(op: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "maximum": torch.maximum,
            "minimum": torch.minimum}[op](x, y)


def probe(n: IRNode, *tensors: torch.Tensor) -> torch.Tensor:
    try:
        return n.compute(*tensors).float()
    except Exception as e:  # a compute that refuses probe values cannot be checked: refuse rather than guess
        raise KTIRUnsupported("export", 0, f"node {n.name} ({n.op}) cannot be checked on probe values: {e}") from e


def same_values(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal values; a node that reads through a reshape returns them in another shape (or order)."""
    want = want.float()
    if got.shape == want.shape and torch.allclose(got, want, rtol=1e-3, atol=1e-3):
        return True
    if got.numel() != want.numel():
        return False
    return torch.allclose(got.flatten().sort().values, want.flatten().sort().values, rtol=1e-3, atol=1e-3)


def check_node(n: IRNode, fn, probes: Sequence[torch.Tensor]) -> None:
    """The node must compute what its op name says (no scalar or flag hidden in its compute).

    Inputs read through a view (a reshape, a broadcast) may not combine in their base shapes; those nodes
    are checked by the round trip's numerics instead (tests/ktir/test_round_trip.py)."""
    try:
        want = fn(*[p.float() for p in probes])
    except RuntimeError:
        return          # the probes do not combine in their base shapes (a view): the round trip checks it
    if not same_values(probe(n, *probes), want):
        raise KTIRUnsupported("export", 0, f"node {n.name} ({n.op}) computes something other than plain {n.op} "
                                           "(a folded scalar or flag); not written out yet")


def scalar_of(n: IRNode, sample: torch.Tensor) -> tuple[float, bool]:
    """The scalar folded into a one-input add/sub/mul/div, and whether it is the left operand."""
    at = torch.ones_like(sample) if n.op in ("mul", "div") else torch.zeros_like(sample)
    first = float(probe(n, at).flatten()[0])
    got = probe(n, sample)
    guesses = {"add": [(first, False)], "mul": [(first, False)], "sub": [(-first, False), (first, True)],
               "div": [(1.0 / first if first else float("inf"), False), (first, True)],
               "maximum": [(first, False)], "minimum": [(first, False)]}.get(n.op, [])
    x = sample.float()
    for c, swapped in guesses:
        k = torch.full_like(x, c)
        want = torch_binary(n.op, k, x) if swapped else torch_binary(n.op, x, k)
        if same_values(got, want):
            return c, swapped
    raise KTIRUnsupported("export", 0, f"node {n.name} ({n.op}) with one tensor input is not x {n.op} c")


def threshold(n: IRNode, fn, sample: torch.Tensor) -> float:
    """The scalar ``c`` a one-input compare (``x > c``) folded in: read off a fine sweep, then checked exactly."""
    sweep = torch.linspace(-8, 8, 2**14 + 1).to(sample.dtype)
    got = probe(n, sweep.reshape(-1, *([1] * (sample.dim() - 1))).expand(-1, *sample.shape[1:]).contiguous()
                if sample.dim() else sweep).bool()
    flat = got.reshape(sweep.shape[0], -1)[:, 0]
    changes = torch.nonzero(flat[1:] != flat[:-1]).flatten()
    candidates = [float(sweep[i]) for i in changes] + [float(sweep[i + 1]) for i in changes] + [0.0]
    for c in candidates:
        on_sweep = torch.equal(flat, fn(sweep.float(), torch.full_like(sweep.float(), c)))
        if on_sweep and torch.equal(probe(n, sample).bool(), fn(sample.float(), torch.full_like(sample.float(), c))):
            return c
    raise KTIRUnsupported("export", 0, f"node {n.name} ({n.op}) with one tensor input is not x {n.op} c")


def clamp_bounds(n: IRNode, sample: torch.Tensor) -> tuple[float | None, float | None]:
    """The (min, max) a one-input clamp folded in (None for a side it leaves open): read off the node at the
    dtype's extremes, then checked on a sweep through both bounds and on ``sample``."""
    big = float(torch.finfo(sample.dtype).max)
    low = float(probe(n, torch.full_like(sample, -big)).flatten()[0])
    high = float(probe(n, torch.full_like(sample, big)).flatten()[0])
    lo, hi = (low if low > -big else None), (high if high < big else None)
    reach = 2 * (abs(lo or 0.0) + abs(hi or 0.0) + 1)
    sweep = torch.linspace(-reach, reach, max(sample.numel(), 2))[:sample.numel()].reshape(sample.shape)
    for x in (sweep.to(sample.dtype), sample):
        if not torch.equal(probe(n, x), x.float().clamp(lo, hi).to(x.dtype).float()):
            raise KTIRUnsupported("export", 0, f"node {n.name} ({n.op}) is not clamp(x, min, max)")
    return lo, hi


def buffer_types(spec: KernelSpec, nodes: Sequence[IRNode], inputs: Sequence[str]
                 ) -> tuple[dict[str, torch.dtype], dict[str, tuple[int, ...]]]:
    """Every buffer's dtype and shape: DRAM buffers say theirs; an intermediate's is what its node returns.

    The writer types every SSA value it names; an intermediate has no declared type, so the nodes are run on
    probe inputs (ones) in order and their results give it."""
    values = {b: torch.ones(spec.buffers[b].shape, dtype=spec.buffers[b].dtype) for b in inputs}
    for n in nodes:
        args = [values[b] for b in n.inputs]
        values[n.output] = probe(n, *args).to(n.compute(*args).dtype)
    return {b: t.dtype for b, t in values.items()}, {b: tuple(t.shape) for b, t in values.items()}
