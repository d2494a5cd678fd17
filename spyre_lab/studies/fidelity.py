"""How far the modeled card is from the real one: every reference time against both named machines.

A reference is either **measured** on the card (torch-spyre's scratchpad-planning study: the one-core softmax
ladder and its four-core run) or a **prediction of torch-spyre's analytical cost model**, which is fitted to about
1,535 measured kernels and is itself within a stated RMS error of the hardware per category (the ``band``). The
fitted model's terms are restated here from its documentation, as numbers, and evaluated on each kernel's own
bytes: one-way DRAM traffic at 150 GB/s, a read/write turnaround of 0.00574 ns per overlapping byte (a balanced
copy runs at 105 GB/s), broadcast-operand kernels at 118 GB/s, restickify at 116 GB/s, a row reduction's read rate
``min(150, 114 + 61 exp(-rows / 3700))`` GB/s. Its worked examples (softmax 4096x2048 = 320.0 us, the row-tiled
matmul = 423.1 us) are quoted as printed.

Every modeled time is the analytic simulator's, launch included, for the plan the reference describes: the
compiler's own plan of a small graph (``studies.kernels.measure``) or, for the row-tiled matmul, the device's
reference matmul builder with that plan's traffic. ``spyre-lab fidelity --markdown`` writes ``docs/fidelity.md``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from spyre_lab.compiler import CompileOptions
from spyre_lab.device.config import DATASHEET, MEASURED, SpyreConfig
from spyre_lab.device.kernels import matmul_kernel
from spyre_lab.device.sim import simulate
from spyre_lab.studies import fidelity_mechanisms
from spyre_lab.studies.claims import SOFTMAX_LADDER, SOFTMAX_SHAPE
from spyre_lab.studies.kernels import measure, softmax

SCHEMA = "spyre_lab.fidelity/1"
MACHINES: dict[str, SpyreConfig] = {"measured": MEASURED, "datasheet": DATASHEET}

FP16 = 2
ROWS, COLS = 4096, 2048
"""The shape of torch-spyre's worked examples; every fitted-model point uses it."""

BANDS = {"pointwise": 8.5, "reduction": 7.2, "broadcast": 5.0, "transport": 6.1, "softmax": 21.1,
         "matmul, row-tiled": 25.1}
"""torch-spyre's RMS error against hardware per category (percent), as its cost-model page states it."""

GOALS = {"pointwise": 10.0, "reduction": 10.0, "broadcast": 10.0, "transport": 10.0, "softmax": 21.0,
         "matmul, row-tiled": 31.0}
"""The RMS error (percent) the measured machine aims to stay within per category: under 10% where the fitted model
is, its 21% for softmax, and for matmul its documented one-way bias (the fitted model under-charges by 22-31%)."""

LADDER_GOAL = 10.0
"""Percent: every rung of the measured one-core ladder should be this close."""


def fitted_us(read: float, write: float, gbps: float = 150.0, turnaround_ns: float = 0.00574) -> float:
    """torch-spyre's fitted time (us) of a kernel moving ``read`` and ``write`` bytes: ``(R+W)/BW + t min(R, W)``."""
    return ((read + write) / gbps + turnaround_ns * min(read, write)) / 1e3


def _flat_rate_us(read: float, write: float, gbps: float) -> float:
    """The fitted model's access-pattern rates (broadcast, restickify): one measured rate over all the bytes."""
    return (read + write) / gbps / 1e3


def _reduction_read_gbps(rows: int) -> float:
    """The fitted model's read rate of a standalone row reduction, which falls with the number of rows."""
    return min(150.0, 114.0 + 61.0 * math.exp(-rows / 3700.0))


@dataclass(frozen=True)
class Point:
    """One reference time and how to model the same plan."""

    key: str
    category: str
    label: str
    reference_us: float
    kind: str          # "measured" (on the card) or "fitted" (torch-spyre's cost-model prediction)
    source: str
    model: Callable[[SpyreConfig], float]
    plan_of: str = ""  # the shape whose plans are ranked together (rank correlation), if any


def _compiled(fn: Callable[..., torch.Tensor], shapes: list[tuple[int, ...]], options: CompileOptions | None = None,
              cores: int | None = None) -> Callable[[SpyreConfig], float]:
    def run(cfg: SpyreConfig) -> float:
        on = cfg.replace(cores=cores) if cores else cfg
        return measure(fn, shapes, options or CompileOptions(), on).time_us
    return run


