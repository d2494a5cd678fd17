"""Fused attention as KTIR: ``softmax(Q K^T + mask) V`` with the online softmax the compiler's kernel runs.

Each core owns some heads and a range of query rows. The heads follow the tile id affinely; the row
ranges do not (under a causal mask the compiler balances them by unmasked keys, so early ranges are
longer), so the text holds the cuts as an index table (``arith.constant dense<[...]>``) and each core
reads its two entries with ``tensor.extract``. The query and output memory views end at the core's last
row, so a query tile that runs past it is clipped (read as 0, not written), as the compiler's shorter
last tile is.

Per query tile an ``scf.for`` walks the key tiles carrying the fp32 output accumulator, the running row
max and the running row sum as ``iter_args``; per key tile: ``S = Q K^T`` (``linalg.matmul``), the causal
mask by index arithmetic (key ``c`` is masked for query ``r`` when ``c > r + d``: an ``arith.cmpf`` of a
column index row against a row index column, then ``arith.select`` of -inf), the new max
(``linalg.reduce`` with the old max as its init), ``p = exp(S - max)``, the old sum and accumulator
rescaled by ``exp(old max - new max)`` and ``O += p V``. The key loop ends at the last key tile any row
of the query tile sees (the compiler skips the blocks a causal mask kills) and a key tile every row sees
whole takes no mask (``scf.if``), as the compiler's "plain" blocks. A row masked everywhere gives 0 when
the pattern asks for that (SDPA's masked-row ``where``).
"""

from __future__ import annotations

import torch

from spyre_lab.compiler.constant_facts import causal_offset
from spyre_lab.compiler.ktir_base import KernelWriter, float_text, ident
from spyre_lab.compiler.ktir_errors import KTIRUnsupported
from spyre_lab.compiler.ktir_layout import loop_end
from spyre_lab.compiler.ktir_writer import box_set, type_text
from spyre_lab.compiler.tiling_attention import Attention

ORDER = ("B", "M", "K", "N", "E")
F32 = torch.float32
NEG_INF = "0xFF800000"      # -inf as f32 bits


