"""The tensor-parallel section of ``spyre-lab reproduce`` as a Markdown table, from its JSON alone.

Kept apart from :mod:`~spyre_lab.studies.tensor_parallel` (which runs the study and so loads the compiler
and the engine) so that rendering a cached result loads neither.
"""

from __future__ import annotations


def section_table(section: dict) -> list[str]:
    """The section's rows as a Markdown table (modeled step times, speed-up over TP 1, collective share)."""
    base = {(r["kind"], r["size"]): r["step_us"] for r in section["rows"] if r["tp"] == 1}
    out = ["| step | TP | compute | collectives | step time | speed-up | collective share | weights per card |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in section["rows"]:
        out.append(f"| {r['kind']} {r['size']} | {r['tp']} | {r['compute_us'] / 1e3:,.1f} ms | "
                   f"{r['collective_us'] / 1e3:,.1f} ms | {r['step_us'] / 1e3:,.1f} ms | "
                   f"{base[(r['kind'], r['size'])] / r['step_us']:.2f}x | {r['collective_share']:.1%} | "
                   f"{r['weight_bytes_per_card'] / 1e9:.2f} GB |")
    return out