def _row_tiled_matmul(cfg: SpyreConfig) -> float:
    """C[4096,1024] = A[4096,2048] @ B: 4 x 8 cores, each walking its rows in 128-row tiles and re-reading its B
    columns for every tile: the row-tiled plan's 58.7 MB (A and C once, B eight times)."""
    kernel = matmul_kernel(ROWS, 1024, COLS, 4, 8, 1, cfg=cfg, tile=(128, 128, 64))
    return simulate(kernel, cfg, mode="analytic", trace=False).time_us


def _exp(x: torch.Tensor) -> torch.Tensor:
    return torch.exp(x)


def _add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + y


def _row_sum(x: torch.Tensor) -> torch.Tensor:
    return x.sum(dim=-1)


def _transpose(x: torch.Tensor) -> torch.Tensor:
    return x.t().contiguous()


def points() -> list[Point]:
    """Every reference point, fitted-model predictions first, then the measured ladder."""
    tensor = ROWS * COLS * FP16
    fitted = "torch-spyre cost model (docs/source/compiler/cost_model.md, torch_spyre/_inductor/cost_model.py)"
    study = "torch-spyre scratchpad-planning study (docs/source/compiler/scratchpad_planning.md), measured"
    out = [
        Point("exp", "pointwise", f"exp {ROWS}x{COLS}, 32 cores", fitted_us(tensor, tensor), "fitted", fitted,
              _compiled(_exp, [(ROWS, COLS)])),
        Point("add", "pointwise", f"add {ROWS}x{COLS} + {ROWS}x{COLS}, 32 cores", fitted_us(2 * tensor, tensor),
              "fitted", fitted, _compiled(_add, [(ROWS, COLS), (ROWS, COLS)])),
        Point("row_sum", "reduction", f"sum over rows {ROWS}x{COLS}, 32 cores",
              fitted_us(tensor, ROWS * FP16, _reduction_read_gbps(ROWS)), "fitted", fitted,
              _compiled(_row_sum, [(ROWS, COLS)])),
        Point("row_sum_short", "reduction", "sum over rows 512x16384, 32 cores",
              fitted_us(512 * 16384 * FP16, 512 * FP16, _reduction_read_gbps(512)), "fitted", fitted,
              _compiled(_row_sum, [(512, 16384)])),
        Point("bcast_add", "broadcast", f"add {ROWS}x{COLS} + 1x{COLS}, 32 cores",
              _flat_rate_us(tensor + COLS * FP16, tensor, 118.0), "fitted", fitted,
              _compiled(_add, [(ROWS, COLS), (1, COLS)])),
        Point("transpose", "transport", f"transpose {ROWS}x{COLS} (restickify), 32 cores",
              _flat_rate_us(tensor, tensor, 116.0), "fitted", fitted, _compiled(_transpose, [(ROWS, COLS)])),
        Point("softmax", "softmax", f"softmax {ROWS}x{COLS}, 32 cores (worked example)", 320.0, "fitted", fitted,
              _compiled(softmax, [(ROWS, COLS)])),
        Point("matmul_rows", "matmul, row-tiled", "matmul 4096x2048 @ 2048x1024, 8 row tiles (worked example)", 423.1,
              "fitted", fitted + "; a lower bound (max(compute, memory) under-charges matmul by 22-31%)",
              _row_tiled_matmul),
    ]
    for i, (label, flags, published) in enumerate(SOFTMAX_LADDER):
        out.append(Point(f"ladder_{i + 1}", "softmax", f"softmax 512x1024, 1 core, {label}", published, "measured",
                         study, _compiled(softmax, [SOFTMAX_SHAPE], CompileOptions(**flags), cores=1), "512x1024"))
    out.append(Point("ladder_4_cores", "softmax", "softmax 512x1024, 4 cores, every LX step on", 32.17, "measured",
                     study, _compiled(softmax, [SOFTMAX_SHAPE], cores=4), "512x1024"))
    return out


def spearman(xs: list[float], ys: list[float]) -> float:
    """Rank correlation of two equally long lists (ties share their mean rank)."""
    def ranks(values: list[float]) -> list[float]:
        order = sorted(range(len(values)), key=values.__getitem__)
        out = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2
            i = j + 1
        return out
    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    var = math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    return cov / var if var else 0.0


def _rms(errors: list[float]) -> float:
    return math.sqrt(sum(e * e for e in errors) / len(errors)) if errors else 0.0


