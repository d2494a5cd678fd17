"""A drawing of the modeled card, made from ``SpyreConfig``: host, PCIe, DRAM, the ring of cores, corelets, LX.

Why drawn from the config: the picture a learner keeps in mind should be the machine the model runs, so a
``cfg.replace(cores=8)`` experiment draws 8 cores, and the labels (LX size, DRAM bandwidth, ring width) are the
numbers the simulator uses. Each part is one trace whose ``meta`` names it (``{"part": "core", "ids": [...]}``),
so a test or a learner can read the figure as data. Colors are the units' colors of every other view.
"""

from __future__ import annotations

import math

import plotly.graph_objects as go

from spyre_lab.device.config import GiB, KiB, SpyreConfig
from spyre_lab.viz.style import NEUTRAL, UNIT_COLORS

_CORE_W, _CORE_H = 0.8, 1.3
_TOP_Y, _BOTTOM_Y = 7.2, 0.8          # centres of the two rows of cores
_LEFT_X, _RIGHT_X = 5.0, 21.0         # where the rows of cores start and end
DRAM_COLOR = UNIT_COLORS["load"]
LX_COLOR = "#C9D8EA"


def _rect(x0: float, y0: float, x1: float, y1: float) -> tuple[list[float | None], list[float | None]]:
    return [x0, x1, x1, x0, x0, None], [y0, y0, y1, y1, y0, None]


def core_positions(cores: int) -> list[tuple[float, float]]:
    """Centre of each core, in ring order: along the top row left to right, then the bottom row right to left."""
    top = math.ceil(cores / 2)
    bottom = cores - top
    step_top = (_RIGHT_X - _LEFT_X) / max(top - 1, 1)
    step_bottom = (_RIGHT_X - _LEFT_X) / max(bottom - 1, 1)
    spots = [(_LEFT_X + i * step_top, _TOP_Y) for i in range(top)]
    spots += [(_RIGHT_X - i * step_bottom, _BOTTOM_Y) for i in range(bottom)]
    return spots


def _shapes(name: str, boxes: list[tuple[float, float, float, float]], color: str, line: str, hover: str,
            ids: list) -> go.Scatter:
    xs: list[float | None] = []
    ys: list[float | None] = []
    for box in boxes:
        bx, by = _rect(*box)
        xs += bx
        ys += by
    return go.Scatter(x=xs, y=ys, mode="lines", fill="toself", fillcolor=color, line={"color": line, "width": 1},
                      name=name, hoveron="fills", hoverinfo="text", text=hover, meta={"part": name, "ids": ids},
                      showlegend=False)


def card_figure(cfg: SpyreConfig | None = None) -> go.Figure:
    """The card as ``cfg`` models it: one plotly Figure, every part a named trace."""
    from spyre_lab.device.config import SPYRE

    cfg = cfg or SPYRE
    spots = core_positions(cfg.cores)
    traces: list[go.Scatter] = []

    # host and PCIe
    traces.append(_shapes("host", [(0.0, 3.0, 2.6, 5.0)], UNIT_COLORS["host"], NEUTRAL["text"],
                          "host CPU: runs Python, the compiler, program correction and the engine", ["host"]))
    traces.append(go.Scatter(x=[2.6, 3.6], y=[4.0, 4.0], mode="lines", line={"color": UNIT_COLORS["pcie"], "width": 6},
                             name="pcie", hoverinfo="text", showlegend=False, meta={"part": "pcie", "ids": ["pcie"]},
                             text=f"PCIe: {cfg.pcie_bandwidth / 1e9:.0f} GB/s (estimate), "
                                  f"{cfg.pcie_latency_us:g} us latency per transfer"))
    # the card outline
    cx, cy = _rect(3.6, -0.4, 22.2, 8.6)
    traces.append(go.Scatter(x=cx, y=cy, mode="lines", line={"color": NEUTRAL["muted"], "width": 1, "dash": "dot"},
                             name="card", hoverinfo="skip", showlegend=False, meta={"part": "card", "ids": ["card"]}))
    # DRAM in the middle left, linked to the ring of cores
    dram_text = (f"DRAM (LPDDR5): {cfg.dram_usable_bytes // GiB} GiB usable, {cfg.dram_bandwidth / 1e9:.1f} GB/s "
                 "shared by every core")
    traces.append(_shapes("dram", [(5.8, 3.1, 10.8, 4.9)], "#DCE6F2", DRAM_COLOR, dram_text, ["dram"]))
    # the ring through every core, in core order
    ring_x = [x for x, _ in spots] + [spots[0][0]]
    ring_y = [y for _, y in spots] + [spots[0][1]]
    traces.append(go.Scatter(x=ring_x, y=ring_y, mode="lines", line={"color": UNIT_COLORS["ring"], "width": 3},
                             name="ring", hoverinfo="text", showlegend=False, meta={"part": "ring", "ids": ["ring"]},
                             text=f"ring: bi-directional, {cfg.ring_bytes_per_cycle} B/cycle each way, "
                                  f"{cfg.ring_hop_cycles} cycles per hop (estimate)"))
    # cores: an outline, the LX band at the bottom, the corelets (PT + SFU) above it
    core_boxes, lx_boxes, pt_boxes, sfu_boxes = [], [], [], []
    corelet_ids = []
    n_corelets = cfg.corelets_per_core
    for core, (x, y) in enumerate(spots):
        x0, y0 = x - _CORE_W / 2, y - _CORE_H / 2
        core_boxes.append((x0, y0, x0 + _CORE_W, y0 + _CORE_H))
        lx_boxes.append((x0 + 0.05, y0 + 0.05, x0 + _CORE_W - 0.05, y0 + 0.45))
        width = (_CORE_W - 0.1) / n_corelets
        for j in range(n_corelets):
            left = x0 + 0.05 + j * width
            pt_boxes.append((left + 0.02, y0 + 0.8, left + width - 0.02, y0 + _CORE_H - 0.05))
            sfu_boxes.append((left + 0.02, y0 + 0.5, left + width - 0.02, y0 + 0.75))
            corelet_ids.append([core, j])
    core_ids = list(range(cfg.cores))
    traces.append(_shapes("core", core_boxes, NEUTRAL["white"], NEUTRAL["text"],
                          f"core: {n_corelets} corelets sharing one LX scratchpad; no cache, no threads", core_ids))
    traces.append(_shapes("lx", lx_boxes, LX_COLOR, NEUTRAL["edge_lx"],
                          f"LX scratchpad: {cfg.lx_bytes // KiB:,} KiB per core, planner may use "
                          f"{cfg.lx_budget_bytes:,} B", core_ids))
    traces.append(_shapes("pt", pt_boxes, UNIT_COLORS["pt"], UNIT_COLORS["pt"],
                          f"PT: {cfg.pe_rows}x{cfg.pe_cols} systolic array per corelet (matmuls)", corelet_ids))
    traces.append(_shapes("sfu", sfu_boxes, UNIT_COLORS["sfu"], UNIT_COLORS["sfu"],
                          f"SFU: vector unit per corelet, {cfg.sfu_lanes} fp16 lanes (exp, tanh, softmax steps)",
                          corelet_ids))
    # one core drawn large, so its parts can be named
    traces.extend(_core_detail(cfg))

    fig = go.Figure(traces)
    first, last = spots[0], spots[-1]
    notes = [
        (1.3, 5.4, "host"), (3.1, 4.35, "PCIe"), (8.3, 4.0, f"DRAM {cfg.dram_usable_bytes // GiB} GiB"),
        (first[0], first[1] + 0.95, "core 0"), (last[0], last[1] - 0.95, f"core {cfg.cores - 1}"),
        (_LEFT_X - 0.75, 4.0, "ring"),
    ]
    for x, y, text in notes:
        fig.add_annotation(x=x, y=y, text=text, showarrow=False, font={"size": 12, "color": NEUTRAL["text"]},
                           name=f"label {text.split()[0].lower()}")
    fig.update_layout(
        title=f"The modeled card ({cfg.name}): {cfg.cores} cores x {cfg.corelets_per_core} corelets on a ring, "
              f"{cfg.lx_bytes // KiB:,} KiB LX per core, DRAM and host over PCIe",
        xaxis={"visible": False, "range": [-0.3, 22.5]}, yaxis={"visible": False, "range": [-0.8, 9.0],
                                                                "scaleanchor": "x"},
        height=420, margin={"l": 10, "r": 10, "t": 50, "b": 10}, plot_bgcolor=NEUTRAL["white"])
    return fig


