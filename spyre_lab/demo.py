"""``make demo``: the main job on the modeled device, with a report."""

from __future__ import annotations

from spyre_lab.device.config import SPYRE


def run_demo(out_dir: str = "out") -> int:
    print(SPYRE.describe())
    return 0