def fidelity(mechanisms: bool = False) -> dict[str, Any]:
    """Every point on both machines, the error per point, the RMS error per category and the rank correlations.

    ``mechanisms``: also run the candidate-mechanism probes (:mod:`fidelity_mechanisms`, six more compiles of the
    ladder) under ``"mechanisms"``. Only ``docs/fidelity.md`` and ``spyre-lab fidelity --markdown/--json`` show
    them, so the demo, the report and the Fidelity view do not pay for them."""
    rows = []
    for p in points():
        modeled = {name: p.model(cfg) for name, cfg in MACHINES.items()}
        rows.append({"key": p.key, "category": p.category, "label": p.label, "kind": p.kind, "source": p.source,
                     "reference_us": p.reference_us, "plan_of": p.plan_of,
                     "modeled_us": modeled,
                     "error_pct": {m: (t / p.reference_us - 1) * 100 for m, t in modeled.items()}})
    categories = {}
    for cat in dict.fromkeys(r["category"] for r in rows):
        mine = [r for r in rows if r["category"] == cat]
        categories[cat] = {"points": len(mine), "band_pct": BANDS.get(cat), "goal_pct": GOALS.get(cat),
                           "rms_pct": {m: _rms([r["error_pct"][m] for r in mine]) for m in MACHINES}}
    ranked = {}
    for shape in dict.fromkeys(r["plan_of"] for r in rows if r["plan_of"]):
        mine = [r for r in rows if r["plan_of"] == shape]
        ranked[shape] = {m: spearman([r["modeled_us"][m] for r in mine], [r["reference_us"] for r in mine])
                         for m in MACHINES}
    ladder = [r for r in rows if r["key"].startswith("ladder_") and r["key"] != "ladder_4_cores"]
    four = next(r for r in rows if r["key"] == "ladder_4_cores")
    return {"schema": SCHEMA, "modeled": True, "points": rows, "categories": categories, "rank_correlation": ranked,
            "ladder_worst_pct": {m: max(abs(r["error_pct"][m]) for r in ladder) for m in MACHINES},
            "four_cores_slower": {m: four["modeled_us"][m] > ladder[-1]["modeled_us"][m] for m in MACHINES},
            **({"mechanisms": fidelity_mechanisms.probes()} if mechanisms else {})}


