"""Analytic timing of one kernel: one pass over the ops, no event queue, for big shapes.

Two bounds, both computed in a single O(ops + deps) pass per core; the core takes the larger:

1. **Pipeline schedule.** Each unit runs one op at a time; an op starts as soon as its deps are
   done and its unit is free (``start = max(deps finished, unit free)``), and an op the program
   lists late but whose operands arrived early slips into an earlier idle stretch of its unit, as
   the event mode's "earliest ready op first" rule does. The schedule's end already holds the
   pipeline's fill (nothing computes before the first tile lands), its drain (the last store runs
   after the last compute), the busiest unit's total, and any dependency chain longer than all of
   those (a loop-carried buffer slot, a staged pipeline). A core's DRAM ops run at the average
   rate its longer stream (loads or stores) gets when every core's stream starts together and
   shares DRAM equally, each capped by its DMA engine, the smallest finishing first
   (water-filling): ``min(dma, dram / n)`` when ``n`` cores stream alike, ``dram`` being the
   card's rate at the kernel's read/write mix (the bus turns around between reads and writes). A store issued after
   its core's last load has landed runs in the drain, when only the cores that end with a store
   still use DRAM (the one core of a K-split group that writes the result). LX is assumed big enough
   for loads to run ahead, which the double-buffered kernels a compiler emits ensure; the event
   mode is slower when it is not.
2. **DRAM sharing.** The card's DRAM must move every byte of the kernel, so the longest stream
   cannot finish before ``all bytes / dram`` cycles. When that is longer than water-filling says
   (cores that load and store at once run two streams, so DRAM is oversubscribed), every
   transfer slows down by the same factor, the event mode's fair share: a core's load and store
   busy times are stretched by it, and the core cannot finish before the time before its first
   load, plus its longer stretched stream, plus the work after its last transfer.

Ring: a ``ring_recv`` finishes when its send does. Cores are scheduled senders first (a
topological order of the ring edges), so a receiver sees when its partial sums land. The event
mode's flow control (a send waits until its receive is posted) is not modeled, so a ring deadlock
the event mode reports goes unnoticed here.

Cores whose programs are the very same ``TileOp`` objects (builders share the ops of cores that
do the same work) and hold no ring ops are scheduled once: their timing cannot differ. The partners
of a split reduction run one program but for whom their ring ops talk to
(:mod:`~spyre_lab.device.sim_partners`): a partner is scheduled once per DRAM rate and set of times
its receives' sends land, the only inputs in which two of them can differ. What every core moves
and the rates DRAM gives it are read first (:mod:`~spyre_lab.device.sim_streams`).

Core utilization counts PT and SFU time as if they never overlapped (capped at the core's time):
the pass does not track their overlap.

LX: ``lx_peak`` is the footprint of running each core's ops one at a time in program order (a
buffer lives from its op to its last user), a lower bound of the event mode's peak.
"""

from __future__ import annotations

from itertools import accumulate

from spyre_lab.device.config import SpyreConfig
from spyre_lab.device.isa import LXOverflowError, OpKind, TileProgram
from spyre_lab.device.sim_costs import LOAD, PT, RING, SFU, STORE, UNIT_NAMES, EngineRun, matmul_cycles, ring_cycles
from spyre_lab.device.sim_partners import PartnerShape, partner_shapes
from spyre_lab.device.sim_streams import drain_rate, dram_rates, stream_mix, survey

_LOAD, _STORE, _MATMUL, _VECTOR, _SPECIAL, _SEND, _RECV = (OpKind.LOAD, OpKind.STORE, OpKind.MATMUL, OpKind.VECTOR,
                                                           OpKind.SPECIAL, OpKind.RING_SEND, OpKind.RING_RECV)


_GAPS_KEPT = 8


