"""LayoutView: a host tensor beside its stickified device copy, padding marked, one element followed across.

Left: the host tensor in row-major order (rows = every dim but the last). Right: device memory in address
order, one row per 128-byte stick. Both panels are colored by *device address* (dark = low), so the
reordering the stick rule does is visible as where the colors land on the host; grey cells on the device
are padding (the stick dim rounded up to whole sticks). A slider follows one host element: its host
offset, its device coordinates (``StickLayout.device_coords``), its stick and lane, and its byte address
(``StickLayout.device_offset``). Everything is computed from :class:`~spyre_lab.device.layout.StickLayout`;
for a real tensor the followed value is read back from ``stickify`` to show it really lands there.

Big tensors: above ``ELEMENT_LIMIT`` host elements each cell is one stick instead of one element, and
above ``STICK_LIMIT`` sticks the panels show the first sticks only; the figure says so.
"""

from __future__ import annotations

import html
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ipywidgets as W
import numpy as np
import plotly.graph_objects as go
import torch

from spyre_lab.device.layout import StickLayout, stickify
from spyre_lab.viz.base import View, cached_subplots, dropdown, note_annotation
from spyre_lab.viz.style import ADDRESS_SCALE, FOLLOW_COLOR, PADDING_COLOR

ELEMENT_LIMIT = 8192
"""Above this many host elements a cell is one stick, not one element (the figure says so)."""
STICK_LIMIT = 8192
"""Most sticks drawn per panel; beyond, the first ones only (the figure says so)."""
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "int8": torch.int8,
          "int64": torch.int64, "bool": torch.bool}


