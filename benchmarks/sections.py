"""Command line of every benchmark script: ``--help`` lists its sections and options; run all or some.

    .venv/bin/python benchmarks/bench_kernels.py --help      # what it measures, its sections and options
    .venv/bin/python benchmarks/bench_kernels.py matmul mlp  # two sections (by name or by number)
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence


def first_line(fn: Callable) -> str:
    doc = getattr(fn, "func", fn).__doc__  # a functools.partial documents its function
    return doc.strip().splitlines()[0] if doc else ""


def parser(doc: str | None, sections: dict[str, Callable]) -> argparse.ArgumentParser:
    """An argument parser whose help is the script's docstring plus one line per section."""
    listing = "\n".join(f"  {i}. {name:<14} {first_line(fn)}" for i, (name, fn) in enumerate(sections.items(), 1))
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=f"sections (default: all, in this order):\n{listing}")
    p.add_argument("sections", nargs="*", metavar="SECTION",
                   help="sections to run, by name or number (default: all)")
    return p


def chosen(names: Sequence[str], sections: dict[str, Callable]) -> list[str]:
    """The section names asked for (numbers accepted), in the script's order; an error names the valid ones."""
    order = list(sections)
    picked = set()
    for name in names:
        for part in name.replace(",", " ").split():
            if part.isdigit() and 1 <= int(part) <= len(order):
                picked.add(order[int(part) - 1])
            elif part in sections:
                picked.add(part)
            else:
                raise SystemExit(f"unknown section {part!r}; choose from "
                                 + ", ".join(f"{i} {n}" for i, n in enumerate(order, 1)))
    return [n for n in order if n in picked] if picked else order
