"""Matmul kernels as KTIR: ``C[b,m,n] = A[b,m,k] @ B[b,k,n]`` per core slice, ``linalg.matmul`` on tiles.

Each core walks its B x M x N slice in output tiles (batch, then M, then N, as the compiler's cores do)
and its K slice in steps, accumulating in fp32 through ``scf.for`` ``iter_args``. When K is split across
cores, the partners of one output tile form one reduce group: each offers its fp32 partial with
``ktdp.inter_tile_produce`` and the partner holding K's first slice folds them with
``ktdp.inter_tile_reduce`` (the ring chain the compiler's split-K plans run), then alone rounds and
stores under ``scf.if``. A weight without a batch dim is read by every batch.
"""

from __future__ import annotations

import torch

from spyre_lab.compiler.ir import MatMul
from spyre_lab.compiler.ktir_base import KernelWriter, ident
from spyre_lab.compiler.ktir_epilogue import write_epilogue
from spyre_lab.compiler.ktir_errors import KTIRUnsupported
from spyre_lab.compiler.ktir_layout import loop_end
from spyre_lab.compiler.ktir_probe import buffer_types
from spyre_lab.compiler.ktir_writer import type_text

ORDER = ("B", "M", "K", "N")
TILE_AXES = {"A": ("M", "K"), "B": ("K", "N"), "C": ("M", "N")}