def _core_detail(cfg: SpyreConfig) -> list[go.Scatter]:
    """Core 0 enlarged on the right of the DRAM box: the corelets with their PT and SFU above the shared LX."""
    x0, y0, x1, y1 = 12.0, 2.2, 20.5, 5.8
    parts = [_shapes("detail core", [(x0, y0, x1, y1)], NEUTRAL["white"], NEUTRAL["text"], "one core, enlarged",
                     [0])]
    parts.append(_shapes("detail lx", [(x0 + 0.2, y0 + 0.2, x1 - 0.2, y0 + 1.1)], LX_COLOR, NEUTRAL["edge_lx"],
                         f"LX: {cfg.lx_bytes // KiB:,} KiB, shared by the corelets", [0]))
    width = (x1 - x0 - 0.4) / cfg.corelets_per_core
    labels = []
    for j in range(cfg.corelets_per_core):
        left = x0 + 0.2 + j * width
        parts.append(_shapes("detail corelet", [(left + 0.1, y0 + 1.3, left + width - 0.1, y1 - 0.2)],
                             "#FAFAFA", NEUTRAL["muted"], f"corelet {j}", [[0, j]]))
        parts.append(_shapes("detail pt", [(left + 0.3, y0 + 2.2, left + width - 0.3, y1 - 0.4)], UNIT_COLORS["pt"],
                             UNIT_COLORS["pt"], f"PT {cfg.pe_rows}x{cfg.pe_cols}", [[0, j]]))
        parts.append(_shapes("detail sfu", [(left + 0.3, y0 + 1.45, left + width - 0.3, y0 + 2.05)],
                             UNIT_COLORS["sfu"], UNIT_COLORS["sfu"], "SFU", [[0, j]]))
        labels.append((left + width / 2, (y0 + 2.2 + y1 - 0.4) / 2, f"corelet {j}: PT {cfg.pe_rows}x{cfg.pe_cols}"))
        labels.append((left + width / 2, y0 + 1.75, "SFU"))
    labels.append(((x0 + x1) / 2, y0 + 0.65, f"LX {cfg.lx_bytes // KiB:,} KiB (shared)"))
    labels.append(((x0 + x1) / 2, y1 + 0.25, "core 0, enlarged"))
    parts.append(go.Scatter(x=[x for x, _, _ in labels], y=[y for _, y, _ in labels], mode="text",
                            text=[t for _, _, t in labels], textfont={"size": 11, "color": NEUTRAL["text"]},
                            hoverinfo="skip", showlegend=False, name="detail labels",
                            meta={"part": "detail labels", "ids": []}))
    return parts
