"""A KTIR kernel in the shape of a saved program (``Program.to_json``), so the views that read one open it.

Roofline reads each launch's ``modeled`` numbers; WorkDivisionView reads the SuperDSC's split and per-core
slices. A KTIR function's division is its grid: one slice per tile id along each grid dim, which is what
``ktdp.get_compute_tile_id`` hands the cores (how the text maps a tile id to data is in the text itself).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from spyre_lab.device.config import SPYRE, SpyreConfig
from spyre_lab.device.isa import OpKind, TileProgram
from spyre_lab.device.sim import simulate


def saved_program(name: str, program: TileProgram, grid: tuple[int, ...], cfg: SpyreConfig = SPYRE,
                  mode: str = "analytic") -> dict[str, Any]:
    """A one-launch saved program for ``program`` (a KTIR function's tile programs) on ``cfg``."""
    sim = simulate(program, cfg, mode=mode, trace=False)
    dims = {f"tile{i}": g for i, g in enumerate(grid)}
    coords = {str(c): {f"tile{i}": int(v) for i, v in enumerate(np.unravel_index(c, grid))}
              for c in range(int(np.prod(grid)))}
    ops = sorted({op.name.split(" ")[0] for p in program.programs for op in p
                  if op.kind not in (OpKind.LOAD, OpKind.STORE)})
    superdsc = {
        "kernel": name, "rule": "ktir",
        "coreFoldProp_": {"factor_": len(coords), "label_": "core"},
        "coreletFoldProp_": {"factor_": 1, "label_": "corelet"},
        "numWkSlicesPerDim_": dims,
        "coreIdToWkSlice_": coords,
        "dscs_": [{name: {"N_": dims, "dataStageParam_": {"0": {"perCore_": {c: {k: 1 for k in dims}
                                                                              for c in coords}}}}}],
    }
    entry = {"name": name, "rule": "ktir", "ops": ops, "host": False, "address_slots": [], "lx_resident": [],
             "superdsc": superdsc,
             "modeled": {k: getattr(sim, k) for k in ("mode", "time_us", "launch_us", "flops", "dram_bytes",
                                                      "bytes_loaded", "bytes_stored", "ring_bytes", "bottleneck")}}
    return {"name": name, "inputs": [], "outputs": [], "constants": [], "intermediates_pool_bytes": 0,
            "intermediates": [], "launches": [entry],
            "options": {"fusion": [], "work_division": "ktir", "lx_allocator": "", "timing": mode},
            "device": dataclasses.asdict(cfg)}
