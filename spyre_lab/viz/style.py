"""One visual language for every view: a color per hardware unit, a stable color per kernel.

A learner moves between views (dataflow, fusion, roofline, decode timeline); a load is the same
blue and a kernel keeps its color everywhere, so the eye carries meaning from one figure to the next.
This module holds data only (no plotly import), so tests and non-plotting code can read it.
"""

from __future__ import annotations

import hashlib
import re

#: One color per unit of work. Core units follow the tile pipeline: load -> PT (matmul) -> SFU -> store.
UNIT_COLORS: dict[str, str] = {
    "load": "#4C78A8",    # DRAM -> LX
    "pt": "#E45756",      # PE array (systolic matmul)
    "sfu": "#F58518",     # vector / special-function unit
    "store": "#54A24B",   # LX -> DRAM
    "ring": "#B279A2",    # core-to-core ring
    "host": "#9D755D",    # host CPU work (program correction, scheduling, sampling)
    "pcie": "#79706E",    # host <-> device copies
    "link": "#72B7B2",    # card-to-card link (spyreccl collectives)
    "engine": "#BAB0AC",  # engine step bookkeeping
    "idle": "#EEEEEE",
}

#: Qualitative palette for kernels (the Tableau 20 colors). The first six avoid the hues of the units a kernel is
#: drawn beside (load blue, PT red, SFU orange, store green), so a program of a few kernels never has one that
#: reads as a DRAM ceiling or a load lane; the unit-like hues come after.
KERNEL_PALETTE: tuple[str, ...] = (
    "#17BECF", "#9467BD", "#BCBD22", "#E377C2", "#8C564B", "#7F7F7F", "#1F77B4", "#FF7F0E",
    "#2CA02C", "#D62728", "#9EDAE5", "#C5B0D5", "#DBDB8D", "#F7B6D2", "#C49C94", "#C7C7C7",
    "#AEC7E8", "#FFBB78", "#98DF8A", "#FF9896",
)

MODELED_TIME_AXIS = "modeled time (µs)"
WALL_TIME_AXIS = "wall time (ms)"

_CORE_LANE = re.compile(r"core(\d+)\.(\w+)")


def lane_unit(lane: str) -> str:
    """The unit a trace lane belongs to: ``core3.pt`` -> ``pt``, ``pcie.h2d`` -> ``pcie``."""
    m = _CORE_LANE.fullmatch(lane)
    if m:
        return m.group(2)
    for unit in ("host", "pcie", "ring", "engine"):
        if lane.startswith(unit):
            return unit
    return "link" if lane.startswith("card") and lane.endswith(".ccl") else "engine"


def unit_color(lane_or_unit: str) -> str:
    """Color of a lane's unit (accepts a lane name or a unit name)."""
    return UNIT_COLORS.get(lane_or_unit) or UNIT_COLORS[lane_unit(lane_or_unit)]


_KERNEL_INDEX = re.compile(r"k(\d+)_")


def kernel_color(kernel: str | int) -> str:
    """A kernel's color, the same in every view and every run.

    A compiled kernel is named ``k<i>_<rule>_<ops>`` by its position ``i`` in its Program, and that position
    picks the palette entry: every view of a program draws its kernels in distinct colors (up to the palette's
    20), and ``k3_softmax`` is the same color in FusionView, DataflowView, Roofline and DecodeTimeline. (A hash of
    the name would let two kernels of one program collide.) An integer is a position; any other name is hashed.
    """
    if isinstance(kernel, int):
        return KERNEL_PALETTE[kernel % len(KERNEL_PALETTE)]
    m = _KERNEL_INDEX.match(kernel)
    if m:
        return KERNEL_PALETTE[int(m.group(1)) % len(KERNEL_PALETTE)]
    digest = hashlib.blake2s(kernel.encode(), digest_size=2).digest()
    return KERNEL_PALETTE[int.from_bytes(digest, "big") % len(KERNEL_PALETTE)]


#: Measured host phases of one engine step (wall clock), light to dark in step order.
HOST_PHASE_COLORS: dict[str, str] = {
    "schedule": "#D8C3A5",
    "prepare inputs": "#B89B72",
    "forward": "#9D755D",
    "sample": "#5E4634",
}

