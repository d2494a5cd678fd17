"""The lines DecodeTimeline draws between cards: each card's collective joined to the same collective on its peers.

One scatter trace of vertical segments, one per (card, peer) pair from
:func:`~spyre_lab.device.trace.collective_flows`, at the collective's start on the modeled clock, in the link
color, so the learner sees which lanes wait on one another (the Perfetto export draws the same pairs as flows).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from spyre_lab.device.trace import Trace, card_of_lane, collective_flows
from spyre_lab.viz import style

FLOWS_NAME = "collective flows"


def flow_spec(trace: Trace, lane_name: Callable[[int], str]) -> dict[str, Any] | None:
    """A plotly scatter spec (dict) of the segments between each collective and its peers; None without any.

    ``lane_name`` maps a card index to the y category its collectives are drawn on; x is relative to the trace's
    start, as the step row's bars are."""
    t0 = trace.start_us
    xs: list[float | None] = []
    ys: list[str | None] = []
    text: list[str | None] = []
    for source, peer in collective_flows(trace.events):
        a, b = card_of_lane(source.lane), card_of_lane(peer.lane)
        if a is None or b is None or b < a:  # one segment per unordered pair; both ends are the same collective
            continue
        x = source.start_us - t0
        label = f"{source.name}: card {a} <-> card {b}, {source.args.get('bytes', 0):,} B on {source.args.get('link')}"
        xs += [x, x, None]
        ys += [lane_name(a), lane_name(b), None]
        text += [label, label, None]
    if not xs:
        return None
    return dict(type="scatter", x=xs, y=ys, mode="lines", name=FLOWS_NAME, text=text, showlegend=False,
                line=dict(color=style.UNIT_COLORS["link"], width=1),
                hovertemplate="%{text}<br>starts at %{x:.2f} µs (modeled)<extra></extra>")