class AttentionWriter(KernelWriter):
    """One Attention node: Q [B,M,K], K^T [B,K,N], V [B,N,E] (and its mask) -> O [B,M,E]."""

    def body(self) -> None:
        node = self.nodes[0]
        if len(self.nodes) != 1 or not isinstance(node, Attention):
            raise KTIRUnsupported("export", 0, f"kernel {self.spec.name}: an attention kernel is one Attention node")
        self.node, self.causal = node, self._mask_form(node)
        q, kt, v = node.inputs[:3]
        self.roles = {"Q": q, "Kt": kt, "V": v, "O": node.output}
        d = node.dims
        self.tq, tk = self.spec.tiles["M"], self.spec.tiles["N"]
        if d["N"] > tk and d["N"] % tk:
            raise KTIRUnsupported("export", 0, f"kernel {self.spec.name}: a last key tile shorter than {tk} (N = "
                                               f"{d['N']}) is not written yet; missing keys would enter the softmax")
        self.tk = min(tk, d["N"])
        h_start, h_end, m_lo, m_hi = self._division()
        self.views = {r: self._view(b, m_hi if r in ("Q", "O") else None) for r, b in self.roles.items()}
        w = self.w
        h = w.fresh("h")
        w.line(f"scf.for {h} = {h_start} to {h_end} step {w.index(1)} {{")
        w.depth += 1
        m0 = w.fresh("m0")
        w.line(f"scf.for {m0} = {m_lo} to {m_hi} step {w.index(self.tq)} {{")
        w.depth += 1
        self._query_tile(h, m0, m_hi)
        for _ in range(2):      # one Q tile in LX: the next one loads once this one is stored
            w.line("scf.yield")
            w.depth -= 1
            w.line(loop_end(self.spec, phases=1))

    def _mask_form(self, node: Attention) -> int | None:
        """The causal offset ``d`` of the one constant mask, or None without a mask; anything else is refused."""
        if not node.extras and not node.score_ops:
            return None
        consts = list(node.const_extras.values())
        offset = causal_offset(consts[0]) if len(consts) == 1 else None
        if node.score_ops == ("add",) and len(node.extras) == 1 and len(consts) == 1 and offset is not None:
            return offset
        raise KTIRUnsupported("export", 0, f"kernel {self.spec.name}: score ops {node.score_ops} on "
                                           f"{len(node.extras)} extra input(s) ({len(consts)} constant); only no "
                                           "mask or one constant causal mask added to the scores is written yet")

    def _division(self) -> tuple[str, str, str, str]:
        """Heads from the tile id (affine); the core's query rows from an index table of the row cuts."""
        spec, w, d = self.spec, self.w, self.node.dims
        sb, sm = spec.division.splits.get("B", 1), spec.division.splits.get("M", 1)
        per_head = -(-d["B"] // sb)
        lows = sorted({spec.slices[c]["M"][0] for c in self.busy})
        cuts = [*lows, d["M"]]
        for c in self.busy:
            h0 = c // sm * per_head
            want = {"B": (h0, min(d["B"], h0 + per_head)), "M": (cuts[c % sm], cuts[c % sm + 1])}
            if len(lows) != sm or any(spec.slices[c][k] != want[k] for k in want):
                raise KTIRUnsupported("export", 0, f"kernel {spec.name}: core {c}'s slice {spec.slices[c]} is not "
                                                   "head group (tile id floordiv M splits) x row range (tile id mod "
                                                   "M splits)")
        tid = w.fresh("tile_id")
        w.line(f"{tid} = ktdp.get_compute_tile_id : index")
        h_start, h_end, mi, mi1 = w.fresh("h_start"), w.fresh("h_end"), w.fresh("row_part"), w.fresh("row_part_next")
        w.line(f"{h_start} = affine.apply affine_map<(t) -> ((t floordiv {sm}) * {per_head})>({tid})")
        w.line(f"{h_end} = affine.min affine_map<(s) -> (s + {per_head}, {d['B']})>({h_start})")
        w.line(f"{mi} = affine.apply affine_map<(t) -> (t mod {sm})>({tid})")
        w.line(f"{mi1} = arith.addi {mi}, {w.index(1)} : index")
        table, m_lo, m_hi = w.fresh("row_cuts"), w.fresh("m_lo"), w.fresh("m_hi")
        w.line("// query rows per core: balanced by the keys each row sees, so a table, not an affine map")
        w.line(f"{table} = arith.constant dense<{cuts}> : tensor<{len(cuts)}xindex>")
        w.line(f"{m_lo} = tensor.extract {table}[{mi}] : tensor<{len(cuts)}xindex>")
        w.line(f"{m_hi} = tensor.extract {table}[{mi1}] : tensor<{len(cuts)}xindex>")
        return h_start, h_end, m_lo, m_hi

    def _view(self, b: str, m_end: str | None) -> str:
        """``b``'s memory view in kernel dim order; with ``m_end`` the M size stops at this core's last row."""
        shape, strides, offset, axes = self.view_of(b, ORDER)
        self.axes = getattr(self, "axes", {})
        self.axes[b] = axes
        w, ptr = self.w, self.ptr[b]
        if offset:
            base = w.fresh(f"{ident(b)}_base")
            w.line(f"{base} = arith.addi {ptr}, {w.index(offset)} : index")
            ptr = base
        sizes = [m_end if a == "M" and m_end else str(n) for a, n in zip(axes, shape)]
        name = w.fresh(f"{ident(b)}_view")
        w.line(f"{name} = ktdp.construct_memory_view {ptr}, sizes: [{', '.join(sizes)}], strides: {list(strides)} {{")
        w.line(f"  coordinate_set = {box_set(shape)}, memory_space = #ktdp.memory_space<global>")
        w.line(f"}} : {type_text(shape, self.spec.buffers[b].dtype, 'memref')}")
        return name

    def _tile(self, role: str, at: dict[str, str]) -> tuple[str, list[int]]:
        b = self.roles[role]
        axes = self.axes[b]
        size = {"B": 1, "M": self.tq, "N": self.tk, "K": self.node.dims["K"], "E": self.node.dims["E"]}
        sizes = [size[a] for a in axes]
        shape = self.view_of(b, ORDER)[0]
        starts = [at.get(a, self.w.index(0)) for a in axes]
        return self.w.access(self.views[role], shape, self.spec.buffers[b].dtype, starts, sizes, ident(b)), sizes

    def _load(self, role: str, at: dict[str, str]) -> str:
        b = self.roles[role]
        acc, sizes = self._tile(role, at)
        return self.w.load(acc, sizes, self.spec.buffers[b].dtype, ident(b))

    def _splat(self, value: str, shape: tuple[int, ...], hint: str) -> str:
        w = self.w
        c, t = w.fresh(f"{hint}_s"), w.fresh(hint)
        w.line(f"{c} = arith.constant {value} : f32")
        w.line(f"{t} = tensor.splat {c} : {type_text(shape, F32)}")
        return t

    def _bcast(self, x: str, n: int, out: tuple[int, ...], dim: int) -> str:
        """A vector of ``n`` as the 2-D ``out``, repeated along ``dim`` (free: the SFU reads it in place)."""
        w = self.w
        init, name = w.fresh("bcast_init"), w.fresh(f"{x[1:]}_b")
        w.line(f"{init} = tensor.empty() : {type_text(out, F32)}")
        w.line(f"{name} = linalg.broadcast ins({x} : {type_text((n,), F32)}) outs({init} : {type_text(out, F32)}) "
               f"dimensions = [{dim}]")
        return name

    def _query_tile(self, h: str, m0: str, m_hi: str) -> None:
        w, d, tq, tk = self.w, self.node.dims, self.tq, self.tk
        at = {"B": h, "M": m0}
        q = self._load("Q", at)
        st, acc_t, vec_t = (tq, tk), type_text((tq, d["E"]), F32), type_text((tq,), F32)
        if self.causal is None:
            n_end = w.index(d["N"])
        else:      # the last key any row of the tile sees is min(m0 + tq, m_hi) - 1 + d
            n_end = w.fresh("n_end")
            w.line(f"{n_end} = affine.min affine_map<(a, b) -> (a + {tq + self.causal}, b + {self.causal}, "
                   f"{d['N']})>({m0}, {m_hi})")
        acc0 = self._splat("0.0", (tq, d["E"]), "acc0")
        max0, sum0 = self._splat(NEG_INF, (tq,), "max0"), self._splat("0.0", (tq,), "sum0")
        self.s_zero, self.vec_zero = self._splat("0.0", st, "s_zero"), self._splat("0.0", (tq,), "vec_zero")
        if self.causal is not None:
            self.rows = self._iota(tq, "row_index")
            self.cols = self._bcast(self._iota(tk, "col_index"), tk, st, 0)
            self.ninf = self._splat(NEG_INF, st, "neg_inf")
        n0, acc, run_max, run_sum = w.fresh("n0"), w.fresh("acc"), w.fresh("run_max"), w.fresh("run_sum")
        out, mx, sm = w.fresh("acc_out"), w.fresh("max_out"), w.fresh("sum_out")
        w.line(f"{out}, {mx}, {sm} = scf.for {n0} = {w.index(0)} to {n_end} step {w.index(tk)} iter_args({acc} = "
               f"{acc0}, {run_max} = {max0}, {run_sum} = {sum0}) -> ({acc_t}, {vec_t}, {vec_t}) {{")
        w.depth += 1
        self._key_tile({**at, "N": n0}, q, acc, run_max, run_sum, m0)
        w.depth -= 1
        w.line(loop_end(self.spec))     # K and V tiles cycle through the plan's slots
        self._finish(out, sm, at)

    def _iota(self, n: int, hint: str) -> str:
        name = self.w.fresh(hint)
        self.w.line(f"{name} = arith.constant dense<{[float(i) for i in range(n)]}> : {type_text((n,), F32)}")
        return name

    def _key_tile(self, at: dict[str, str], q: str, acc: str, run_max: str, run_sum: str, m0: str) -> None:
        w, d, tq, tk = self.w, self.node.dims, self.tq, self.tk
        st, e = (tq, tk), d["E"]
        kt, v = self._load("Kt", at), self._load("V", at)
        qd, kd, vd = (self.spec.buffers[self.roles[r]].dtype for r in ("Q", "Kt", "V"))
        s = w.fresh("s")
        w.line(f"{s} = linalg.matmul ins({q}, {kt} : {type_text((tq, d['K']), qd)}, {type_text((d['K'], tk), kd)}) "
               f"outs({self.s_zero} : {type_text(st, F32)}) -> {type_text(st, F32)}")
        if self.causal is not None:
            s = self._causal_mask(s, at["N"], m0)
        new_max, safe_c, safe = w.fresh("new_max"), w.fresh("row_masked"), w.fresh("shift")
        w.line(f"{new_max} = linalg.reduce {{ arith.maximumf }} ins({s} : {type_text(st, F32)}) outs({run_max} : "
               f"{type_text((tq,), F32)}) dimensions = [1]")
        ninf_v = self._splat(NEG_INF, (tq,), "neg_inf_row")
        w.line(f"{safe_c} = arith.cmpf oeq, {new_max}, {ninf_v} : {type_text((tq,), F32)}")
        w.line(f"{safe} = arith.select {safe_c}, {self.vec_zero}, {new_max} : {type_text((tq,), torch.bool)}, "
               f"{type_text((tq,), F32)}")
        shifted, p = w.fresh("s_shifted"), w.fresh("p")
        w.line(f"{shifted} = arith.subf {s}, {self._bcast(safe, tq, st, 1)} : {type_text(st, F32)}")
        w.line(f"{p} = math.exp {shifted} : {type_text(st, F32)}")
        diff, scale, kept, new_sum = w.fresh("max_step"), w.fresh("rescale"), w.fresh("sum_kept"), w.fresh("new_sum")
        w.line(f"{diff} = arith.subf {run_max}, {safe} : {type_text((tq,), F32)}")
        w.line(f"{scale} = math.exp {diff} : {type_text((tq,), F32)}")
        w.line(f"{kept} = arith.mulf {run_sum}, {scale} : {type_text((tq,), F32)}")
        w.line(f"{new_sum} = linalg.reduce {{ arith.addf }} ins({p} : {type_text(st, F32)}) outs({kept} : "
               f"{type_text((tq,), F32)}) dimensions = [1]")
        later, acc_s = w.fresh("later_tile"), w.fresh("acc_kept")
        w.line(f"{later} = arith.cmpi sgt, {at['N']}, {w.index(0)} : index")
        w.line(f"{acc_s} = scf.if {later} -> ({type_text((tq, e), F32)}) {{")   # the first tile's acc is 0
        w.depth += 1
        scaled = w.fresh("acc_scaled")
        w.line(f"{scaled} = arith.mulf {acc}, {self._bcast(scale, tq, (tq, e), 1)} : {type_text((tq, e), F32)}")
        w.line(f"scf.yield {scaled} : {type_text((tq, e), F32)}")
        w.depth -= 1
        w.line("} else {")
        w.line(f"  scf.yield {acc} : {type_text((tq, e), F32)}")
        w.line("}")
        if vd != F32:
            ph = w.fresh("p_in")
            w.line(f"{ph} = arith.truncf {p} : {type_text(st, F32)} to {type_text(st, vd)}")
            p = ph
        acc_n = w.fresh("acc_next")
        w.line(f"{acc_n} = linalg.matmul ins({p}, {v} : {type_text(st, vd)}, {type_text((tk, e), vd)}) "
               f"outs({acc_s} : {type_text((tq, e), F32)}) -> {type_text((tq, e), F32)}")
        w.line(f"scf.yield {acc_n}, {new_max}, {new_sum} : {type_text((tq, e), F32)}, {type_text((tq,), F32)}, "
               f"{type_text((tq,), F32)}")

    def _causal_mask(self, s: str, n0: str, m0: str) -> str:
        """-inf where key ``n0 + j`` > query ``m0 + i`` + d, skipped when every row sees the whole key tile."""
        w, tq, tk, dd = self.w, self.tq, self.tk, self.causal
        st = type_text((tq, tk), F32)
        last, plain, out = w.fresh("n_last"), w.fresh("all_visible"), w.fresh("s_masked")
        w.line(f"{last} = affine.min affine_map<(n) -> (n + {tk - 1 - dd}, {self.node.dims['N'] - 1 - dd})>({n0})")
        w.line(f"{plain} = arith.cmpi sle, {last}, {m0} : index")
        w.line(f"{out} = scf.if {plain} -> ({st}) {{")
        w.line(f"  scf.yield {s} : {st}")
        w.line("} else {")
        w.depth += 1
        shift, shift_i, shift_f, thr, masked, sel = (w.fresh(x) for x in ("row_shift", "row_shift_i", "row_shift_f",
                                                                            "row_limit", "key_masked", "s_sel"))
        w.line(f"{shift} = affine.apply affine_map<(m, n) -> (m - n + {dd})>({m0}, {n0})")
        w.line(f"{shift_i} = arith.index_cast {shift} : index to i64")
        w.line(f"{shift_f} = arith.sitofp {shift_i} : i64 to f32")
        w.line(f"{thr} = arith.addf {self.rows}, {shift_f} : {type_text((tq,), F32)}")
        w.line(f"{masked} = arith.cmpf ogt, {self.cols}, {self._bcast(thr, tq, (tq, tk), 1)} : {st}")
        w.line(f"{sel} = arith.select {masked}, {self.ninf}, {s} : {type_text((tq, tk), torch.bool)}, {st}")
        w.line(f"scf.yield {sel} : {st}")
        w.depth -= 1
        w.line("}")
        return out

    def _finish(self, acc: str, run_sum: str, at: dict[str, str]) -> None:
        """O = acc / sum (a row masked everywhere has acc = 0: dividing by 1 gives the 0 SDPA asks for)."""
        w, tq, e = self.w, self.tq, self.node.dims["E"]
        vec, tile = type_text((tq,), F32), type_text((tq, e), F32)
        denom = run_sum
        if self.node.zero_masked_rows:
            empty, denom = w.fresh("row_empty"), w.fresh("denom")
            w.line(f"{empty} = arith.cmpf oeq, {run_sum}, {self.vec_zero} : {vec}")
            w.line(f"{denom} = arith.select {empty}, {self._splat(float_text(1.0), (tq,), 'one')}, {run_sum} : "
                   f"{type_text((tq,), torch.bool)}, {vec}")
        o = w.fresh("o")
        w.line(f"{o} = arith.divf {acc}, {self._bcast(denom, tq, (tq, e), 1)} : {tile}")
        b = self.roles["O"]
        od = self.spec.buffers[b].dtype
        if od != F32:
            r = w.fresh("o_rounded")
            w.line(f"{r} = arith.truncf {o} : {tile} to {type_text((tq, e), od)}")
            o = r
        acc_tile, sizes = self._tile("O", at)
        if len(sizes) == 3:
            nd = w.fresh("o_3d")
            w.line(f"{nd} = tensor.expand_shape {o} [[0, 1], [2]] output_shape {sizes} : {type_text((tq, e), od)} "
                   f"into {type_text(sizes, od)}")
            o = nd
        w.line(f"ktdp.store {o}, {acc_tile} : {type_text(sizes, od)}, {w.tile_type(sizes)}")