class _Core:
    """Totals and timing of one core after the pass."""

    __slots__ = ("busy", "counts", "finish", "first_start", "flops", "load_bytes", "lx_peak", "macs", "ring_bytes",
                 "store_bytes")

    def __init__(self) -> None:
        self.busy = [0.0] * 5
        self.counts = [0] * 5
        self.first_start = [0.0] * 5
        self.load_bytes = self.store_bytes = self.ring_bytes = self.flops = self.macs = self.lx_peak = 0
        self.finish = 0.0


def run_analytic(kernel: TileProgram, cfg: SpyreConfig, capacity: int, want_events: bool) -> EngineRun:
    """Time ``kernel`` with the analytic model (see the module docstring)."""
    programs = kernel.programs
    active = [c for c, p in enumerate(programs) if p.ops]
    same_as = _same_programs(kernel, active)
    shapes = partner_shapes(programs, active, same_as)
    loads, stores, last_load, senders, ringless, drawn = survey(kernel, active, same_as, shapes, cfg)
    rates, stretch = dram_rates(loads, stores, drawn, stream_mix(kernel, active, same_as, shapes, last_load, cfg),
                                cfg)
    drain = drain_rate(kernel, stores, last_load, cfg)

    send_done: dict[tuple[int, str | None], float] = {}
    mm_cache: dict[tuple[int, int, int], int] = {}
    cores: dict[int, _Core] = {}
    partners: dict[tuple, tuple[_Core, tuple[float, ...], bool]] = {}
    for _ in range(3):  # one pass suffices unless ring edges form a cycle between cores
        waited = False
        for c in _senders_first(senders, active):
            twin = same_as[c]
            if twin != c and twin in ringless and twin in cores:  # same ops, no ring: same timing
                cores[c] = cores[twin]
                continue
            shape = shapes.get(c)
            key = None if shape is None else _partner_key(kernel, c, shape, rates.get(c, 1.0), send_done)
            seen = partners.get(key) if key is not None else None
            if seen is not None:   # an earlier partner of its shape saw the same rate and landing times
                cores[c], late = seen[0], seen[2]
                ops = programs[c].ops
                for j, end in zip(shape.sends, seen[1]):
                    send_done[(c, ops[j].tag)] = end
            else:
                cores[c], late = _schedule(kernel, c, cfg, capacity, rates.get(c, 1.0), drain, last_load[c],
                                           stretch, send_done, mm_cache)
                if key is not None:
                    ops = programs[c].ops
                    partners[key] = (cores[c], tuple(send_done[(c, ops[j].tag)] for j in shape.sends), late)
            waited |= late
        if not waited:
            break

    run = EngineRun(
        makespan=max((t.finish for t in cores.values()), default=0.0),
        busy={(c, u): t.busy[u] for c, t in cores.items() for u in range(5)},
        compute_busy={c: min(t.busy[PT] + t.busy[SFU], t.finish) for c, t in cores.items()},
        lx_peak={c: t.lx_peak for c, t in cores.items()},
        bytes_loaded=sum(t.load_bytes for t in cores.values()),
        dram_bytes=sum((loads[c] + stores[c]) * drawn[c] for c in cores),
        bytes_stored=sum(t.store_bytes for t in cores.values()),
        ring_bytes=sum(t.ring_bytes for t in cores.values()), flops=sum(t.flops for t in cores.values()),
        macs=sum(t.macs for t in cores.values()), matmul_cores=sum(1 for t in cores.values() if t.macs))
    if want_events:
        run.events = [(c, u, f"{t.counts[u]} {UNIT_NAMES[u]} ops (analytic)", t.first_start[u], t.busy[u],
                       {"ops": t.counts[u], "analytic": True})
                      for c, t in sorted(cores.items()) for u in range(5) if t.counts[u]]
    return run


def _partner_key(kernel: TileProgram, core: int, shape: PartnerShape, rate: float,
                 send_done: dict[tuple[int, str | None], float]) -> tuple:
    """What a core of a partner shape's timing depends on beyond its shape: its DRAM rate and when the sends its
    receives wait for land (None: not placed yet). The other inputs of :func:`_schedule` are the kernel's."""
    ops = kernel.programs[core].ops
    return shape.first, rate, tuple([send_done.get((ops[j].peer, ops[j].tag)) for j in shape.recvs])


