"""Point labels that never sit on each other: each label moves off its marker, on a leader line, to free room.

Plotly's ``textposition`` puts every marker's label in the same spot relative to the marker, so kernels at the same
(or a close) point stack their labels into one unreadable blot, and five kernels look like two. Here a label is an
annotation offset in pixels from its point, chosen greedily from a ring of candidate offsets around the marker
(nearest first) so that its box overlaps no other label, no marker and stays inside the plot. The pixel model is
the figure's own: its axis ranges, margins and a width (``FIT_WIDTH``, the width of the stored pictures);
a wider figure only spreads the points further apart.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

FIT_WIDTH = 700
"""Figure width (px) labels are fitted to."""
CHAR_PX = 0.6
"""Width of one label character as a fraction of the font size (Helvetica / Arial average)."""
_ANGLES = (-90, -45, -135, 0, 180, 45, 135, 90, -67.5, -112.5, -22.5, -157.5, 22.5, 157.5, 67.5, 112.5)
_GAPS = (8, 22, 40, 62, 90)


@dataclass(frozen=True)
class Box:
    """An axis-aligned box in figure pixels (y grows downwards)."""

    x0: float
    y0: float
    x1: float
    y1: float

    def overlaps(self, other: Box) -> float:
        """The area two boxes share (0 when they only touch)."""
        w = min(self.x1, other.x1) - max(self.x0, other.x0)
        h = min(self.y1, other.y1) - max(self.y0, other.y0)
        return w * h if w > 0 and h > 0 else 0.0


def text_box(cx: float, cy: float, text: str, font_size: float) -> Box:
    """The box of a one-line label centred at (cx, cy), with a 2 px pad."""
    w = len(text) * font_size * CHAR_PX + 4
    h = font_size * 1.25 + 4
    return Box(cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2)


def place_labels(points: Sequence[tuple[float, float]], radii: Sequence[float], texts: Sequence[str],
                 area: Box, font_size: float, obstacles: Sequence[Box] = ()) -> list[tuple[float, float]]:
    """Pixel offsets (dx, dy) from each point to its label's centre, so no two labels overlap and no label covers
    a marker (each marker a square of side ``2 * radius``), an obstacle (another label of the figure) or leaves
    ``area``. Big markers are placed first; when no candidate is free the least-overlapping one is taken."""
    markers = [Box(x - r, y - r, x + r, y + r) for (x, y), r in zip(points, radii)] + list(obstacles)
    placed: list[Box] = []
    offsets: list[tuple[float, float]] = [(0.0, 0.0)] * len(points)
    for i in sorted(range(len(points)), key=lambda i: -radii[i]):
        (x, y), r = points[i], radii[i]
        best: tuple[float, tuple[float, float], Box] | None = None
        for gap in _GAPS:
            for angle in _ANGLES:
                half = text_box(0, 0, texts[i], font_size)
                # the box's edge (not its centre) sits ``gap`` px beyond the marker, in the direction ``angle``
                ux, uy = math.cos(math.radians(angle)), math.sin(math.radians(angle))
                reach = r + gap + abs(ux) * (half.x1 - half.x0) / 2 + abs(uy) * (half.y1 - half.y0) / 2
                dx, dy = ux * reach, uy * reach
                box = text_box(x + dx, y + dy, texts[i], font_size)
                cost = sum(box.overlaps(b) for b in placed) + sum(box.overlaps(m) for m in markers)
                outside = max(area.x0 - box.x0, 0) + max(box.x1 - area.x1, 0) + max(area.y0 - box.y0, 0) + \
                    max(box.y1 - area.y1, 0)
                cost += 1000 * outside
                if best is None or cost < best[0]:
                    best = (cost, (dx, dy), box)
                if cost == 0:
                    break
            if best is not None and best[0] == 0:
                break
        assert best is not None
        offsets[i] = best[1]
        placed.append(best[2])
    return offsets


def label_boxes(points: Sequence[tuple[float, float]], offsets: Sequence[tuple[float, float]],
                texts: Sequence[str], font_size: float) -> list[Box]:
    """The label boxes :func:`place_labels` chose (for tests and for figures that check their own layout)."""
    return [text_box(x + dx, y + dy, t, font_size) for (x, y), (dx, dy), t in zip(points, offsets, texts)]
