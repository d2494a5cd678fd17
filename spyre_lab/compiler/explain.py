"""A Program as text: graph -> kernels (rule, ops) -> work division -> LX plan -> modeled times, plus cache status."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from spyre_lab.compiler.ir import Fallback
from spyre_lab.compiler.kernel_spec import KernelSpec
from spyre_lab.compiler.program import HostFallback, Launch, Program, UnplannedSpec


class Explanation(str):
    """The explanation text; prints as plain text in a terminal and as a preformatted block in notebooks."""

    def _repr_html_(self) -> str:
        import html

        return f"<pre style='font-size:12px'>{html.escape(str(self))}</pre>"

    def __repr__(self) -> str:
        return str(self)


def _division_line(launch: Launch) -> str:
    if not isinstance(launch, KernelSpec):
        return ""
    division = launch.division
    splits = " x ".join(f"{d}:{n}" for d, n in division.splits.items() if n > 1) or "one core"
    return f"      division [{division.strategy}] {splits} on {division.cores_used} cores -- {division.reason}"


def _lx_line(launch: Launch) -> str:
    if not isinstance(launch, KernelSpec):
        return ""
    plan = launch.lx_plan
    return (f"      LX plan [{plan.strategy}] peak {plan.peak:,} of {plan.budget:,} B per core "
            f"({len(plan.offsets)} buffers)")


STAGES = ("stages: make_fx + decompositions (AOTAutograd inference) -> lowering (GraphLowering) -> layouts "
          "(propagate_spyre_tensor_layouts, insert_restickify) -> fusion (Scheduler, spyre_fuse_nodes) -> codegen "
          "(work division, scratchpad planning, SuperDSC) -> intermediates pool (memory_planning)")


def explain_program(program: Program, mode: str | None = None) -> Explanation:
    mode = mode or program.options.timing
    lines = [f"Program {program.name}: {program.aten_ops} ATen ops -> {program.unfused_kernels} LoopIR nodes -> "
             f"{len(program.launches)} kernels  [{program.cache_note}; compiled in {program.compile_ms:.0f} ms]",
             f"  {STAGES}"]
    lines.append(f"  inputs: {', '.join(f'{b}{list(program.buffers[b].shape)}' for b in program.inputs)}")
    lines.append(f"  outputs: {', '.join(r.describe() for r in program.outputs)}")
    lines.append(f"  fusion rules on: {', '.join(sorted(program.options.fusion)) or 'none'}; "
                 f"work division: {program.options.work_division}")
    if program.restickifies:
        lines.append("  layouts (restickify where producer and consumer disagree):")
        for r in program.restickifies:
            when = "folded at compile time" if r.at_compile_time else "kernel"
            lines.append(f"    {r.source} -> {r.buffer} for {r.consumer}: {r.reason} ({when})")
    if program.fallback_ops:
        lines.append(f"  host fallbacks: {', '.join(program.fallback_ops)}")
    lines.append("  kernels (modeled times):")
    total = 0.0
    by_rule: dict[str, list[float]] = {}
    for i, (launch, kernel) in enumerate(zip(program.launches, program.kernels)):
        ops = " -> ".join(n.op for n in kernel.nodes)
        if isinstance(launch, HostFallback):
            node = kernel.nodes[0]
            lines.append(f"  [{i:2d}] HOST   {ops}  ({node.reason if isinstance(node, Fallback) else ''})")
            continue
        timing = ""
        if not isinstance(launch, UnplannedSpec):
            sim = launch.simulate(mode)
            total += sim.time_us
            by_rule.setdefault(kernel.rule, []).append(sim.time_us)
            timing = f"  {sim.time_us:8.2f} us modeled ({sim.bottleneck})"
        lx = f"  LX-resident: {', '.join(kernel.lx_resident)}" if kernel.lx_resident else ""
        lines.append(f"  [{i:2d}] {kernel.rule:<16} {ops}{timing}")
        lines.append(f"        DRAM in: {', '.join(kernel.inputs)}  out: {', '.join(kernel.outputs)}{lx}")
        if kernel.decision:
            lines.append(f"        fusion choice: {kernel.decision}")
        for extra in (_division_line(launch), _lx_line(launch)):
            if extra:
                lines.append("  " + extra)
        if isinstance(launch, UnplannedSpec):
            lines.append(f"        (no tile plan: {launch.error})")
    lines.append(f"  intermediates pool: {program.pool_bytes:,} B for {len(program.dram_plan)} DRAM intermediates")
    if total:
        lines.append(f"  total device time: {total:.2f} us modeled ({mode})")
        shares = sorted(by_rule.items(), key=lambda kv: -sum(kv[1]))
        lines.append("  by rule: " + ", ".join(f"{rule} {len(ts)}x {sum(ts):.1f} us ({sum(ts) / total:.0%})"
                                              for rule, ts in shares))
    return Explanation("\n".join(lines))


KERNEL_FAMILY_EXPLAINERS: list[Callable[[], str]] = []
"""Explainers of the kernel families planned per launch outside any Program (paged attention: one spec per launch
shape); each returns its kernels' text, or "" when none ran. :func:`explain` appends what they return."""


