"""Where every view finds its data: one function per kind of input, over the compiler's and engine's public types.

A view takes whatever the learner has in hand (a compiled ``Program``, a model compiled with
``torch.compile(backend="spyre")``, a ``KernelSpec``, a simulator result, an engine, or a saved JSON file) and
turns it into the one data object it draws. These functions are that turning, in one place, so each view reads
the same source the same way and says the same thing when it cannot:

* :func:`as_program` -> ``Program`` (Roofline, WorkDivisionView, FusionView, WhatIf);
* :func:`as_recompilable` -> a ``Program`` plus the function and inputs that recompile it (FusionView);
* :func:`as_trace` -> a ``Trace`` per timing mode (DataflowView);
* :func:`as_stats` / :func:`as_run` -> ``EngineStats`` / a :class:`Run` (DecodeTimeline, KVCacheView);
* :func:`symmetric_cards` -> a trace with every card of a tensor-parallel group's collectives (DecodeTimeline);
* :func:`timed_launches` / :func:`is_timed` -> the launches of a program that the simulators time (``KernelSpec``);
* :class:`SavedSpec` -> what a view reads of a ``KernelSpec``, rebuilt from a saved program (WorkDivisionView).

Only public names of the lower layers are read here; a view never reaches into another layer's private members.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spyre_lab.device.config import SPYRE, SpyreConfig, get_config
from spyre_lab.device.trace import Trace, TraceEvent, card_of_lane

if TYPE_CHECKING:
    from spyre_lab.compiler.ir import NodeGroup
    from spyre_lab.compiler.kernel_spec import KernelSpec
    from spyre_lab.compiler.program import Program
    from spyre_lab.compiler.scratchpad import LXPlan
    from spyre_lab.engine.stats import EngineStats, StepDetail


# ---- programs -------------------------------------------------------------------------------------------
def is_saved_program(obj: Any) -> bool:
    """A program saved with ``Program.save_json`` and read back as a dict."""
    return isinstance(obj, dict) and "launches" in obj


def is_program(obj: Any) -> bool:
    """A live ``Program`` or a saved one."""
    from spyre_lab.compiler.program import Program

    return isinstance(obj, Program) or is_saved_program(obj)


def program_name(source: Any) -> str:
    return str(source["name"] if isinstance(source, dict) else source.name)


def device_config(source: Any) -> SpyreConfig:
    """The SpyreConfig a program was compiled for (a saved program stores it under ``device``)."""
    if isinstance(source, dict):
        saved = source.get("device")
        if not saved:
            return SPYRE
        known = {f.name for f in fields(SpyreConfig)}
        return SpyreConfig(**{k: v for k, v in saved.items() if k in known})
    return source.cfg


def fusion_rules() -> tuple[str, ...]:
    """The compiler's fusion rule names, in its order (``compiler.options.FUSION_RULES``)."""
    from spyre_lab.compiler.options import FUSION_RULES

    return tuple(FUSION_RULES)


def is_timed(launch: Any) -> bool:
    """A launch the simulators time: a planned device kernel (``KernelSpec``), not a host fallback or an
    unplanned kernel."""
    from spyre_lab.compiler.kernel_spec import KernelSpec

    return isinstance(launch, KernelSpec)


def is_host(launch: Any) -> bool:
    """A launch that runs on the host CPU (``HostFallback``)."""
    from spyre_lab.compiler.program import HostFallback

    return isinstance(launch, HostFallback)


def timed_launches(program: Program) -> list[tuple[KernelSpec, NodeGroup]]:
    """Each planned device kernel of ``program`` with the node group it was planned from, in launch order."""
    return [(launch, group) for launch, group in zip(program.launches, program.kernels) if is_timed(launch)]


def compiled_programs(model: Any) -> list[tuple[Any, Program]]:
    """(compiled graph, Program) for every program ``torch.compile(model, backend="spyre")`` has built so far."""
    from spyre_lab.runtime.dynamo_backend import compiled_graphs_for

    return [(graph, program) for graph in compiled_graphs_for(model) for program in graph.all_programs()]


def as_program(source: Any, view: str = "this view") -> Program:
    """A ``Program``, or the largest program of a model compiled with ``torch.compile(backend="spyre")``."""
    from spyre_lab.compiler.program import Program

    if isinstance(source, Program):
        return source
    programs = [program for _, program in compiled_programs(source)] if callable(source) else []
    if not programs:
        raise TypeError(f"{view} takes a Program or a compiled model that has run once (torch.compile is lazy), "
                        f"got {type(source).__name__}")
    return max(programs, key=lambda p: p.num_kernels)