class LayoutView(View):
    """Host layout beside the stickified device layout of a tensor (or of a shape and dtype)."""

    figure_height = 520

    def __init__(self, source: torch.Tensor | Sequence[int], dtype: torch.dtype = torch.float16,
                 dim_order: Sequence[int] | None = None, element: int | None = None) -> None:
        super().__init__()
        if isinstance(source, torch.Tensor):
            self.tensor: torch.Tensor | None = source.detach().cpu()
            self.shape = tuple(source.shape)
            self.dtype = source.dtype
        elif isinstance(source, (tuple, list, torch.Size)):
            self.tensor = None
            self.shape = tuple(int(s) for s in source)
            self.dtype = dtype
        else:
            raise TypeError(f"LayoutView takes a tensor or a shape, got {type(source).__name__}")
        self.dim_order = ",".join(str(d) for d in (dim_order if dim_order is not None else range(len(self.shape))))
        self.layout = self._layout()
        numel = max(math.prod(self.shape), 1)
        self.element = element if element is not None else self._interesting_element()
        if not 0 <= self.element < numel:
            raise ValueError(f"element {self.element} is outside a tensor of {numel} elements")
        self._dtype_name = next(k for k, v in DTYPES.items() if v == self.dtype) if self.dtype in DTYPES.values() \
            else str(self.dtype)

    def _layout(self) -> StickLayout:
        order = tuple(int(d) for d in self.dim_order.split(",")) if self.dim_order else ()
        return StickLayout.default(self.shape, self.dtype, order or None)

    def _interesting_element(self) -> int:
        """The first element of the last (partial) stick when there is padding, else the first of the second stick."""
        lay = self.layout
        if lay.stick_dim is None or not self.shape:
            return 0
        eps, n = lay.elems_per_stick, self.shape[lay.stick_dim]
        along = (n // eps) * eps if n % eps and n > eps else min(eps, n - 1)
        index = [0] * len(self.shape)
        index[lay.stick_dim] = along
        return int(np.ravel_multi_index(index, self.shape))

    # --- state ------------------------------------------------------------------------------------
    @property
    def stick_cells(self) -> bool:
        """Whether a cell is one stick (big tensors) rather than one element."""
        return math.prod(self.shape or (1,)) > ELEMENT_LIMIT

    def follow(self) -> dict[str, Any]:
        """Where the followed element lives: host index and offset, device coords, stick, lane, byte address."""
        lay = self.layout
        index = tuple(int(i) for i in np.unravel_index(self.element, self.shape)) if self.shape else ()
        coords = lay.device_coords(index)
        offset = lay.device_offset(coords)
        eps = lay.elems_per_stick
        out = {"index": index, "host_offset": self.element, "coords": coords, "device_offset": offset,
               "stick": offset // eps, "lane": offset % eps, "byte": offset * (lay.stick_bytes // eps)}
        if self.tensor is not None and self.tensor.dtype == lay.dtype and tuple(self.tensor.shape) == lay.host_shape:
            host_value = self.tensor[index].item() if index else self.tensor.item()
            device_value = stickify(self.tensor, lay)[coords].item()
            out.update(host_value=host_value, device_value=device_value)
        return out

    @property
    def caption(self) -> str:  # type: ignore[override]
        f = self.follow()
        lay = self.layout
        value = f" (value {f['device_value']:.4g} read back from the stickified copy)" if "device_value" in f else ""
        return (f"Host {tuple(self.shape)} {self._dtype_name} beside its device layout {lay.device_size}: element "
                f"{list(f['index'])} lands in stick {f['stick']}, lane {f['lane']}, byte {f['byte']:,}{value}; "
                f"{lay.padding_fraction:.0%} of the device copy is padding.")

    def make_controls(self) -> list[W.Widget]:
        numel = max(math.prod(self.shape), 1)
        element = W.IntSlider(value=self.element, min=0, max=numel - 1, description="element",
                              continuous_update=False, style={"description_width": "initial"},
                              layout=W.Layout(width="360px"))
        orders = [",".join(map(str, p)) for p in itertools.permutations(range(len(self.shape)))
                  if self._drawable(p)] if 0 < len(self.shape) <= 4 else [self.dim_order]
        orders = orders if self.dim_order in orders else [self.dim_order, *orders]
        order = dropdown(orders, self.dim_order, "dim_order", "170px")
        dtype = dropdown(list(DTYPES), self._dtype_name if self._dtype_name in DTYPES else "float16", "dtype",
                         "150px")
        dtype.disabled = self.tensor is not None
        return [self.bind("element", element), self.bind("dim_order", order),
                self.bind("dtype", dtype, "_dtype_name")]

    def _drawable(self, order: tuple[int, ...]) -> bool:
        """Whether :meth:`build` can draw ``order``: a big tensor is drawn stick by stick along its last dim only."""
        if not self.stick_cells:
            return True
        return StickLayout.default(self.shape, self.dtype, order).stick_dim == len(self.shape) - 1

    def on_change(self, name: str) -> None:
        if name == "_dtype_name" or name == "dtype":
            self.dtype = DTYPES[self._dtype_name]
        if name in ("dim_order", "dtype", "_dtype_name"):
            self.layout = self._layout()
        self.refresh()

    # --- drawing ----------------------------------------------------------------------------------
    def _grids(self, lay: StickLayout, f: dict[str, Any]) -> _Grids:
        """The two panels' cells (device stick of every host cell; stick of every device cell) and the followed
        element's cell in each: one cell per element, or per stick above ``ELEMENT_LIMIT`` elements."""
        eps = lay.elems_per_stick
        offset0, valid = _stick_map(lay)
        sticks = len(offset0)
        cols = self.shape[-1] if self.shape else 1
        rows = max(math.prod(self.shape), 1) // max(cols, 1)
        if not self.stick_cells:
            host = np.full(rows * cols, np.nan)
            lanes = np.arange(eps)
            offsets = offset0[:, None] + lanes[None, :] * (lay.stride_map[-1] if lay.stride_map[-1] > 0 else 0)
            ok = lanes[None, :] < valid[:, None]
            host[offsets[ok]] = np.broadcast_to(np.arange(sticks)[:, None], offsets.shape)[ok]
            device = np.where(ok, np.arange(sticks)[:, None].astype(float), np.nan)
            return _Grids(host.reshape(rows, cols), device, np.where(ok, np.nan, 1.0), None,
                          (self.element % cols, self.element // cols), (f["lane"], f["stick"]), sticks, [],
                          ("last host dim", "host row (other dims flattened)", "lane in stick",
                           "stick (address order)"))
        if lay.stick_dim != len(self.shape) - 1:
            raise ValueError(f"LayoutView draws at most {ELEMENT_LIMIT:,} elements when the stick dim is not the "
                             "last host dim; pass a smaller shape")
        notes = []
        tiles = math.ceil(cols / eps)
        host = np.full((rows, tiles), np.nan)
        r, c = np.divmod(offset0, cols)
        host[r, c // eps] = np.arange(sticks)
        grid_cols = lay.device_size[-2] if len(lay.device_size) > 2 else sticks
        device = np.arange(sticks, dtype=float).reshape(-1, grid_cols)
        pad_dev = np.where((valid < eps).reshape(-1, grid_cols), 1.0, np.nan)
        pad_host = np.full_like(host, np.nan)
        pad_host[r, c // eps] = np.where(valid < eps, 1.0, np.nan)
        host_rows_shown = max(1, min(rows, STICK_LIMIT // max(tiles, 1)))
        dev_rows_shown = max(1, min(device.shape[0], STICK_LIMIT // max(grid_cols, 1)))
        notes.append(f"aggregated: each cell is one stick of {eps} elements ({rows * cols:,} host elements > "
                     f"{ELEMENT_LIMIT:,}); grey-edged sticks hold padding")
        if host_rows_shown < rows or dev_rows_shown * grid_cols < sticks:
            shown = min(sticks, STICK_LIMIT)
            notes.append(f"showing the first {min(shown, host_rows_shown * tiles):,} of {sticks:,} sticks")
        return _Grids(host[:host_rows_shown], device[:dev_rows_shown], pad_dev[:dev_rows_shown],
                      pad_host[:host_rows_shown], (f["index"][-1] // eps, self.element // cols),
                      (f["stick"] % grid_cols, f["stick"] // grid_cols), sticks, notes,
                      ("stick along the last dim", "host row", "device dim -2", "device sticks"))

    def build(self) -> go.Figure:
        lay = self.layout
        f = self.follow()
        g = self._grids(lay, f)
        host, device, pad_dev, pad_host = g.host, g.device, g.pad_dev, g.pad_host
        host_pos, dev_pos, sticks, notes = g.host_pos, g.dev_pos, g.sticks, g.notes
        x_host, y_host, x_dev, y_dev = g.axis_titles
        scale = [[i / (len(ADDRESS_SCALE) - 1), c] for i, c in enumerate(ADDRESS_SCALE)]
        pad_scale = [[0, PADDING_COLOR], [1, PADDING_COLOR]]
        layout, axes = cached_subplots(rows=1, cols=2, horizontal_spacing=0.1, column_widths=[0.5, 0.5],
                                       subplot_titles=["host (row-major)", "device (stickified, address order)"],
                                       template="plotly_white", height=self.figure_height,
                                       margin=dict(l=60, r=30, t=120, b=100))
        (xh, yh), (xd, yd) = axes[(1, 1)], axes[(1, 2)]
        zmax = max(sticks - 1, 1)
        data: list[dict] = [
            dict(type="heatmap", z=host.astype(np.float32), colorscale=scale, zmin=0, zmax=zmax, xaxis=xh, yaxis=yh,
                 showscale=False, name="host", hovertemplate="row %{y}, col %{x}: stick %{z}<extra>host</extra>",
                 meta={"panel": "host"}),
            dict(type="heatmap", z=device.astype(np.float32), colorscale=scale, zmin=0, zmax=zmax, xaxis=xd, yaxis=yd,
                 name="device", colorbar=dict(title=dict(text="device<br>stick", side="top"), len=0.8, thickness=12),
                 hovertemplate="stick %{z}<extra>device</extra>", meta={"panel": "device"}),
            dict(type="heatmap", z=pad_dev.astype(np.float32), colorscale=pad_scale, showscale=False, xaxis=xd,
                 yaxis=yd, name="padding", hovertemplate="padding<extra></extra>", meta={"panel": "padding"}),
        ]
        if pad_host is not None:
            data.append(dict(type="heatmap", z=pad_host.astype(np.float32), colorscale=pad_scale, showscale=False,
                             opacity=0.45, xaxis=xh, yaxis=yh, name="partial stick", hoverinfo="skip",
                             meta={"panel": "host padding"}))
        for (x, y), (xa, ya), name in ((host_pos, (xh, yh), "host"), (dev_pos, (xd, yd), "device")):
            data.append(dict(type="scatter", x=[x], y=[y], xaxis=xa, yaxis=ya, mode="markers", name=f"followed {name}",
                             marker=dict(symbol="square-open", size=16, color=FOLLOW_COLOR, line=dict(width=3)),
                             hoverinfo="skip", showlegend=False, meta={"panel": f"follow {name}"}))
        text = (f"host {list(f['index'])} (offset {f['host_offset']:,}) → device coords {list(f['coords'])} → "
                f"stick {f['stick']:,}, lane {f['lane']} → byte {f['byte']:,}")
        if "device_value" in f:
            text += f" · value {f['host_value']:.4g} on the host, {f['device_value']:.4g} on the device"
        annotations = list(layout.get("annotations", []))
        annotations.append(dict(text=html.escape(text), x=0.0, y=1.0, yshift=38, xref="paper", yref="paper",
                                xanchor="left", yanchor="bottom", showarrow=False,
                                font=dict(size=12, color=FOLLOW_COLOR), name="follow"))
        for i, n in enumerate(notes):
            annotations.append(note_annotation(n) | dict(y=0.0, yshift=-52 - 18 * i, yanchor="top"))
        lay_text = (f"{tuple(self.shape)} {self._dtype_name}, dim_order ({self.dim_order}) → device "
                    f"{lay.device_size}, {lay.num_sticks:,} sticks of {lay.stick_bytes} B, "
                    f"{lay.padding_fraction:.0%} padding")
        layout = {**layout, "annotations": annotations, "showlegend": False,
                  "title": dict(text=f"Stick layout of {html.escape(lay_text)}", x=0.01, xanchor="left",
                                font=dict(size=14))}
        extents = {xh: host.shape[1], yh: host.shape[0], xd: device.shape[1], yd: device.shape[0]}
        for ref, title in ((xh, x_host), (yh, y_host), (xd, x_dev), (yd, y_dev)):
            key = ("xaxis" if ref.startswith("x") else "yaxis") + ref[1:]
            extra: dict[str, Any] = {"autorange": "reversed"} if ref.startswith("y") else {}
            extra["tickformat"] = "d"                           # grid positions are whole cells
            if extents[ref] <= 16:
                extra["dtick"] = 1
            layout[key] = {**layout.get(key, {}), "title": {"text": title}, "showgrid": False, "zeroline": False,
                           **extra}
        return go.Figure(dict(data=data, layout=layout), _validate=False)


@dataclass
class _Grids:
    """What LayoutView's two panels draw (see :meth:`LayoutView._grids`)."""

    host: np.ndarray
    device: np.ndarray
    pad_dev: np.ndarray
    pad_host: np.ndarray | None
    host_pos: tuple[int, int]
    dev_pos: tuple[int, int]
    sticks: int
    notes: list[str]
    axis_titles: tuple[str, str, str, str]


def _stick_map(lay: StickLayout) -> tuple[np.ndarray, np.ndarray]:
    """Per stick in address order: the host offset of its lane 0 and how many of its lanes hold values."""
    if lay.stick_dim is None:
        return np.zeros(1, dtype=np.int64), np.ones(1, dtype=np.int64)
    dev = lay.device_size
    coords = np.indices(dev[:-1]).reshape(len(dev) - 1, -1)
    strides = np.array([s if s > 0 else 0 for s in lay.stride_map[:-1]], dtype=np.int64)
    offset0 = (coords * strides[:, None]).sum(axis=0)
    eps = lay.elems_per_stick
    tile = coords[lay.tile_dim] if len(dev) > 2 else coords[0]
    valid = np.minimum(eps, lay.host_shape[lay.stick_dim] - tile * eps)
    return offset0, valid
