"""Views of the modeled machine: ipywidgets + plotly over plain data objects (Trace, Program, EngineStats).

This package is the only place plotly and ipywidgets are imported. Every view has a static ``.figure``
(a plotly Figure, for HTML export) and a ``.widget`` (controls above the figure, drawn by plotly's JupyterLab
renderer inside an ``ipywidgets.Output``: core widgets only, so nothing can keep the plot behind its controls) shown
by Jupyter; ``View.from_json(path)`` opens a saved trace or program. ``docs/views.md`` lists the views, what each is
built from, and where each aggregates big inputs.
"""

from spyre_lab.viz.base import LiveFigure, View, aggregation_note, sync_figure
from spyre_lab.viz.dataflow import DataflowView
from spyre_lab.viz.fidelity import Fidelity
from spyre_lab.viz.fusion import FusionView
from spyre_lab.viz.kv_cache import KVCacheView
from spyre_lab.viz.layout import LayoutView
from spyre_lab.viz.roofline import Roofline
from spyre_lab.viz.router import RouterView
from spyre_lab.viz.tensor_parallel import TensorParallelView
from spyre_lab.viz.timeline import DecodeTimeline
from spyre_lab.viz.whatif import WhatIf
from spyre_lab.viz.work_division import WorkDivisionView

__all__ = [
    "DataflowView",
    "DecodeTimeline",
    "Fidelity",
    "FusionView",
    "KVCacheView",
    "LayoutView",
    "LiveFigure",
    "Roofline",
    "RouterView",
    "TensorParallelView",
    "View",
    "WhatIf",
    "WorkDivisionView",
    "aggregation_note",
    "sync_figure",
]
