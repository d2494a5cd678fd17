"""The dataflow simulator: how long a :class:`~spyre_lab.device.isa.TileProgram` takes on the modeled card.

Two modes read the same kernel and return the same :class:`SimResult`:

* ``"event"`` (:mod:`spyre_lab.device.sim_event`) fires every tile op on every core by the
  dataflow rule (deps done, unit free, LX room), with DRAM bandwidth shared between in-flight
  transfers and ring sends between cores. It records a trace of every op, for pictures and for
  questions such as "does the PT start before the last load lands?".
* ``"analytic"`` (:mod:`spyre_lab.device.sim_analytic`) makes one pass over each core's ops: a
  pipeline schedule at fixed DRAM rates (which holds the fill, the drain and the busiest unit),
  floored by what the card's DRAM bandwidth allows. No event queue and no LX stalls; for big
  shapes, where it agrees with the event mode within a few percent on the reference kernels.

All times are *modeled*: they come from :class:`~spyre_lab.device.config.SpyreConfig`, whose
unpublished numbers are estimates. Every kernel pays ``cfg.kernel_launch_cycles`` once, before its
first op; trace events therefore start at the launch time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from spyre_lab.device.config import SPYRE, SpyreConfig
from spyre_lab.device.isa import TileProgram
from spyre_lab.device.sim_analytic import run_analytic
from spyre_lab.device.sim_costs import UNIT_NAMES, EngineRun, check_capacity
from spyre_lab.device.sim_event import run_event
from spyre_lab.device.trace import Trace, TraceEvent
from spyre_lab.heap import cyclic_gc_paused

Mode = Literal["event", "analytic"]
Bottleneck = Literal["memory", "compute", "communication"]

_UNIT_CLASS = {"load": "memory", "store": "memory", "pt": "compute", "sfu": "compute", "ring": "communication"}


@dataclass
class SimResult:
    """What one simulated launch cost and where the time went (all times modeled microseconds).

    ``time_us`` includes the launch overhead once. ``busy_us[(core, unit)]`` is how long each unit
    of each active core was busy (units ``load``, ``pt``, ``sfu``, ``store``, ``ring``; for
    ``ring``, the sender's time). ``core_utilization[c]`` is the fraction of ``time_us`` during
    which core ``c``'s PT or SFU was computing. ``pt_utilization`` is the MACs done divided by what
    the PT units of the cores that ran matmuls could have done in ``time_us``; ``dram_utilization``
    is the bytes moved over what ``cfg.dram_bandwidth`` could move in ``time_us``. ``lx_peak[c]`` is the
    most LX core ``c`` held at once (in analytic mode, the footprint of running the core's ops one at
    a time in program order, a lower bound of the event mode's peak). ``bottleneck`` is the class
    (memory, compute, communication) of the busiest unit on any core.
    """

    kernel: TileProgram = field(repr=False)
    cfg: SpyreConfig = field(repr=False)
    mode: Mode
    time_us: float
    launch_us: float
    busy_us: dict[tuple[int, str], float] = field(repr=False)
    core_utilization: dict[int, float] = field(repr=False)
    pt_utilization: float
    dram_utilization: float
    bytes_loaded: int
    dram_bytes: float
    bytes_stored: int
    ring_bytes: int
    flops: int
    lx_peak: dict[int, int] = field(repr=False)
    lx_capacity: int
    bottleneck: Bottleneck
    trace: Trace | None = field(default=None, repr=False)

    @property
    def active_cores(self) -> list[int]:
        return self.kernel.active_cores

    def core_trace(self, name: str) -> Trace:
        """Per-core events from the launch start: the event trace when it was recorded, else (analytic mode) one
        summary event per busy unit per core, named ``name`` -- what a launch's trace places on its core lanes."""
        if self.trace is not None:
            return self.trace
        summary = Trace()
        for (core, unit), busy in sorted(self.busy_us.items()):
            if busy > 0:
                summary.add(f"core{core}.{unit}", name, 0.0, busy, summary=True)
        return summary

    def busiest(self) -> tuple[int, str, float]:
        """(core, unit, busy us) of the busiest unit on any core; ties go to the lower core, then pipeline order."""
        (core, unit), busy = max(self.busy_us.items(), key=lambda kv: (kv[1], -kv[0][0], -UNIT_NAMES.index(kv[0][1])),
                                 default=((0, "load"), 0.0))
        return core, unit, busy

    def summary(self) -> str:
        """One line of numbers: time, launch, bytes, FLOPs, utilization."""
        return (f"{self.kernel.name} [{self.mode}]: {self.time_us:.2f} us modeled (launch {self.launch_us:.2f} us) "
                f"on {len(self.active_cores)} cores; DRAM {self.bytes_loaded / 1e6:.3f} MB in / "
                f"{self.bytes_stored / 1e6:.3f} MB out, ring {self.ring_bytes / 1e6:.3f} MB, "
                f"{self.flops / 1e9:.3f} GFLOP, PT utilization {self.pt_utilization:.1%}")

    def explain(self) -> str:
        """One sentence for learners: what bounds this kernel, how hard that unit works, what would help."""
        if not self.kernel.num_ops:
            return f"{self.kernel.name}: no ops; the {self.launch_us:.2f} us are the launch alone."
        core, unit, busy = self.busiest()
        after_launch = self.time_us - self.launch_us
        share = busy / after_launch if after_launch > 0 else 0.0
        dram = self.dram_utilization * self.time_us / after_launch if after_launch > 0 else 0.0
        streams = sum(1 for c in self.active_cores if self.busy_us.get((c, "load")) or self.busy_us.get((c, "store")))
        dma_limited = streams * self.cfg.core_dma_bytes_per_cycle < self.cfg.dram_bytes_per_cycle
        if self.bottleneck == "memory" and dma_limited:
            why = (f"only {streams} core(s) move data and one core's DMA engine moves at most "
                   f"{self.cfg.core_dma_bytes_per_cycle * self.cfg.clock_hz / 1e9:.0f} GB/s, less than DRAM's "
                   f"{self.cfg.dram_bandwidth / 1e9:.1f} GB/s: spread the transfers over more cores")
        elif self.bottleneck == "memory":
            why = (f"DRAM is {dram:.0%} busy after launch and shared by all cores, so more cores will not help; "
                   "reuse each byte more (bigger tiles, fusion)")
        elif unit == "pt":
            why = (f"the PT arrays run at {self.pt_utilization:.0%} of their peak over the whole launch; spread the "
                   f"work over more cores and give each matmul at least {self.cfg.pe_rows} rows")
        elif self.bottleneck == "compute":
            why = "the SFU's vector and transcendental passes are the limit; spread the rows over more cores"
        else:
            why = "reduce fewer partial sums over the ring or keep K partners adjacent"
        launch = ""
        if self.launch_us >= 0.5 * self.time_us:
            launch = f"; the launch is {self.launch_us / self.time_us:.0%} of the time, so fusing kernels matters more"
        return (f"{self.kernel.name}: {self.bottleneck}-bound; core {core}'s {unit} unit is busy {busy:.2f} of the "
                f"{after_launch:.2f} us after launch ({share:.0%}); {why}{launch}.")

    def __repr__(self) -> str:
        return (f"SimResult({self.kernel.name!r}, mode={self.mode!r}, time_us={self.time_us:.3f} modeled, "
                f"bottleneck={self.bottleneck!r})")


def simulate(kernel: TileProgram, cfg: SpyreConfig = SPYRE, mode: Mode = "event", trace: bool = True,
             lx_capacity: int | None = None) -> SimResult:
    """Time ``kernel`` on the modeled card ``cfg``; see the module docstring for the two modes.

    ``lx_capacity`` overrides ``cfg.lx_bytes`` as the LX bytes per core (to see loads stall; the
    analytic mode assumes loads never stall and only checks that every buffer fits on its own).
    ``trace=False`` skips building the trace (one event per op) when only the numbers are needed.
    Raises :class:`~spyre_lab.device.isa.LXOverflowError` when a core's LX cannot hold what the
    kernel asks of it, and ``RuntimeError`` when ring transfers wait on each other forever.
    """
    if not isinstance(kernel, TileProgram):
        raise TypeError(f"simulate() takes a spyre_lab.device.isa.TileProgram, got {type(kernel).__name__}")
    if len(kernel.programs) > cfg.cores:
        raise ValueError(f"kernel {kernel.name!r} has {len(kernel.programs)} core programs but {cfg.name} has "
                         f"{cfg.cores} cores; build it for this config or use cfg.replace(cores=...)")
    capacity = check_capacity(lx_capacity, cfg)
    if mode not in ("event", "analytic"):
        raise ValueError(f"simulate() mode must be 'event' or 'analytic', got {mode!r}")
    with cyclic_gc_paused():   # its many small lists and events form no cycles
        run = (run_event if mode == "event" else run_analytic)(kernel, cfg, capacity, trace)
        return _result(kernel, cfg, mode, run, capacity)


def _result(kernel: TileProgram, cfg: SpyreConfig, mode: Mode, run: EngineRun, capacity: int) -> SimResult:
    to_us = 1e6 / cfg.clock_hz
    launch = float(cfg.kernel_launch_cycles)
    total_cycles = launch + run.makespan
    per_cycle = 1.0 / total_cycles if total_cycles > 0 else 0.0
    busy_us = {(c, UNIT_NAMES[u]): cycles * to_us for (c, u), cycles in run.busy.items()}
    utilization = {c: run.compute_busy.get(c, 0.0) * per_cycle for c in range(len(kernel.programs))}
    peak_macs = cfg.macs_per_cycle_per_core * run.matmul_cores * total_cycles
    trace_out = None
    if run.events is not None:
        lanes = {}
        events = []
        for c, u, name, start, dur, args in run.events:
            lane = lanes.get((c, u)) or lanes.setdefault((c, u), f"core{c}.{UNIT_NAMES[u]}")
            events.append(TraceEvent(lane, name, (launch + start) * to_us, dur * to_us, args))
        trace_out = Trace(events, meta={"kernel": kernel.name, "mode": mode, "config": cfg.name,
                                        "launch_us": launch * to_us, "time_us": total_cycles * to_us})
    return SimResult(
        kernel=kernel, cfg=cfg, mode=mode, time_us=total_cycles * to_us, launch_us=launch * to_us, busy_us=busy_us,
        core_utilization=utilization, pt_utilization=run.macs / peak_macs if peak_macs else 0.0,
        dram_utilization=run.dram_bytes / cfg.dram_bytes_per_cycle * per_cycle,
        bytes_loaded=run.bytes_loaded, dram_bytes=run.dram_bytes, bytes_stored=run.bytes_stored,
        ring_bytes=run.ring_bytes, flops=run.flops,
        lx_peak=run.lx_peak, lx_capacity=capacity, bottleneck=_bottleneck(run), trace=trace_out,
    )


def _bottleneck(run: EngineRun) -> Bottleneck:
    """The class of the busiest unit on any core (memory wins ties, then compute)."""
    worst = {"memory": 0.0, "compute": 0.0, "communication": 0.0}
    for (_, u), cycles in run.busy.items():
        cls = _UNIT_CLASS[UNIT_NAMES[u]]
        if cycles > worst[cls]:
            worst[cls] = cycles
    return max(worst, key=lambda k: (worst[k], k == "memory", k == "compute"))  # type: ignore[return-value]