def ktir_section(program: Program) -> str:
    """Each planned kernel's LoopIR nodes, then its KTIR (or why it is not written out)."""
    from spyre_lab.compiler.ktir_errors import KTIRUnsupported

    parts = [f"KTIR of {program.name}:"]
    for launch, kernel in zip(program.launches, program.kernels):
        if not isinstance(launch, KernelSpec):
            continue
        loopir = "\n".join(f"//   {n.output} = {n.op}({', '.join(n.inputs)}) over {dict(n.dims)}" for n in kernel.nodes)
        try:
            text = launch.to_ktir(kernel.nodes)
        except KTIRUnsupported as e:
            text = f"// {e}"
        parts.append(f"// LoopIR of {launch.name}:\n{loopir}\n{text}")
    return "\n\n".join(parts)


def collectives_section(collectives: Sequence[Any]) -> str:
    """The collectives a step runs, identical ones counted once: name, algorithm, bytes, modeled µs and link.

    ``collectives`` are :class:`~spyre_lab.distributed.algorithms.CollectiveCost` records: a spyreccl group's
    ``history``, or a step's from :func:`spyre_lab.studies.tensor_parallel.step_collectives`. "" when empty."""
    if not collectives:
        return ""
    counted: dict[tuple, int] = {}
    for c in collectives:
        key = (c.op, c.algorithm, c.nbytes, c.world_size, c.rounds, c.round_bytes, c.us, c.link)
        counted[key] = counted.get(key, 0) + 1
    total = sum(c.us for c in collectives)
    lines = [f"  collectives ({len(collectives)}, modeled; spyreccl is synchronous, so they add to the step):"]
    for (op, algorithm, nbytes, world, rounds, round_bytes, us, link), n in counted.items():
        lines.append(f"    {n:>4}x {op:<10} [{algorithm}] {nbytes:>12,} B over {world} cards: {rounds} rounds x "
                     f"{round_bytes:,.0f} B on {link} = {us:8.2f} us each, {n * us:,.2f} us")
    lines.append(f"  collectives total: {total:,.2f} us modeled")
    return "\n".join(lines)


COLLECTIVE_SOURCES: list[Callable[[], list[Any]]] = []
"""Where this process's modeled collectives come from: ``spyre_lab.distributed`` registers its default group's
history when imported (a layer above the compiler, so it comes to explain(), not the reverse)."""


def group_collectives() -> list[Any]:
    """The modeled collectives of this process's default spyreccl group (empty without one)."""
    return [c for source in COLLECTIVE_SOURCES for c in source()]


def explain(what: Program | Sequence[Program], mode: str | None = None, ktir: bool = False,
            collectives: Sequence[Any] | None = None) -> Explanation:
    """Explain one Program or several (the pieces of one model), their collectives, and the program cache's counts.

    ``collectives`` lists the modeled collectives the step runs (``CollectiveCost`` records); by default, those the
    process's spyreccl group has run, if it has one. ``spyre_lab.explain(model)`` finds the Programs compiled for
    a ``torch.compile``d model and lands here."""
    from spyre_lab.compiler import cache

    programs = [what] if isinstance(what, Program) else list(what) if isinstance(what, Sequence) else []
    if not programs or not all(isinstance(p, Program) for p in programs):
        raise TypeError(f"compiler.explain takes a Program (or a list of them), got {type(what).__name__}; "
                        "for a model compiled with torch.compile(backend='spyre') use spyre_lab.explain(model)")
    families = [text for text in (f() for f in KERNEL_FAMILY_EXPLAINERS) if text]
    per_program = (explain_program(p, mode) + (f"\n\n{ktir_section(p)}" if ktir else "") for p in programs)
    ccl = collectives_section(group_collectives() if collectives is None else collectives)
    text = "\n\n".join([*per_program, *families, *([ccl] if ccl else [])])
    stats = cache.stats()
    return Explanation(f"{text}\n  program cache: {stats['hits']} hits, {stats['misses']} misses, "
                       f"{stats['compiles']} compiles")