def _schedule(kernel: TileProgram, core: int, cfg: SpyreConfig, capacity: int, rate: float, drain_rate: float,
              last_load: int, stretch: float, send_done: dict[tuple[int, str | None], float],
              mm_cache: dict[tuple[int, int, int], int]) -> tuple[_Core, bool]:
    """One pass over a core's ops; returns its totals (``_totals``) and whether a receive's sender was not yet
    scheduled. The loop places each op (its cost by kind, then its start on its unit, backfilling idle gaps)
    inline: it runs once per op, where a call per op would cost as much as the placement itself.
    """
    ops = kernel.programs[core].ops
    n = len(ops)
    fin, last_use, claims = [0.0] * n, list(range(n)), []
    free, busy, first, counts = [0.0] * 5, [0.0] * 5, [-1.0] * 5, [0] * 5
    gaps: list[list[tuple[float, float]]] = [[], [], [], [], []]
    load_bytes = store_bytes = ring_bytes = flops = macs = 0
    sfu_lanes, special = cfg.sfu_elems_per_cycle_per_core, cfg.transcendental_factor
    late, last_dram_fin = False, 0.0
    for i, op in enumerate(ops):
        kind, ob = op.kind, op.out_bytes
        if ob:
            if ob > capacity:
                raise LXOverflowError(kernel.name, core, ob, 0, capacity)
            claims.append((i, ob))
        ready = 0.0
        for d in op.deps:
            last_use[d] = i
            f = fin[d]
            if f > ready:
                ready = f
        if kind is _LOAD:
            u, cycles = LOAD, op.nbytes / rate
            load_bytes += op.nbytes
        elif kind is _MATMUL:
            key = (op.m, op.n, op.k)
            cycles = mm_cache.get(key)
            if cycles is None:
                cycles = mm_cache[key] = matmul_cycles(*key, cfg)
            u, mnk = PT, key[0] * key[1] * key[2]
            macs, flops = macs + mnk, flops + 2 * mnk
        elif kind is _STORE:
            drains = i > last_load and (last_load < 0 or ready >= fin[last_load])
            u, cycles = STORE, op.nbytes / (drain_rate if drains else rate)
            store_bytes += op.nbytes
        elif kind is _VECTOR or kind is _SPECIAL:
            cycles = -(-op.elements // sfu_lanes)
            if kind is _SPECIAL:
                cycles *= special
            u, flops = SFU, flops + op.elements
        elif kind is _SEND:
            u, cycles = RING, ring_cycles(op.nbytes, op.hops, cfg)
            ring_bytes += op.nbytes
        else:  # a receive is done when its send is (it occupies no unit); a send not yet placed: wait for it
            landed = send_done.get((op.peer, op.tag))
            late = late or landed is None
            fin[i] = landed if landed is not None and landed > ready else ready
            continue
        unit_free = free[u]
        if ready >= unit_free:
            start = ready
            if ready > unit_free:  # the unit idles until this op is ready: a gap a later op may fill
                unit_gaps = gaps[u]
                unit_gaps.append((unit_free, ready))
                if len(unit_gaps) > _GAPS_KEPT:
                    del unit_gaps[0]
            free[u] = ready + cycles
        else:
            start = _backfill(gaps[u], ready, cycles)
            if start < 0:
                start = unit_free
                free[u] = unit_free + cycles
        fin[i] = end = start + cycles
        busy[u] += cycles
        counts[u] += 1
        if first[u] < 0:
            first[u] = start
        if u in (LOAD, STORE):
            last_dram_fin = end if end > last_dram_fin else last_dram_fin
        elif u == RING:
            send_done[(core, op.tag)] = end
    moved = (load_bytes, store_bytes, ring_bytes, flops, macs)
    return _totals(fin, busy, counts, first, last_dram_fin, stretch, moved, _lx_peak(claims, last_use, n)), late


def _totals(fin: list[float], busy: list[float], counts: list[int], first: list[float], last_dram_fin: float,
            stretch: float, moved: tuple[int, int, int, int, int], lx_peak: int) -> _Core:
    """The core's totals once its ops are placed: DRAM time stretched, its end, what it moved and computed."""
    tot = _Core()
    busy[LOAD] *= stretch  # every transfer slows down alike when the card's DRAM is the tighter limit
    busy[STORE] *= stretch
    tot.busy = busy
    tot.counts = counts
    tot.first_start = [max(0.0, f) for f in first]
    load_bytes, store_bytes = moved[0], moved[1]
    tot.finish = _finish(fin, busy, first[LOAD], last_dram_fin, bool(load_bytes or store_bytes))
    tot.load_bytes, tot.store_bytes, tot.ring_bytes, tot.flops, tot.macs = moved
    tot.lx_peak = lx_peak
    return tot


def _finish(fin: list[float], busy: list[float], first_load: float, last_dram_fin: float, moves_bytes: bool) -> float:
    """The core's end: its schedule's end, and no earlier than its (stretched) DRAM streams allow (bound 2)."""
    schedule_end = max(fin, default=0.0)
    if moves_bytes:  # no faster than this core's streams move at their (stretched) share
        moving = max(busy[LOAD], busy[STORE])
        schedule_end = max(schedule_end, max(0.0, first_load) + moving + (schedule_end - last_dram_fin))
    return schedule_end


def _lx_peak(claims: list[tuple[int, int]], last_use: list[int], n: int) -> int:
    """LX footprint of running the ops one at a time: each buffer lives from its op to its last user."""
    delta = [0] * (n + 1)
    for i, ob in claims:
        delta[i] += ob
        delta[last_use[i] + 1] -= ob
    return max(accumulate(delta), default=0)


def _backfill(gaps: list[tuple[float, float]], ready: float, cycles: float) -> float:
    """Start time in the earliest idle gap of a unit that fits an op ready at ``ready``, or -1.

    The event mode's units take whichever op is ready first (in program order among ready ops),
    so an op the program lists late but whose operands arrived early runs in an earlier idle
    stretch. Only the most recent gaps are kept, which keeps this O(1) per op.
    """
    for idx, (gap_start, gap_end) in enumerate(gaps):
        start = gap_start if gap_start > ready else ready
        if start + cycles <= gap_end:
            pieces = [(a, b) for a, b in ((gap_start, start), (start + cycles, gap_end)) if b > a]
            gaps[idx:idx + 1] = pieces
            return start
    return -1.0


def _same_programs(kernel: TileProgram, active: list[int]) -> dict[int, int]:
    """Core -> the first core whose program is the very same ``TileOp`` objects (itself if none).

    Builders share the (frozen) ops of cores that do the same work, so a 32-core kernel is often
    a handful of distinct programs; those are scheduled once. The check compares object identity
    at the ends first, so it costs next to nothing when programs differ.
    """
    same_as: dict[int, int] = {}
    firsts: list[int] = []
    programs = kernel.programs
    for c in active:
        ops = programs[c].ops
        for r in firsts:
            other = programs[r].ops
            if other is ops or (len(other) == len(ops) and other[0] is ops[0] and other[-1] is ops[-1]
                                and other == ops):
                same_as[c] = r
                break
        else:
            same_as[c] = c
            firsts.append(c)
    return same_as


def _senders_first(senders: dict[int, set[int]], active: list[int]) -> list[int]:
    """Active cores ordered so every core comes after the cores that send it data (cycles broken by core id)."""
    order: list[int] = []
    placed: set[int] = set()
    visiting: set[int] = set()

    def visit(c: int) -> None:
        if c in placed or c in visiting:
            return
        visiting.add(c)
        for s in sorted(senders.get(c, ())):
            visit(s)
        visiting.discard(c)
        placed.add(c)
        order.append(c)

    for c in active:
        visit(c)
    return order
