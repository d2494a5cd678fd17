"""Matmul kernels as KTIR: ``C[m,n] = A[m,k] @ B[k,n]`` per core slice, ``linalg.matmul`` on tiles.

Each core walks its M x N slice in output tiles and its K slice in steps, accumulating in fp32 through
``scf.for`` ``iter_args``.
"""

from __future__ import annotations

import torch

from spyre_lab.compiler.ir import MatMul
from spyre_lab.compiler.ktir_base import KernelWriter, ident
from spyre_lab.compiler.ktir_errors import KTIRUnsupported
from spyre_lab.compiler.ktir_writer import type_text


class MatmulWriter(KernelWriter):
    """``C[m,n] = A[m,k] @ B[k,n]`` per core slice of M and N, tiles walked with an accumulator over K."""

    def body(self) -> None:
        spec, w = self.spec, self.w
        if len(self.nodes) != 1 or not isinstance(self.nodes[0], MatMul):
            raise KTIRUnsupported("export", 0, f"kernel {spec.name} ({spec.rule}): a matmul with fused epilogue "
                                               "ops is not written out yet")
        node = self.nodes[0]
        if spec.dims.get("B", 1) != 1 or spec.division.splits.get("K", 1) > 1:
            raise KTIRUnsupported("export", 0, f"kernel {spec.name}: batched matmuls and K split across cores "
                                               "(partial sums over the ring) are not written out yet")
        a, b = node.inputs
        c = node.output
        for buf, axes in ((a, ("M", "K")), (b, ("K", "N")), (c, ("M", "N"))):
            if tuple(spec.operands[buf].axes) != axes:
                raise KTIRUnsupported("export", 0, f"kernel {spec.name}: {buf} has axes "
                                                   f"{spec.operands[buf].axes}, expected {axes}")
        dims = ("M", "N", "K")
        starts = self.slice_starts(dims)
        tm, tn = self.tile_size("M"), self.tile_size("N")
        tk = max(1, min(spec.tiles.get("K", spec.dims["K"]), spec.dims["K"]))
        dt = spec.buffers[c].dtype
        views = {x: self.make_view(x, spec.buffers[x].dtype, ("B", "M", "K", "N")) for x in (a, b, c)}
        shape = {x: self.view_of(x, ("B", "M", "K", "N"))[0] for x in (a, b, c)}
        mi, ni = w.fresh("m_i"), w.fresh("n_i")
        m_end, n_end = w.fresh("m_end"), w.fresh("n_end")
        w.line(f"{m_end} = arith.addi {starts['M']}, {w.index(self.chunk['M'])} : index")
        w.line(f"{n_end} = arith.addi {starts['N']}, {w.index(self.chunk['N'])} : index")
        zero, acc0 = w.fresh("zero"), w.fresh("acc0")
        w.line(f"{zero} = arith.constant 0.0 : f32")
        k0, k_end = w.index(0), w.index(spec.dims["K"])
        w.line(f"scf.for {mi} = {starts['M']} to {m_end} step {w.index(tm)} {{")
        w.depth += 1
        w.line(f"scf.for {ni} = {starts['N']} to {n_end} step {w.index(tn)} {{")
        w.depth += 1
        acc_t = type_text((tm, tn), torch.float32)
        w.line(f"{acc0} = tensor.splat {zero} : {acc_t}")
        ki, acc, out = w.fresh("k_i"), w.fresh("acc"), w.fresh("acc_out")
        w.line(f"{out} = scf.for {ki} = {k0} to {k_end} step {w.index(tk)} iter_args({acc} = {acc0}) -> ({acc_t}) {{")
        w.depth += 1
        ta = w.access(views[a], shape[a], spec.buffers[a].dtype, [mi, ki], [tm, tk], ident(a))
        tb = w.access(views[b], shape[b], spec.buffers[b].dtype, [ki, ni], [tk, tn], ident(b))
        va, vb, mm = w.fresh(ident(a)), w.fresh(ident(b)), w.fresh("partial")
        w.line(f"{va} = ktdp.load {ta} : {w.tile_type([tm, tk])} -> {type_text((tm, tk), spec.buffers[a].dtype)}")
        w.line(f"{vb} = ktdp.load {tb} : {w.tile_type([tk, tn])} -> {type_text((tk, tn), spec.buffers[b].dtype)}")
        w.line(f"{mm} = linalg.matmul ins({va}, {vb} : {type_text((tm, tk), spec.buffers[a].dtype)}, "
               f"{type_text((tk, tn), spec.buffers[b].dtype)}) outs({acc} : {acc_t}) -> {acc_t}")
        w.line(f"scf.yield {mm} : {acc_t}")
        w.depth -= 1
        w.line("}")
        res = w.fresh(ident(c))
        w.line(f"{res} = arith.truncf {out} : {acc_t} to {type_text((tm, tn), dt)}")
        tc = w.access(views[c], shape[c], dt, [mi, ni], [tm, tn], ident(c))
        w.line(f"ktdp.store {res}, {tc} : {type_text((tm, tn), dt)}, {w.tile_type([tm, tn])}")
        for _ in range(2):
            w.line("scf.yield")
            w.depth -= 1
            w.line("}")