def to_markdown(result: dict[str, Any]) -> str:
    """docs/fidelity.md: the tables, then what the gaps mean."""
    lines = ["# Fidelity: the modeled card against the real one", "",
             "Generated by `spyre-lab fidelity --markdown > docs/fidelity.md`; a test fails when it drifts.",
             "All modeled times are **modeled** (analytic simulator, launch included). `measured` is the machine",
             "fitted to the card and the default (`SpyreConfig.preset(\"measured\")`); `datasheet`",
             "(`SpyreConfig.preset(\"datasheet\")`, `SPYRE_LAB_MACHINE=datasheet`) is the same mechanisms",
             "at the peak numbers.",
             "A reference is *measured* on the card or *fitted*: a prediction of torch-spyre's cost model, which is",
             "itself within its category's band of the hardware.", "",
             "| point | category | reference | us | measured us | error | datasheet us | error |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in result["points"]:
        m, d = r["modeled_us"], r["error_pct"]
        lines.append(f"| {r['label']} | {r['category']} | {r['kind']} | {r['reference_us']:.2f} | "
                     f"{m['measured']:.2f} | {d['measured']:+.1f}% | {m['datasheet']:.2f} | {d['datasheet']:+.1f}% |")
    lines += ["", "RMS error per category (torch-spyre's categories; its own band against hardware, and the goal):",
              "", "| category | points | torch-spyre band | goal | measured | datasheet |",
              "|---|---:|---:|---:|---:|---:|"]
    for cat, c in result["categories"].items():
        band = f"{c['band_pct']:.1f}%" if c["band_pct"] is not None else "-"
        goal = f"{c['goal_pct']:.0f}%" if c["goal_pct"] is not None else "-"
        lines.append(f"| {cat} | {c['points']} | {band} | {goal} | {c['rms_pct']['measured']:.1f}% | "
                     f"{c['rms_pct']['datasheet']:.1f}% |")
    lines += ["", "Rank correlation (Spearman) across the plans of one shape, modeled against measured:", ""]
    for shape, rho in result["rank_correlation"].items():
        lines.append(f"- softmax {shape} (4 ladder rungs and the 4-core run): measured {rho['measured']:+.3f}, "
                     f"datasheet {rho['datasheet']:+.3f} (torch-spyre's model: +0.875 to +0.998 per category)")
    worst, slower = result["ladder_worst_pct"], result["four_cores_slower"]
    lines += [f"- worst ladder rung: measured {worst['measured']:.1f}%, datasheet {worst['datasheet']:.1f}% "
              f"(goal {LADDER_GOAL:.0f}%)",
              f"- 4 cores slower than 1 on 512x1024: measured {'yes' if slower['measured'] else 'no'}, datasheet "
              f"{'yes' if slower['datasheet'] else 'no'} (on the card: yes, 32.17 vs 23.67 us)", ""]
    lines += ["## What the gaps mean", "", _dram_remark(result), *_REMARKS, ""]
    if "mechanisms" in result:
        lines += fidelity_mechanisms.to_markdown(result["mechanisms"])
    return "\n".join(lines)


def _dram_remark(result: dict[str, Any]) -> str:
    """The first remark, its ranges read off the table (so the prose cannot drift from the numbers)."""
    dram = [r for r in result["points"] if r["category"] in DRAM_CATEGORIES or r["key"] == "softmax"]
    spread = {m: (min(abs(r["error_pct"][m]) for r in dram), max(abs(r["error_pct"][m]) for r in dram))
              for m in MACHINES}
    (lo_m, hi_m), (lo_d, hi_d) = spread["measured"], spread["datasheet"]
    return ("- **DRAM** sets almost every point. On `measured` a transfer runs at the rate the mix of reads and "
            "writes in flight allows (150 GB/s one way, 105 GB/s balanced), so exp, add, the broadcast add, the "
            f"transpose and the big softmax land within {lo_m:.1f}-{hi_m:.1f}% of the fitted model; on `datasheet` "
            f"(204.8 GB/s whatever the mix) they are {lo_d:.0f}-{hi_d:.0f}% fast. Part of this is self-consistency, "
            "not an independent check: the exp and add references are the fitted model's predictions at the very "
            "rates `measured` takes from it. The broadcast and transpose references use rates fitted separately "
            "(about 118 and 116 GB/s) for which the simulator has no mechanism of its own: they land near because "
            "those rates are close to the balanced one.")


DRAM_CATEGORIES = ("pointwise", "broadcast", "transport")

_REMARKS = (
    "- **Reductions over many rows**: torch-spyre measures a row reduction's read rate falling with the rows "
    "(134 GB/s at 4096 rows); spyre_lab reads at the one-way peak whatever the rows, so the 4096-row sum is fast.",
    "- **The one-core ladder's first rungs** cannot be met by any DRAM rate the fitted model allows: with no LX "
    "planning the compiler's plan moves about 8.6 MB (every intermediate stored and read back), which takes at least "
    "57 us at the 150 GB/s peak, while the study measured 32.51 us (258 GB/s if those bytes all reached DRAM). The two "
    "sources are different builds; the study's build likely kept some intermediates on chip without the planner. "
    "The last two rungs (the bytes a fused softmax must move) are within 15%. The mechanisms the calibration may add "
    "(a fixed per-bundle cost, a per-core DMA ceiling, partial overlap) all add time, so none can close a rung the "
    "model already over-charges: the table below runs each.",
    "- **4 cores vs 1**: the card ran the 512x1024 softmax slower on 4 cores (32.17 us) than on 1 (23.67 us). The "
    "model has no cost that grows with the cores a small kernel spreads over, and torch-spyre's own fit finds no "
    "fixed per-kernel term at 32 cores; on both machines 4 cores are faster. One core is SFU-bound (8 SFU passes per "
    "element), 4 cores DRAM-bound.",
    "- **Matmul**: the reference is a lower bound (the fitted model's `max(compute, memory)` under-charges by "
    "22-31%, so the card takes about 520-550 us). `measured` runs the PT arrays at the sustained 1140 MAC/ns per "
    "core, but its PT and DMA engines still overlap fully, so the row-tiled plan lands near the bound, not above it. "
    "Partial overlap is not modeled: the 22-31% is a mean over torch-spyre's matmul sweep, which neither it nor any "
    "source splits into a physical cause (LX port sharing, DMA issue stalls) or an overlap fraction per kernel, and "
    "one worked example cannot fit one without making it a per-claim constant.",
)


def main(as_json: bool = False, markdown: bool = False) -> int:
    """The ``spyre-lab fidelity`` command."""
    import json

    result = fidelity(mechanisms=as_json or markdown)   # the text summary does not show the probes
    if as_json:
        print(json.dumps(result, indent=1))
    elif markdown:
        print(to_markdown(result), end="")
    else:
        for r in result["points"]:
            print(f"{r['label']:<62} ref {r['reference_us']:9.2f} us ({r['kind']})  measured "
                  f"{r['modeled_us']['measured']:9.2f} ({r['error_pct']['measured']:+6.1f}%)  datasheet "
                  f"{r['modeled_us']['datasheet']:9.2f} ({r['error_pct']['datasheet']:+6.1f}%)")
        for cat, c in result["categories"].items():
            rms = c["rms_pct"]
            print(f"RMS {cat:<18} measured {rms['measured']:5.1f}%  datasheet {rms['datasheet']:5.1f}%")
    return 0