#: The host rebuilding a launch's execution graph (``RuntimeOptions(dispatch="rebuild")``).
REBUILD_COLOR = "#8C2D04"

#: Engine step kinds, and the padding a static-shape bucket adds.
STEP_KIND_COLORS: dict[str, str] = {
    "prefill": "#72B7B2",
    "decode": "#EECA3B",
    "mixed": "#B279A2",  # decode rows and prefilled prompts in one pass (the cpu platform's mixed steps)
    "warmup-prefill": "#C6E3E1",
    "warmup-decode": "#F7E6A6",
    "padding": "#D9D9D9",
}

#: KV-cache block states (a used block takes its request's color instead).
KV_STATE_COLORS: dict[str, str] = {
    "free": "#F2F2F2",
    "cached": "#C7E9C0",   # free, but holds a full hashed block a new request can reuse
    "used": "#6B6ECF",     # held (when no per-request color applies)
}

#: Requests (batch composition, block tables); a pastel set so requests never look like kernels.
REQUEST_PALETTE: tuple[str, ...] = (
    "#8DD3C7", "#BEBADA", "#FB8072", "#80B1D3", "#FDB462", "#B3DE69", "#FCCDE5", "#BC80BD",
    "#CCEBC5", "#FFED6F", "#A6CEE3", "#FDBF6F",
)

#: Baseline vs changed configuration (what-if comparisons).
BASELINE_COLOR = "#9A9A9A"
CHANGED_COLOR = "#E45756"


def request_color(request_id: str | int) -> str:
    """A request's color: by number when the id is an integer string (request 0, 1, ...), else hashed."""
    text = str(request_id)
    if text.isdigit():
        return REQUEST_PALETTE[int(text) % len(REQUEST_PALETTE)]
    digest = hashlib.blake2s(text.encode(), digest_size=2).digest()
    return REQUEST_PALETTE[int.from_bytes(digest, "big") % len(REQUEST_PALETTE)]


def core_color(core: int, cores: int = 32) -> str:
    """A core's color in views that color work by core: hues in core order, so ring neighbours look related.

    The hue runs over 85% of the wheel (core 0 red, the last core violet) rather than all of it, so the
    first and last cores never look alike.
    """
    import colorsys

    h = 0.85 * (core % max(cores, 1)) / max(cores - 1, 1)
    r, g, b = colorsys.hls_to_rgb(h, 0.55, 0.62)
    return f"#{round(r * 255):02X}{round(g * 255):02X}{round(b * 255):02X}"


#: Sequential scale for "where in device memory" (address order), dark = low address (Viridis stops).
ADDRESS_SCALE: tuple[str, ...] = ("#440154", "#482878", "#3E4A89", "#31688E", "#26828E", "#1F9E89", "#35B779",
                                  "#6ECE58", "#B5DE2B", "#FDE725")
#: Device positions that hold no host value (stick padding).
PADDING_COLOR = "#D0D0D0"
#: The one element a view follows across panels.
FOLLOW_COLOR = "#E4002B"

#: Neutral chrome: text, edges, bands and cursors that carry no unit or kernel meaning.
NEUTRAL: dict[str, str] = {
    "text": "#333333",
    "muted": "#666666",
    "cursor": "#222222",
    "edge_lx": "#555555",      # a FusionView edge that stays in LX
    "edge_dram": "#B0B0B0",    # a FusionView edge through DRAM
    "rule": "#BBBBBB",         # reference lines (ridge, capacity)
    "header": "#F0F0F0",       # table headers
    "band": "rgba(255,215,0,0.18)",   # the selected core's rows
    "white": "#FFFFFF",
}

#: Engine replicas behind a router (RouterView): muted, distinct from units, kernels and requests.
REPLICA_PALETTE: tuple[str, ...] = ("#3B6FB6", "#D1495B", "#2E933C", "#8E5DB8", "#E08E0B", "#2A9D8F")


def replica_color(index: int) -> str:
    """The color of the ``index``-th replica of a fleet (in the order the router lists them)."""
    return REPLICA_PALETTE[index % len(REPLICA_PALETTE)]
