"""Views of the modeled machine: ipywidgets + plotly over plain data objects (Trace, Program, EngineStats).

This package is the only place plotly and ipywidgets are imported. Every view has a static ``.figure``
(a plotly Figure, for HTML export) and a ``.widget`` (controls above a FigureWidget) shown by Jupyter.
"""

from spyre_lab.viz.base import View, aggregation_note, sync_figure

__all__ = ["View", "aggregation_note", "sync_figure"]
