"""The fused MLP as KTIR: ``out = (silu(x @ Wg) * (x @ Wu)) @ Wd``, gate, up and h kept in LX.

Each core owns a slice of the rows (M) and of the intermediate dim I (the kernel's N). Per row tile it runs
gate and up over K with fp32 ``iter_args`` accumulators (one x tile feeds both), rounds them, writes the
pointwise nodes (the matmul epilogue writer), then the down projection one output-column tile (O) at a time:
the I-slices are partial sums of the output, so the I partners of a row tile form one reduce group
(``ktdp.inter_tile_produce`` / ``inter_tile_reduce``), and the partner holding I's first slice rounds and
stores. This is the compiler's plan when one I tile covers the core's I-slice; the plan that keeps the output
accumulating over several I tiles is refused by name.
"""

from __future__ import annotations

import torch

from spyre_lab.compiler.ir import MatMul
from spyre_lab.compiler.ktir_epilogue import write_epilogue
from spyre_lab.compiler.ktir_errors import KTIRUnsupported
from spyre_lab.compiler.ktir_matmul import MatmulWriter
from spyre_lab.compiler.ktir_probe import buffer_types
from spyre_lab.compiler.ktir_writer import type_text


class MlpWriter(MatmulWriter):
    order = ("B", "M", "K", "N", "O")

    def body(self) -> None:
        spec, w = self.spec, self.w
        mms = [n for n in self.nodes if isinstance(n, MatMul)]
        if len(mms) != 3 or self.nodes[:2] != mms[:2] or self.nodes[-1] is not mms[2]:
            raise KTIRUnsupported("export", 0, f"kernel {spec.name}: not gate, up, pointwise nodes, down")
        gate, up, down = mms
        x, wg, wu, wd, out = gate.inputs[0], gate.inputs[1], up.inputs[1], down.inputs[1], down.output
        self.axes = {b: self.view_of(b, self.order)[3] for b in (x, wg, wu, wd, out)}
        want = {x: ("M", "K"), wg: ("K", "N"), wu: ("K", "N"), wd: ("N", "O"), out: ("M", "O")}
        if up.inputs[0] != x or any(self.axes[b] != a for b, a in want.items()):
            raise KTIRUnsupported("export", 0, f"kernel {spec.name}: MLP operands run along {self.axes}")
        starts = self.slice_starts(("B", "M", "N", "K"))
        o_dim = spec.operands[out].shape[-1]
        tile = {"B": 1, **{d: self.tile_size(d, ragged=True) for d in ("M", "N", "K")},
                "O": max(1, min(spec.tiles.get("O", o_dim), o_dim))}
        if tile["N"] < self.chunk["N"] or "K" in self.maps:
            raise KTIRUnsupported("export", 0, f"kernel {spec.name}: the MLP plan that accumulates the output over "
                                               "several I tiles (or splits K) is not written out yet")
        types = buffer_types(spec, self.nodes, self.inputs)[0]
        views = {b: self.make_view(b, spec.buffers[b].dtype, self.order) for b in spec.address_slots}
        at = {"B": starts["B"], "K": starts["K"], "N": starts["N"]}
        at["M"] = self._loop("M", starts["M"], tile["M"])
        tm, ti, to = tile["M"], tile["N"], tile["O"]
        g, u = self._gate_up(x, wg, wu, views, at, starts, tile, types)
        rounded = {}
        for node, acc in ((gate, g), (up, u)):
            rounded[node.output] = self._round(acc, {"M": tm, "N": ti}, types[node.output])
        h = write_epilogue(self, self.nodes[2:-1], rounded, views, at, tile)
        h_t = type_text((tm, ti), types[down.inputs[0]])
        at["O"] = oi = w.fresh("o_i")
        w.line(f"scf.for {oi} = {w.index(0)} to {w.index(o_dim)} step {w.index(to)} {{")
        w.depth += 1
        vd = self._load(wd, views[wd], at, tile, types[wd])
        acc_t = type_text((tm, to), torch.float32)
        acc0, part = self._zeros(acc_t, "down_acc0"), w.fresh("down")
        w.line(f"{part} = linalg.matmul ins({h}, {vd} : {h_t}, {type_text((ti, to), types[wd])}) "
               f"outs({acc0} : {acc_t}) -> {acc_t}")
        total = self._reduce_partners(part, acc_t, dim="N") if "N" in self.maps else part
        if "N" in self.maps:
            first = w.fresh("i_first")
            w.line(f"{first} = arith.cmpi eq, {starts['N']}, {w.index(0)} : index")
            w.line(f"scf.if {first} {{")
            w.depth += 1
        res = self._round(total, {"M": tm, "N": to}, types[out])
        acc, sizes = self._tile(out, views[out], at, tile, types[out])
        w.line(f"ktdp.store {res}, {acc} : {type_text(sizes, types[out])}, {w.tile_type(sizes)}")
        if "N" in self.maps:
            self._close(yields=False)
        self._close()
        self._close()

    def _gate_up(self, x: str, wg: str, wu: str, views: dict, at: dict, starts: dict, tile: dict, types: dict
                 ) -> tuple[str, str]:
        """gate and up over the core's K, one x tile per step feeding both (fp32 accumulators)."""
        w = self.w
        tm, ti, tk = tile["M"], tile["N"], tile["K"]
        acc_t = type_text((tm, ti), torch.float32)
        acc0 = self._zeros(acc_t)
        ga, ua, g_out, u_out = w.fresh("gate_acc"), w.fresh("up_acc"), w.fresh("gate_out"), w.fresh("up_out")
        self._k_loop([g_out, u_out], [ga, ua], acc0, acc_t, starts["K"], tk, at)
        vx = self._load(x, views[x], at, tile, types[x])
        outs = []
        for wt, acc in ((wg, ga), (wu, ua)):
            vw = self._load(wt, views[wt], at, tile, types[wt])
            mm = w.fresh("partial")
            w.line(f"{mm} = linalg.matmul ins({vx}, {vw} : {type_text((tm, tk), types[x])}, "
                   f"{type_text((tk, ti), types[wt])}) outs({acc} : {acc_t}) -> {acc_t}")
            outs.append(mm)
        w.line(f"scf.yield {', '.join(outs)} : {acc_t}, {acc_t}")
        self._close()
        return g_out, u_out