class MatmulWriter(KernelWriter):
    """One matmul node, its operands read through memory views (a transposed weight is its strides)."""

    order: tuple[str, ...] = ORDER

    def body(self) -> None:
        spec, w = self.spec, self.w
        matmuls = [n for n in self.nodes if isinstance(n, MatMul)]
        if len(matmuls) != 1 or self.nodes[0] is not matmuls[0]:
            raise KTIRUnsupported("export", 0, f"kernel {spec.name} ({spec.rule}): {len(matmuls)} matmuls in one "
                                               "kernel, not a matmul and its epilogue")
        node = self.nodes[0]
        a, b = node.inputs
        c = node.output
        roles = {a: "A", b: "B", c: "C"}
        self.axes = {x: self.view_of(x, ORDER)[3] for x in roles}
        for x, role in roles.items():
            if tuple(ax for ax in self.axes[x] if ax != "B") != TILE_AXES[role]:
                raise KTIRUnsupported("export", 0, f"kernel {spec.name}: {x} runs along {self.axes[x]}, expected "
                                                   f"{TILE_AXES[role]} (with an optional batch dim)")
        dims = ("B", "M", "N", "K")
        starts = self.slice_starts(dims)
        tile = {"B": 1, **{d: self.tile_size(d, ragged=True) for d in ("M", "N", "K")}}
        types = buffer_types(spec, self.nodes, self.inputs)[0]
        dtype = {x: types[x] for x in roles}
        views = {x: self.make_view(x, spec.buffers[x].dtype, ORDER) for x in self.spec.address_slots}
        tm, tn, tk = tile["M"], tile["N"], tile["K"]
        one_step = self.chunk["K"] <= tk     # A is loaded once per M tile and stays while N tiles pass
        at: dict[str, str] = {"K": starts["K"]}
        for d in ("B", "M", "N"):
            at[d] = self._loop(d, starts[d], tile[d]) if self.chunk[d] > tile[d] or d != "B" else starts[d]
            if d == "M" and one_step:
                va = self._load(a, views[a], at, tile, dtype[a])
        acc_t = type_text((tm, tn), torch.float32)
        acc = out = acc0 = self._zeros(acc_t)
        if not one_step:
            acc, out = w.fresh("acc"), w.fresh("acc_out")
            self._k_loop([out], [acc], acc0, acc_t, starts["K"], tk, at)
            va = self._load(a, views[a], at, tile, dtype[a])
        vb = self._load(b, views[b], at, tile, dtype[b])
        mm = w.fresh("partial")
        w.line(f"{mm} = linalg.matmul ins({va}, {vb} : {type_text((tm, tk), dtype[a])}, "
               f"{type_text((tk, tn), dtype[b])}) outs({acc} : {acc_t}) -> {acc_t}")
        if one_step:
            out = mm
        else:
            w.line(f"scf.yield {mm} : {acc_t}")
            self._close()
        if "K" in self.maps:
            out = self._reduce_partners(out, acc_t)
            first = w.fresh("k_first")
            w.line(f"{first} = arith.cmpi eq, {starts['K']}, {w.index(0)} : index")
            w.line(f"scf.if {first} {{")
            w.depth += 1
        rounded = self._round(out, tile, dtype[c])
        if c in self.outputs:
            self._store(c, rounded, views[c], at, tile, dtype[c])
        if len(self.nodes) > 1:
            write_epilogue(self, self.nodes[1:], {c: rounded}, views, at, tile)
        if "K" in self.maps:
            self._close(yields=False)
        for _ in ("B", "M", "N"):
            if w.depth > 2:
                self._close()

    def _zeros(self, acc_t: str, hint: str = "acc0") -> str:
        """A fresh fp32 accumulator tile of zeros."""
        zero, acc0 = self.w.fresh("zero"), self.w.fresh(hint)
        self.w.line(f"{zero} = arith.constant 0.0 : f32")
        self.w.line(f"{acc0} = tensor.splat {zero} : {acc_t}")
        return acc0

    def _k_loop(self, results: list[str], accs: list[str], init: str, acc_t: str, start: str, step: int,
                at: dict[str, str]) -> None:
        """Open the walk over this core's K slice, carrying one fp32 accumulator per name in ``accs``."""
        w = self.w
        ki, k_end = w.fresh("k_i"), w.fresh("k_end")
        self.slice_end(k_end, "K", start)
        carried = ", ".join(f"{a} = {init}" for a in accs)
        w.line(f"{', '.join(results)} = scf.for {ki} = {start} to {k_end} step {w.index(step)} iter_args({carried}) "
               f"-> ({', '.join([acc_t] * len(accs))}) {{")
        w.depth += 1
        at["K"] = ki

    def _loop(self, d: str, start: str, step: int) -> str:
        w = self.w
        iv, hi = w.fresh(f"{d.lower()}_i"), w.fresh(f"{d.lower()}_end")
        self.slice_end(hi, d, start)
        w.line(f"scf.for {iv} = {start} to {hi} step {w.index(step)} {{")
        w.depth += 1
        return iv

    def _close(self, yields: bool = True) -> None:
        """Close a loop (``yields``: its buffer phases follow the brace) or, without ``yields``, an scf.if."""
        if yields and not self.w.lines[-1].strip().startswith("scf.yield"):
            self.w.line("scf.yield")
        self.w.depth -= 1
        self.w.line(loop_end(self.spec) if yields else "}")

    def _tile(self, x: str, view: str, at: dict[str, str], tile: dict[str, int], dtype: torch.dtype
              ) -> tuple[str, list[int]]:
        axes = self.axes[x]
        shape = self.view_of(x, self.order)[0]
        sizes = [tile[ax] for ax in axes]
        return self.w.access(view, shape, dtype, [at[ax] for ax in axes], sizes, ident(x)), sizes

    def _load(self, x: str, view: str, at: dict[str, str], tile: dict[str, int], dtype: torch.dtype) -> str:
        """``x``'s tile as the 2-D tensor linalg.matmul takes (a batch dim of 1 folded away)."""
        acc, sizes = self._tile(x, view, at, tile, dtype)
        return self.w.load(acc, sizes, dtype, ident(x))

    def _round(self, value: str, tile: dict[str, int], dtype: torch.dtype) -> str:
        """The fp32 accumulator tile rounded to the output's dtype."""
        res = self.w.fresh("c_tile")
        two = (tile["M"], tile["N"])
        self.w.line(f"{res} = arith.truncf {value} : {type_text(two, torch.float32)} to {type_text(two, dtype)}")
        return res

    def _store(self, x: str, res: str, view: str, at: dict[str, str], tile: dict[str, int],
               dtype: torch.dtype) -> None:
        w = self.w
        acc, sizes = self._tile(x, view, at, tile, dtype)
        two = (tile["M"], tile["N"])
        if len(sizes) == 3:
            nd = w.fresh(f"{ident(x)}_3d")
            w.line(f"{nd} = tensor.expand_shape {res} [[0, 1], [2]] output_shape {sizes} : "
                   f"{type_text(two, dtype)} into {type_text(sizes, dtype)}")
            res = nd
        w.line(f"ktdp.store {res}, {acc} : {type_text(sizes, dtype)}, {w.tile_type(sizes)}")