@dataclass
class Recompilable:
    """A program with what it takes to compile it again under other options (a saved program has neither)."""

    program: Program | None
    saved: dict[str, Any] | None = None
    fn: Callable | None = None
    inputs: list[Any] | None = None

    @property
    def can_recompile(self) -> bool:
        return self.saved is None and self.fn is not None and self.inputs is not None


def as_recompilable(source: Any, example_inputs: Sequence[Any] | None = None, fn: Callable | None = None,
                    view: str = "FusionView") -> Recompilable:
    """``source`` as a program and, where they can be found, the function and inputs it was compiled from.

    ``source`` is a Program (its function is found in the program cache, its inputs rebuilt as meta tensors),
    a function or module with ``example_inputs`` (compiled here), a model compiled with ``torch.compile`` that has
    run (its largest graph, recompiled from the graph Dynamo captured) or a saved program dict (no recompiling).
    """
    from spyre_lab.compiler.program import Program

    inputs = list(example_inputs) if example_inputs is not None else None
    if isinstance(source, dict):
        if not is_saved_program(source):
            raise ValueError(f"{view}.from_json needs a saved program (Program.save_json)")
        return Recompilable(None, saved=source)
    if isinstance(source, Program):
        if inputs is None:
            import torch

            inputs = [torch.empty(s, dtype=d, device="meta") for s, d in source.input_shapes()]
        return Recompilable(source, fn=fn or kept_function(source), inputs=inputs)
    if inputs is not None and callable(source):
        from spyre_lab.compiler.backend import compile_graph

        return Recompilable(compile_graph(source, inputs), fn=source, inputs=inputs)
    if callable(source):
        found = [(graph, program) for graph, program in compiled_programs(source)]
        if not found:
            raise ValueError(f"nothing compiled for {type(source).__name__} yet: call the compiled model once "
                             f"(torch.compile is lazy), or pass {view}(fn, example_inputs)")
        graph, program = max(found, key=lambda gp: gp[1].num_kernels)
        graph_args = graph_inputs(graph, program)
        return Recompilable(program, fn=graph.gm if graph_args is not None else fn, inputs=graph_args)
    raise TypeError(f"{view} takes a Program, a compiled model, fn + example_inputs or a saved program, "
                    f"got {type(source).__name__}")


def graph_inputs(graph: Any, program: Program) -> list[Any] | None:
    """The arguments Dynamo passes the graph, as meta tensors and ints (symbolic sizes at their example values).

    None when they do not reproduce ``program``'s input shapes (then the program cannot be recompiled).
    """
    import torch
    from torch.fx.experimental.symbolic_shapes import guarding_hint_or_throw as hint_int

    out: list[Any] = []
    for node in graph.gm.graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta.get("example_value", node.meta.get("val"))
        if isinstance(val, torch.SymInt):
            out.append(hint_int(val))
        elif isinstance(val, torch.Tensor):
            shape = tuple(hint_int(d) for d in val.shape)
            out.append(torch.empty(shape, dtype=val.dtype, device="meta"))
        else:
            return None
    tensors = sorted((tuple(t.shape), str(t.dtype)) for t in out if isinstance(t, torch.Tensor))
    wanted = sorted((tuple(shape), str(dtype)) for shape, dtype in program.input_shapes())
    return out if all(w in tensors for w in wanted) else None


def kept_function(program: Program) -> Callable | None:
    """The function a Program was compiled from, if the program cache still holds it (None otherwise)."""
    from spyre_lab.compiler import cache

    entry = cache.peek(program.cache_key)
    if entry is None or entry[0] is not program:
        return None
    return entry[1]


class SavedSpec:
    """What the view reads of a KernelSpec, rebuilt from a saved program's SuperDSC (``KernelSpec.to_json``)."""

    def __init__(self, entry: dict[str, Any], cfg: Any, strategy: str) -> None:
        from spyre_lab.compiler.work_division import WorkDivision

        doc = entry["superdsc"]
        dsc = next(iter(doc["dscs_"][0].values()))
        self.dims: dict[str, int] = dict(dsc["N_"])
        splits = dict(doc["numWkSlicesPerDim_"])
        matmul = {"B", "M", "N", "K"} <= set(self.dims)
        reduction = ("K",) if matmul and entry.get("rule") != "mlp" else ()
        per_core = dsc["dataStageParam_"]["0"]["perCore_"]
        coords = {int(c): v for c, v in doc["coreIdToWkSlice_"].items()}
        division = WorkDivision(splits, (), strategy, "saved program: the split the compiler chose (replan it from "
                                "the Program)", None, reduction)
        order = sorted(coords, key=lambda c: division.slice_index(coords[c]))
        self.division = WorkDivision(splits, tuple(order), strategy, division.reason, None, reduction)
        # a slice starts where the earlier slices of its dim end (slices may be uneven: attention balances its rows)
        extent: dict[str, dict[int, int]] = {}
        for c, where in coords.items():
            for k, e in per_core[str(c)].items():
                extent.setdefault(k, {})[where.get(k, 0)] = e
        self.slices: list[dict[str, tuple[int, int]]] = [{} for _ in range(cfg.cores)]
        for c, where in coords.items():
            ext = per_core[str(c)]
            start = {k: sum(e for i, e in extent[k].items() if i < where.get(k, 0)) for k in ext}
            self.slices[c] = {k: (start[k], start[k] + ext[k]) for k in ext}


