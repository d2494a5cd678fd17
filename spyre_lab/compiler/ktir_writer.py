"""A small text builder for KTIR: fresh SSA names, indentation, and the three-step access spelled out."""

from __future__ import annotations

from collections.abc import Sequence

import torch

NAMES: dict[torch.dtype, str] = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32",
                                 torch.float64: "f64", torch.bool: "i1", torch.int8: "i8", torch.int16: "i16",
                                 torch.int32: "i32", torch.int64: "i64"}


def type_text(shape: Sequence[int], dtype: torch.dtype, head: str = "tensor") -> str:
    """``tensor<4x64xf16>`` (``memref<...>`` with ``head="memref"``)."""
    return f"{head}<{''.join(f'{d}x' for d in shape)}{NAMES[dtype]}>"


def box_set(shape: Sequence[int]) -> str:
    """``affine_set<(d0, d1) : (d0 >= 0, -d0 + 7 >= 0, ...)>``: the box [0, n) on every dim."""
    dims = [f"d{i}" for i in range(len(shape))]
    cons = ", ".join(f"{d} >= 0, -{d} + {n - 1} >= 0" for d, n in zip(dims, shape))
    return f"affine_set<({', '.join(dims)}) : ({cons})>"


def identity_map(rank: int) -> str:
    dims = ", ".join(f"d{i}" for i in range(rank))
    return f"affine_map<({dims}) -> ({dims})>"


class Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.depth = 2
        self.used: dict[str, int] = {}
        self.taken: set[str] = set()
        self.consts: dict[int, str] = {}

    def fresh(self, hint: str) -> str:
        """A name never given before: ``%x``, then ``%x_1``, ... skipping any a hint like ``x_1`` already took."""
        base = "".join(c if c.isalnum() or c == "_" else "_" for c in hint) or "v"
        while True:
            n = self.used.get(base, 0)
            self.used[base] = n + 1
            name = f"%{base}" if n == 0 else f"%{base}_{n}"
            if name not in self.taken:
                self.taken.add(name)
                return name

    def line(self, text: str) -> None:
        self.lines.append("  " * self.depth + text)

    def index(self, value: int) -> str:
        if value not in self.consts:
            name = self.fresh(f"c{value}")
            self.line(f"{name} = arith.constant {value} : index")
            self.consts[value] = name
        return self.consts[value]

    def memory_view(self, ptr: str, shape: Sequence[int], dtype: torch.dtype, hint: str,
                    strides: Sequence[int] = (), offset: int = 0, sizes: Sequence[int | str] = ()) -> str:
        """A view of ``shape`` over the buffer at ``ptr`` (+ ``offset`` elements); row-major unless ``strides``.

        ``sizes`` may name index values in place of some of ``shape``'s sizes: a view that ends where this core's
        slice ends, so the last tile of an uneven slice is clipped there."""
        if not strides:
            acc, rev = 1, []
            for n in reversed(shape):
                rev.append(acc)
                acc *= n
            strides = rev[::-1]
        strides = list(strides)
        if offset:
            base = self.fresh(f"{hint}_base")
            self.line(f"{base} = arith.addi {ptr}, {self.index(offset)} : index")
            ptr = base
        name = self.fresh(f"{hint}_view")
        size_text = ", ".join(str(n) for n in (sizes or shape))
        self.line(f"{name} = ktdp.construct_memory_view {ptr}, sizes: [{size_text}], strides: {strides} {{")
        self.line(f"  coordinate_set = {box_set(shape)}, memory_space = #ktdp.memory_space<global>")
        self.line(f"}} : {type_text(tuple(shape), dtype, 'memref')}")
        return name

    def access(self, view: str, view_shape: Sequence[int], dtype: torch.dtype, at: Sequence[str],
               tile: Sequence[int], hint: str) -> str:
        name = self.fresh(f"{hint}_tile")
        self.line(f"{name} = ktdp.construct_access_tile {view}[{', '.join(at)}] {{")
        self.line(f"  access_tile_set = {box_set(tile)},")
        self.line(f"  access_tile_order = {identity_map(len(tile))}")
        self.line(f"}} : {type_text(tuple(view_shape), dtype, 'memref')} -> "
                  f"!ktdp.access_tile<{'x'.join(str(t) for t in tile)}xindex>")
        return name

    def tile_type(self, tile: Sequence[int]) -> str:
        return f"!ktdp.access_tile<{'x'.join(str(t) for t in tile)}xindex>"

    def load(self, access: str, sizes: Sequence[int], dtype: torch.dtype, hint: str) -> str:
        """``ktdp.load`` of one access tile; a 3-D tile (a batch of one in front) is collapsed to the 2-D tensor
        ``linalg.matmul`` and the row ops take."""
        name = self.fresh(hint)
        self.line(f"{name} = ktdp.load {access} : {self.tile_type(sizes)} -> {type_text(sizes, dtype)}")
        if len(sizes) != 3:
            return name
        flat = self.fresh(f"{hint}_2d")
        self.line(f"{flat} = tensor.collapse_shape {name} [[0, 1], [2]] : {type_text(sizes, dtype)} into "
                  f"{type_text(sizes[1:], dtype)}")
        return flat
