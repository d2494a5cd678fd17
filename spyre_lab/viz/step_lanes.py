"""One engine step's modeled events as the lanes DecodeTimeline and WhatIf draw: host, correction, PCIe, layers.

The host thread (enqueue, rebuild, waits), program correction (host callbacks) and PCIe each get a lane; the
card's kernels get one lane per decoder layer, found from where each attention starts (:func:`layer_of_kernels`),
and groups of layers share a lane above ``MAX_LAYER_LANES``. Each event keeps the color of its kernel. Each card
of a tensor-parallel group gets a lane of its collectives (``card <r> collectives``, spyreccl's ``card<r>.ccl``),
drawn in the link color, below the layers.
"""

from __future__ import annotations

from collections.abc import Sequence

from spyre_lab.device.trace import Trace, TraceEvent, card_of_lane
from spyre_lab.viz import style

#: above this many layer lanes, the step row merges layers into groups (and says so)
MAX_LAYER_LANES = 16

HOST_LANES = ("host", "program correction", "PCIe")


def collective_lane(card: int) -> str:
    """The display lane of one card's collectives."""
    return f"card {card} collectives"


def _lane_of(event: TraceEvent) -> str | None:
    lane = event.lane.split("@")[0]
    if lane == "host":
        return "host"
    if lane == "host.callback":
        return "program correction"
    if lane.startswith("pcie"):
        return "PCIe"
    if lane.startswith("stream"):
        return "device"
    card = card_of_lane(lane)
    return collective_lane(card) if card is not None else None


def layer_of_kernels(kernels: Sequence[TraceEvent]) -> list[int]:
    """Layer lane of each device kernel, in time order: a new lane starts where an attention starts.

    The engine's attention begins with the paged KV write (``index_copy``, one for K and one for V; or is one
    ``paged attention L<i>`` kernel that writes the KV itself), so lane 0
    holds what runs before the first attention (embedding, first norm, QKV) and lane ``i + 1`` holds layer ``i``'s
    attention, o_proj and MLP up to the next layer's QKV (the last lane ends with the final norm and the head).
    """
    lanes, layer, in_write = [], 0, False
    for e in kernels:
        is_write = "index_copy" in e.name or e.name.startswith("paged attention")
        if is_write and not in_write:
            layer += 1
        in_write = is_write
        lanes.append(layer)
    return lanes


def _host_color(event: TraceEvent) -> str:
    if event.name.startswith("wait"):
        return style.UNIT_COLORS["idle"]
    if event.name.startswith("rebuild"):
        return style.REBUILD_COLOR
    if event.args.get("fallback"):
        return style.UNIT_COLORS["pcie"]
    return style.UNIT_COLORS["host"]


def step_lanes(trace: Trace) -> tuple[dict[str, list[tuple[TraceEvent, str]]], list[str]]:
    """The step's events grouped by display lane (with a color each), and the lane order top to bottom."""
    t0 = trace.start_us
    lanes: dict[str, list[tuple[TraceEvent, str]]] = {name: [] for name in HOST_LANES}
    kernels = []
    cards: dict[str, list[tuple[TraceEvent, str]]] = {}
    for e in sorted(trace.events, key=lambda e: e.start_us):
        lane = _lane_of(e)
        if lane is None:
            continue
        e = TraceEvent(e.lane, e.name, e.start_us - t0, e.dur_us, e.args)
        if lane == "device":
            kernels.append(e)
        elif lane == "PCIe":
            lanes[lane].append((e, style.UNIT_COLORS["pcie"]))
        elif card_of_lane(e.lane) is not None:
            cards.setdefault(lane, []).append((e, style.UNIT_COLORS["link"]))
        else:
            lanes[lane].append((e, _host_color(e)))
    layers = layer_of_kernels(kernels)
    top = max(layers, default=0)
    group = max(1, -(-(top + 1) // MAX_LAYER_LANES))
    names = []
    for e, layer in zip(kernels, layers):
        g = layer // group
        if group == 1:
            name = "embed" if g == 0 else f"L{g - 1}"
        else:
            name = f"lanes {g * group}-{g * group + group - 1}"
        if name not in lanes:
            lanes[name] = []
            names.append(name)
        lanes[name].append((e, style.kernel_color(e.name)))
    by_card = sorted(cards, key=lambda name: int(name.split()[1]))
    lanes.update(cards)
    order = [n for n in HOST_LANES if lanes[n]] + names + by_card
    return lanes, order