# ---- traces ---------------------------------------------------------------------------------------------
@dataclass
class TraceSource:
    """A source's trace in each timing mode it can give (built on first use) and the LX plans behind it."""

    name: str
    cfg: SpyreConfig
    default_mode: str
    builders: dict[str, Callable[[], Trace]]
    plans: dict[str, LXPlan] = field(default_factory=dict)   # kernel name -> the compiler's LX plan


def as_trace(source: Any, cfg: SpyreConfig | None = None, view: str = "DataflowView") -> TraceSource:
    """The traces of a ``Trace`` (as recorded), ``SimResult``, device ``TileProgram``, ``Program`` or ``KernelSpec``.

    A Program's device kernels are laid end to end as the executor lays them; a live source can be simulated
    in either mode, a recorded trace holds only the mode it was recorded in.
    """
    from spyre_lab.compiler.program import Program
    from spyre_lab.device.isa import TileProgram
    from spyre_lab.device.sim import SimResult, simulate

    if isinstance(source, Trace):
        # a runtime recording names no mode: tile-level events (with op indices) mean event timing
        tiles = any("idx" in e.args for e in source.events if e.lane.startswith("core"))
        mode = str(source.meta.get("mode") or ("event" if tiles else "analytic"))
        name = str(source.meta.get("kernel") or source.meta.get("program") or "trace")
        return TraceSource(name, cfg or config_named(source.meta.get("config")), mode, {mode: lambda: source})
    if isinstance(source, SimResult):
        sim = source
        if sim.trace is None:
            raise ValueError("this SimResult has no trace; simulate with trace=True")
        other = "event" if sim.mode == "analytic" else "analytic"
        builders = {sim.mode: lambda: sim.trace,
                    other: lambda: simulate(sim.kernel, sim.cfg, mode=other).trace}
        return TraceSource(sim.kernel.name, sim.cfg, sim.mode, builders)   # type: ignore[arg-type]
    if isinstance(source, TileProgram):
        conf = cfg or SPYRE
        return TraceSource(source.name, conf, "event",
                           {m: (lambda m=m: simulate(source, conf, mode=m).trace) for m in ("event", "analytic")})
    if isinstance(source, Program):
        launches = timed_launches(source)
        return TraceSource(source.name, source.cfg, "event",
                           {m: (lambda m=m: program_trace(source.name, launches, m)) for m in ("event", "analytic")},
                           {spec.name: spec.lx_plan for spec, _ in launches})
    if is_timed(source):
        return TraceSource(source.name, source.cfg, "event",
                           {m: (lambda m=m: program_trace(source.name, [(source, None)], m))
                            for m in ("event", "analytic")}, {source.name: source.lx_plan})
    if is_saved_program(source):
        raise ValueError("a saved program JSON holds no tile programs to simulate; save the run's trace "
                         "(trace.to_chrome_trace(path)) and open that, or pass the Program itself")
    raise TypeError(f"{view} takes a Trace, Program, KernelSpec, TileProgram or SimResult, "
                    f"got {type(source).__name__}")


def config_named(name: Any) -> SpyreConfig:
    """The config a trace names (``meta["config"]``), or the default card when it names none or an unknown one."""
    try:
        return get_config(str(name)) if name else SPYRE
    except ValueError:
        return SPYRE


def program_trace(name: str, launches: Sequence[tuple[KernelSpec, NodeGroup | None]], mode: str) -> Trace:
    """Device kernels of a program laid end to end, as the executor lays them (host fallbacks not drawn)."""
    from spyre_lab.device.sim import simulate

    trace = Trace(meta={"program": name, "mode": mode})
    clock = 0.0
    for spec, group in launches:
        sim = spec.simulate(mode)
        if sim.trace is None:
            sim = simulate(spec.tile_kernel, spec.cfg, mode=mode)
        trace.extend(sim.trace, offset_us=clock)
        rule = group.rule if group is not None else spec.rule
        trace.add("stream0", spec.name, clock, sim.time_us, rule=rule, bottleneck=sim.bottleneck,
                  launch_us=sim.launch_us)
        clock += sim.time_us
    return trace


