"""Random straight-line programs written as Python source, for comparing compiled and eager runs on what a caller sees.

Each program takes ``x`` (fp16), ``y`` (fp16, sometimes a view of ``x``) and ``i`` (integers), and mixes the
constructs that broke compiled graphs before: 0-dim constants beside device values, zero-size slices, masks and
``where`` with Python scalars, integer and bool bit ops, in-place updates of inputs and reads through views of
them, float64 steps, and outputs that are views of inputs, constants the caller will write to, the same value
twice, or values moved with ``.to()`` / ``.cpu()`` / a factory call with a device. A program is its source text,
so a failure prints exactly what ran. Seeded: the same index gives the same program; the first
len(VALUE_STEPS) programs start with each step in turn and every output template comes round in turn.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

ROWS, COLS = (2, 6), (3, 9)

VALUE_STEPS = [
    "h = h * torch.tensor({c}, device=h.device)",
    "h = torch.maximum(h, torch.tensor({c}, dtype=h.dtype, device=h.device))",
    "h = torch.minimum(h, torch.tensor({c}).to(h.device, h.dtype))",
    "h = torch.where(x > {c}, h, {s})",
    "h = torch.where(x < {c}, {s}, h)",
    "h = h.masked_fill(x < {c}, {s})",
    "h = h.clone()\n    h[x > {c}] = {s}",
    "h = torch.nan_to_num(h / (x - x), nan={s}, posinf=3.0, neginf=-3.0)",
    "h = torch.triu(h)",
    "h = torch.tril(h, -1) + h * 0.5",
    "h = h + h[:, {cols}:].sum(-1, keepdim=True)",
    "h = torch.cat([h[:, :2] * 2, h[:, {cols}:], h[:, 2:]], dim=-1)",
    "h = h + h[{rows}:].sum(0)",
    "h = torch.softmax(h, -1)",
    "h = h.masked_fill(x > {c}, float('-inf')).softmax(-1).nan_to_num()",
    "h = h + (((i & 3) | 1) ^ 2).to(h.dtype)",
    "h = h + (i % 3).to(h.dtype) * {c}",
    "h = torch.where(((x > 0) & (i > 1)) | ~(x < -1), h, -h)",
    "h = h * ((x > 0) ^ (i < 2)).to(h.dtype)",
    "h = (h.double() * 1.5).to(h.dtype)",
    "h = h.clone()\n    h.t().add_(1)\n    h = h.reshape(-1).reshape(h.shape)",
    "h = h.t().contiguous().t() * 2",
    "h = (h @ x.t()) @ x * 0.1",
    "h = torch.relu(h) - torch.sigmoid(h)",
]
"""Steps on the running value ``h`` (inputs are only read, except where a step clones first)."""

MUTATIONS = [
    "y.add_(h * 0.5)",
    "y.mul_(2)",
    "y[0].fill_({s})",
    "y.clamp_(min={c})",
]
"""In-place updates of the input ``y``: later reads of ``x`` must see them when ``y`` is a view of ``x``."""

READS_AFTER = [
    "h = h + x",
    "h = h + y",
    "h = h + v",
    "h = h * x.sum()",
]
"""Reads after an update: ``v`` is a view of ``y`` taken before the update."""

OUTPUTS = [
    "h",
    "h, h",
    "h, h.reshape(-1)",
    "h, x[0]",
    "h, x.t()",
    "h, y",
    "h, y[1:]",
    "h, torch.zeros(2, 3, device=x.device, dtype=x.dtype)",
    "torch.full((3,), {s}, device=x.device), h",
    "h, torch.ones_like(x)",
    "h.to('spyre'), x.cpu() * 2",
    "h.cpu(), torch.arange({rows}, device='spyre') + 1",
    "h, x[torch.arange(x.shape[0], device=x.device) % 2 == 0]",
    "h, (i & 5) | 2",
    "h, (x > 0) & (i > 1)",
    "(h * 2).to(torch.float64), i + 1",
]
"""What the program returns: views of inputs, constants (the caller writes to them), duplicates, moved values."""


@dataclass(frozen=True)
class Case:
    index: int
    source: str
    rows: int
    cols: int
    aliased: bool          # y is a view of x's memory (overlapping rows)

    def function(self):
        scope: dict = {"torch": torch}
        exec(compile(self.source, f"<program {self.index}>", "exec"), scope)      # our own generated source
        return scope["program"]

    def inputs(self, device: str) -> list[torch.Tensor]:
        g = torch.Generator().manual_seed(self.index)
        rows, cols = self.rows, self.cols
        base = torch.randn(rows + 1, cols, generator=g).half().to(device)
        x = base[:rows]
        y = base[1:] if self.aliased else torch.randn(rows, cols, generator=g).half().to(device)
        i = torch.randint(0, 5, (rows, cols), generator=g, dtype=torch.int32).to(device)
        return [x, y, i]


def _fill(template: str, rng: random.Random, rows: int, cols: int) -> str:
    return template.format(c=round(rng.uniform(-1, 1), 2), s=rng.choice([0.0, 0.5, -2.0, 1.25]),
                           cols=cols + rng.randint(0, 2), rows=rows + rng.randint(0, 1))


def make_case(index: int) -> Case:
    rng = random.Random(index)
    rows, cols = rng.randint(*ROWS), rng.randint(*COLS)
    if rng.random() < 0.3:
        rows = cols                                # square: the matmul step keeps its shape
    lines = ["h = x * 1", _fill(VALUE_STEPS[index % len(VALUE_STEPS)], rng, rows, cols)]   # each step in turn
    for _ in range(rng.randint(0, 3)):
        lines.append(_fill(rng.choice(VALUE_STEPS), rng, rows, cols))
    if rng.random() < 0.6:
        lines.append("v = y[1]")
        lines.append(_fill(rng.choice(MUTATIONS), rng, rows, cols))
        lines.append(rng.choice(READS_AFTER))
    body = "\n    ".join(line for step in lines for line in step.split("\n    "))
    out = _fill(OUTPUTS[index % len(OUTPUTS)], rng, rows, cols)                                 # each output in turn
    source = f"def program(x, y, i):\n    {body}\n    return {out}\n"
    return Case(index, source, rows, cols, aliased=index % 3 == 0)


def device_for(index: int) -> str:
    """The device a generated program runs on: alternating, shifted every len(OUTPUTS) programs so an output
    template met twice meets both devices."""
    return ("cpu", "spyre")[(index + index // len(OUTPUTS)) % 2]
