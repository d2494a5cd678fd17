"""Which physical mechanism could close the one-core ladder's gaps? Each one, at a few strengths, on ``measured``.

The issue names the mechanisms a calibrated model may gain: a fixed per-kernel (bundle) cost, a per-core DMA
ceiling, partial compute/memory overlap. Before adopting one, this probe runs each at a few strengths on the
``measured`` machine and evaluates the points it must serve at once: the one-core ladder (the worst rung), the
4-core run against the best one-core rung (the card: 32.17 / 23.67 = 1.36x), and the 32-core softmax and exp of
torch-spyre's fitted model (which fits no fixed term). A mechanism is adopted only if it brings the ladder in
without breaking the 32-core points; ``docs/fidelity.md`` prints the table, so the reason none is adopted is
the model's own output, not a sentence.
"""

from __future__ import annotations

from typing import Any

import torch

from spyre_lab.compiler import CompileOptions
from spyre_lab.device.config import MEASURED, SpyreConfig
from spyre_lab.studies.claims import SOFTMAX_LADDER, SOFTMAX_SHAPE
from spyre_lab.studies.kernels import measure, softmax

FOUR_OVER_ONE_ON_CARD = 32.17 / 23.67
"""The card's 4-core time over its best one-core time on softmax 512x1024 (the scratchpad-planning study)."""

BIG_SOFTMAX_US, BIG_EXP_US = 320.0, 320.0
"""torch-spyre's fitted times of softmax and exp on 4096x2048 over 32 cores (restated in ``studies.fidelity``)."""

PROBES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("none (measured as it is)", {}),
    ("fixed per-bundle cost 2 us", {"kernel_launch_cycles": 3000}),
    ("fixed per-bundle cost 4 us", {"kernel_launch_cycles": 6000}),
    ("fixed per-bundle cost 8 us", {"kernel_launch_cycles": 12000}),
    ("per-core DMA ceiling 96 GB/s", {"core_dma_bytes_per_cycle": 64}),
    ("per-core DMA ceiling 48 GB/s", {"core_dma_bytes_per_cycle": 32}),
)
"""Each candidate mechanism at a few strengths: the ``SpyreConfig`` fields that carry it, on top of ``measured``."""


def _exp(x: torch.Tensor) -> torch.Tensor:
    return torch.exp(x)


def probe(cfg: SpyreConfig) -> dict[str, float]:
    """The ladder's worst rung error, the 4-core/1-core ratio and the 32-core errors (percent) on ``cfg``."""
    one = cfg.replace(cores=1)
    rungs = [(measure(softmax, [SOFTMAX_SHAPE], CompileOptions(**flags), one).time_us, published)
             for _label, flags, published in SOFTMAX_LADDER]
    four = measure(softmax, [SOFTMAX_SHAPE], CompileOptions(), cfg.replace(cores=4)).time_us
    big = measure(softmax, [(4096, 2048)], CompileOptions(), cfg).time_us
    exp = measure(_exp, [(4096, 2048)], CompileOptions(), cfg).time_us
    return {"worst_rung_pct": max(abs(t / ref - 1) * 100 for t, ref in rungs),
            "first_rung_pct": (rungs[0][0] / rungs[0][1] - 1) * 100,
            "last_rung_pct": (rungs[-1][0] / rungs[-1][1] - 1) * 100,
            "four_over_one": four / rungs[-1][0],
            "softmax_32_pct": (big / BIG_SOFTMAX_US - 1) * 100,
            "exp_32_pct": (exp / BIG_EXP_US - 1) * 100}


def probes() -> list[dict[str, Any]]:
    """Every probe on ``measured``: the mechanism, its fields and what it does to each point."""
    return [{"mechanism": name, "fields": fields, **probe(MEASURED.replace(**fields))} for name, fields in PROBES]


def to_markdown(rows: list[dict[str, Any]]) -> list[str]:
    """The probe table for docs/fidelity.md, then what it shows."""
    lines = ["## Mechanisms tried", "",
             "Each candidate mechanism on top of `measured` (modeled, analytic simulator). Goal: every rung within "
             f"10%, 4 cores over 1 core above 1 (the card: {FOUR_OVER_ONE_ON_CARD:.2f}x), the 32-core points within "
             "their bands.", "",
             "| mechanism | worst rung | rung 1 | rung 4 | 4 cores / 1 core | softmax 32 cores | exp 32 cores |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['mechanism']} | {r['worst_rung_pct']:.1f}% | {r['first_rung_pct']:+.1f}% | "
                     f"{r['last_rung_pct']:+.1f}% | {r['four_over_one']:.2f}x | {r['softmax_32_pct']:+.1f}% | "
                     f"{r['exp_32_pct']:+.1f}% |")
    base = rows[0]
    never_below = all(r["first_rung_pct"] >= base["first_rung_pct"] - 0.05 for r in rows)
    never_flips = all(r["four_over_one"] < 1 for r in rows)
    fixed = [r for r in rows if "kernel_launch_cycles" in r["fields"]]
    strongest = max(fixed, key=lambda r: r["fields"]["kernel_launch_cycles"])
    lines += ["",
              f"- Every mechanism {'only adds' if never_below else 'can remove'} time: rung 1 is "
              f"{base['first_rung_pct']:+.1f}% with none of them and "
              f"{'never gets closer' if never_below else 'gets closer'}, because the plan's own DRAM bytes at the "
              "fitted rate already take longer than the card did. No fixed cost, ceiling or overlap can remove "
              "bytes; only a different plan (fewer intermediates through DRAM) could.",
              f"- 4 cores stay {'faster' if never_flips else 'not always faster'} than 1 under every probe: a fixed "
              "per-bundle cost is paid alike at 1 and 4 cores, and a per-core DMA ceiling slows one core (one "
              "engine) more than four. Making 4 cores slower needs a cost that grows with the cores a kernel "
              "spreads over, which torch-spyre's fit does not find at 32 cores.",
              f"- The strongest fixed cost tried ({strongest['mechanism']}) moves the 4-core ratio only from "
              f"{base['four_over_one']:.2f}x to {strongest['four_over_one']:.2f}x while it pushes the last rung, which "
              f"is within {abs(base['last_rung_pct']):.1f}% without it, to {strongest['last_rung_pct']:+.1f}%; so "
              "`measured` adopts none of them and keeps torch-spyre's fitted intercept of about 0.", ""]
    return lines