# ---- engine runs ----------------------------------------------------------------------------------------
def as_stats(source: Any) -> EngineStats:
    """EngineStats from an LLM, an LLMEngine, EngineStats, or a saved ``EngineStats.save_json`` file / dict."""
    from spyre_lab.engine.stats import EngineStats

    if isinstance(source, EngineStats):
        return source
    stats = getattr(source, "stats", None)
    if isinstance(stats, EngineStats):
        return stats
    if isinstance(source, (str, Path, dict)):
        return EngineStats.from_json(source)
    raise TypeError(f"expected an LLM, EngineStats or a saved stats JSON file, got {type(source).__name__}")


@dataclass
class Run:
    """One engine run as the timeline reads it: step rows and per-step details (served steps only)."""

    label: str
    rows: list[dict[str, Any]]
    details: dict[int, StepDetail] = field(default_factory=dict)

    @property
    def served(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if not str(r["kind"]).startswith("warmup")]


def as_run(source: Any, label: str) -> Run:
    """A Run from an LLM / EngineStats / stats JSON / ``stats.to_trace(device=True)`` Trace / chrome-trace file."""
    if isinstance(source, Run):
        return source
    if isinstance(source, (str, Path)):
        doc = json.loads(Path(source).read_text())
        source = Trace.from_chrome_trace(doc) if "traceEvents" in doc else doc
    if isinstance(source, dict) and "traceEvents" in source:
        source = Trace.from_chrome_trace(source)
    if isinstance(source, Trace):
        return run_from_trace(source, label)
    stats = as_stats(source)
    return Run(label, stats.to_rows("steps"), dict(stats.details))


def run_from_trace(trace: Trace, label: str) -> Run:
    """A Run rebuilt from an engine trace (``stats.to_trace(device=True)``): its engine lane and device events."""
    from spyre_lab.engine.stats import StepDetail

    engine = trace.on("engine")
    if not engine:
        raise ValueError("this trace has no 'engine' lane; write one with llm.stats.to_trace(device=True)")
    rows, details = [], {}
    device: dict[int, list[TraceEvent]] = {}
    for e in trace.events:
        if e.lane != "engine" and "step" in e.args:
            device.setdefault(int(e.args["step"]), []).append(e)
    for i, e in enumerate(engine):
        a = e.args
        step = int(a.get("step", i))
        rows.append({"step": step, "kind": a.get("kind", e.name.split(" ")[0]), "num_seqs": a.get("num_seqs", 0),
                     "batch_bucket": a.get("batch_bucket"), "token_bucket": a.get("token_bucket"),
                     "num_tokens": a.get("num_tokens", 0), "padded_tokens": a.get("padded_tokens", 0),
                     "host_ms": a.get("host_ms", e.dur_us / 1e3), "device_ms_modeled": a.get("device_ms_modeled"),
                     "kv_blocks_used": a.get("kv_blocks_used", 0), "dispatch": a.get("dispatch", ""),
                     "start_ms": e.start_us / 1e3})
        if "batch" in a:
            events = device.get(step)
            details[step] = StepDetail(step, [tuple(b) for b in a["batch"]], dict(a.get("phases_ms", {})),
                                       a.get("arrived", []), a.get("preempted", []), a.get("finished", []),
                                       device_trace=Trace(events) if events else None)
    return Run(label, rows, details)


# ---- many cards ----------------------------------------------------------------------------------------
def symmetric_cards(trace: Trace) -> tuple[Trace, list[int]]:
    """``trace`` with a ``card<r>.ccl`` lane for every rank of its collectives' group, and the cards mirrored.

    A tensor-parallel group's ranks are symmetric (each runs the same programs and the same collectives), so a
    trace recorded on one rank stands for all: its collectives are copied onto the lanes of the cards it did not
    record (``world_size`` from spyreccl's event args), with ``mirrored_from`` set. Cards recorded in the trace
    are kept as recorded; the second value lists the mirrored ones, so a view can say which cards it drew from
    another card's timing."""
    recorded: dict[int, list[TraceEvent]] = {}
    for e in trace.events:
        card = card_of_lane(e.lane)
        if card is not None:
            recorded.setdefault(card, []).append(e)
    if not recorded:
        return trace, []
    world = max(int(e.args.get("world_size", 1)) for events in recorded.values() for e in events)
    source = min(recorded)
    mirrored = [r for r in range(world) if r not in recorded]
    out = Trace(trace.events, meta=trace.meta)
    for r in mirrored:
        for e in recorded[source]:
            out.events.append(TraceEvent(f"card{r}.ccl", e.name, e.start_us, e.dur_us,
                                         {**e.args, "rank": r, "mirrored_from": source}))
    return out, mirrored
