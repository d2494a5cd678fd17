"""Closed-form pipeline model of one kernel: one pass over the ops, no event queue.

A core whose units overlap perfectly finishes when its busiest unit does. That unit cannot start
before its first operand arrives (fill) and the kernel is not done when it finishes its last op
(drain), so for every unit ``u`` of a core::

    T_u = lead_u + busy_u + tail_u

``busy_u`` sums the unit's op costs. ``lead_u`` is when the unit's first op can start and
``tail_u`` how long the work after its last op takes; both come from a short in-order schedule
of the program's first and last ops (the prefix up to every unit's first op, the suffix from every
unit's last op). The core's time is the largest ``T_u``. The event mode reaches the same number when
loads run ahead of compute (which the double-buffered kernels the compiler emits allow); it is
higher when LX is too small for that.

DRAM: with ``n`` cores streaming, each transfer gets ``r1 = min(dma, dram / n)`` while one stream
per core is active and ``r2 = min(dma, dram / 2n)`` while a core loads and stores at once. A core
that loads ``L`` and stores ``S`` bytes keeps both streams busy for ``min(L, S) / r2`` and the
larger one alone for ``|L - S| / r1`` (processor sharing of two backlogged streams), which is the
event mode's fair-share rule in closed form.

Ring: a core that receives a partial sum cannot finish before the sender's send lands, so
``T_receiver >= T_sender - tail_sender(send) + tail_receiver(recv)``, applied until no core changes.

LX: ``lx_peak`` is the footprint of running each core's ops one at a time in program order (a
buffer lives from its op to its last user), a lower bound of what the event mode measures.
"""

from __future__ import annotations

from itertools import accumulate

from spyre_lab.device.config import SpyreConfig
from spyre_lab.device.isa import Kernel, LXOverflowError, OpKind, TileOp
from spyre_lab.device.sim_costs import (
    LOAD,
    PT,
    RECV,
    RING,
    SFU,
    STORE,
    UNIT_INDEX,
    UNIT_NAMES,
    EngineRun,
    matmul_cycles,
    ring_cycles,
    sfu_cycles,
)

_LOAD, _STORE, _MATMUL, _VECTOR, _SPECIAL, _SEND = (OpKind.LOAD, OpKind.STORE, OpKind.MATMUL, OpKind.VECTOR,
                                                    OpKind.SPECIAL, OpKind.RING_SEND)


class _CoreTotals:
    """What one pass over a core's ops learns: unit totals, op counts and the LX footprint."""

    __slots__ = ("counts", "first", "flops", "last", "load_bytes", "lx_peak", "macs", "pt", "ring", "ring_bytes",
                 "sfu", "store_bytes")

    def __init__(self) -> None:
        self.load_bytes = self.store_bytes = self.ring_bytes = self.flops = self.macs = self.lx_peak = 0
        self.pt = self.sfu = self.ring = 0.0
        self.counts = [0] * 6
        self.first = [-1] * 6
        self.last = [-1] * 6


def _totals(kernel: Kernel, core: int, ops: list[TileOp], cfg: SpyreConfig, capacity: int,
            mm_cache: dict[tuple[int, int, int], int]) -> _CoreTotals:
    tot = _CoreTotals()
    n = len(ops)
    last_use = list(range(n))
    claims: list[tuple[int, int]] = []
    load_bytes = store_bytes = ring_bytes = flops = macs = 0
    pt = sfu = ring = 0.0
    nload = nstore = npt = nsfu = 0
    sfu_lanes = cfg.sfu_elems_per_cycle_per_core
    special = cfg.transcendental_factor
    for i, op in enumerate(ops):
        kind = op.kind
        ob = op.out_bytes
        if ob:
            if ob > capacity:
                raise LXOverflowError(kernel.name, core, ob, 0, capacity)
            claims.append((i, ob))
        for d in op.deps:
            last_use[d] = i
        if kind is _LOAD:
            load_bytes += op.nbytes
            nload += 1
        elif kind is _MATMUL:
            key = (op.m, op.n, op.k)
            cycles = mm_cache.get(key)
            if cycles is None:
                cycles = mm_cache[key] = matmul_cycles(*key, cfg)
            pt += cycles
            mnk = key[0] * key[1] * key[2]
            macs += mnk
            flops += 2 * mnk
            npt += 1
        elif kind is _STORE:
            store_bytes += op.nbytes
            nstore += 1
        elif kind is _VECTOR or kind is _SPECIAL:
            passes = -(-op.elements // sfu_lanes)
            sfu += passes * special if kind is _SPECIAL else passes
            flops += op.elements
            nsfu += 1
        else:
            u = UNIT_INDEX[kind]
            if tot.first[u] < 0:
                tot.first[u] = i
            tot.last[u] = i
            tot.counts[u] += 1
            if kind is _SEND:
                ring += ring_cycles(op.nbytes, op.hops, cfg)
                ring_bytes += op.nbytes
    delta = [0] * (n + 1)
    for i, ob in claims:
        delta[i] += ob
        delta[last_use[i] + 1] -= ob
    tot.lx_peak = max(accumulate(delta), default=0)
    tot.load_bytes, tot.store_bytes, tot.ring_bytes, tot.flops, tot.macs = (load_bytes, store_bytes, ring_bytes,
                                                                            flops, macs)
    tot.pt, tot.sfu, tot.ring = pt, sfu, ring
    for u, count in ((LOAD, nload), (PT, npt), (SFU, nsfu), (STORE, nstore)):
        tot.counts[u] = count
    _first_last(ops, tot)
    return tot


def _first_last(ops: list[TileOp], tot: _CoreTotals) -> None:
    """Index of each present unit's first and last op, by scanning in from both ends."""
    wanted = {u for u in (LOAD, PT, SFU, STORE) if tot.counts[u]}
    for order, slot in ((range(len(ops)), tot.first), (range(len(ops) - 1, -1, -1), tot.last)):
        missing = set(wanted)
        for i in order:
            if not missing:
                break
            u = UNIT_INDEX[ops[i].kind]
            if u in missing:
                slot[u] = i
                missing.discard(u)


def run_analytic(kernel: Kernel, cfg: SpyreConfig, capacity: int, want_events: bool) -> EngineRun:
    """Time ``kernel`` with the closed-form pipeline model (see the module docstring)."""
    programs = kernel.programs
    mm_cache: dict[tuple[int, int, int], int] = {}
    totals = {c: _totals(kernel, c, p.ops, cfg, capacity, mm_cache) for c, p in enumerate(programs) if len(p)}
    hops_of = {(c, op.tag): op.hops for c, p in enumerate(programs) if totals.get(c) and totals[c].counts[RING]
               for op in p.ops if op.kind is _SEND}

    streaming = sum(1 for t in totals.values() if t.load_bytes or t.store_bytes)
    dma, dram = float(cfg.core_dma_bytes_per_cycle), cfg.dram_bytes_per_cycle
    r1 = min(dma, dram / max(1, streaming))
    r2 = min(dma, dram / max(1, 2 * streaming))

    def duration(core: int, op: TileOp) -> float:
        kind = op.kind
        if kind is _LOAD or kind is _STORE:
            return op.nbytes / r1
        if kind is _MATMUL:
            return mm_cache.get((op.m, op.n, op.k)) or matmul_cycles(op.m, op.n, op.k, cfg)
        if kind is _VECTOR or kind is _SPECIAL:
            return sfu_cycles(op.elements, cfg, kind is _SPECIAL)
        if kind is _SEND:
            return ring_cycles(op.nbytes, op.hops, cfg)
        return ring_cycles(op.nbytes, hops_of.get((op.peer, op.tag), 1), cfg)  # recv: lasts as long as the send

    finish: dict[int, float] = {}
    busy: dict[tuple[int, int], float] = {}
    lead_of: dict[int, list[float]] = {}
    send_tail: dict[tuple[int, str | None], float] = {}
    recv_tail: dict[int, tuple[int, str | None, float]] = {}
    for c, tot in totals.items():
        ops = programs[c].ops
        lo, hi = sorted((tot.load_bytes, tot.store_bytes))
        both, alone = lo / r2, (hi - lo) / r1
        load_busy = both + (alone if tot.load_bytes >= tot.store_bytes else 0.0)
        store_busy = both + (alone if tot.store_bytes > tot.load_bytes else 0.0)
        unit_busy = [load_busy, tot.pt, tot.sfu, store_busy, tot.ring]
        lead = _leads(c, ops, tot, duration)
        tail, sends, last_recv = _tails(c, ops, tot, duration)
        for tag, t in sends.items():
            send_tail[(c, tag)] = t
        if last_recv is not None:
            recv_tail[c] = last_recv
        t_core = max((lead[u] + unit_busy[u] + tail[u] for u in range(5) if tot.counts[u]), default=0.0)
        if tot.counts[LOAD] or tot.counts[STORE]:
            last_dram = max((LOAD, STORE), key=lambda u: tot.last[u])
            t_core = max(t_core, lead[LOAD] + both + alone + tail[last_dram])
        finish[c] = t_core
        lead_of[c] = lead
        for u in range(5):
            busy[(c, u)] = unit_busy[u]

    for _ in range(len(totals)):  # a receiver ends after its sender's partial lands
        changed = False
        for c, (peer, tag, after) in recv_tail.items():
            landed = finish.get(peer, 0.0) - send_tail.get((peer, tag), 0.0)
            if landed + after > finish[c] + 1e-9:
                finish[c] = landed + after
                changed = True
        if not changed:
            break

    run = EngineRun(
        makespan=max(finish.values(), default=0.0), busy=busy,
        compute_busy={c: min(t.pt + t.sfu, finish[c]) for c, t in totals.items()},
        lx_peak={c: t.lx_peak for c, t in totals.items()},
        bytes_loaded=sum(t.load_bytes for t in totals.values()),
        bytes_stored=sum(t.store_bytes for t in totals.values()),
        ring_bytes=sum(t.ring_bytes for t in totals.values()), flops=sum(t.flops for t in totals.values()),
        macs=sum(t.macs for t in totals.values()), matmul_cores=sum(1 for t in totals.values() if t.macs))
    if want_events:
        run.events = [(c, u, f"{totals[c].counts[u]} {UNIT_NAMES[u]} ops (analytic)", lead_of[c][u], busy[(c, u)],
                       {"ops": totals[c].counts[u], "analytic": True})
                      for c in totals for u in range(5) if totals[c].counts[u]]
    return run


def _leads(core: int, ops: list[TileOp], tot: _CoreTotals, duration) -> list[float]:
    """When each unit's first op can start: an in-order schedule of the prefix up to the last first op."""
    lead = [0.0] * 6
    end = max((tot.first[u] for u in range(5) if tot.counts[u]), default=-1)
    fin = [0.0] * (end + 1)
    free = [0.0] * 6
    for i in range(end + 1):
        op = ops[i]
        u = UNIT_INDEX[op.kind]
        s = free[u] if u != RECV else 0.0
        for d in op.deps:
            if fin[d] > s:
                s = fin[d]
        fin[i] = s + duration(core, op)
        if u != RECV:
            free[u] = fin[i]
        if i == tot.first[u]:
            lead[u] = s
    return lead


def _tails(core: int, ops: list[TileOp], tot: _CoreTotals, duration):
    """How long the work after each unit's last op takes: an in-order schedule of the suffix, run backwards.

    Also returns the tail after every ring send in the suffix (by tag) and, for the last receive,
    (peer, tag, tail after it) for the ring correction.
    """
    tail = [0.0] * 6
    start = min(tot.last[u] for u in range(6) if tot.counts[u])
    after = [0.0] * (len(ops) - start)
    next_on_unit = [0.0] * 6
    sends: dict[str | None, float] = {}
    last_recv = None
    for j in range(len(ops) - 1, start - 1, -1):
        op = ops[j]
        u = UNIT_INDEX[op.kind]
        t_after = after[j - start]
        if u != RECV and next_on_unit[u] > t_after:
            t_after = next_on_unit[u]
        value = duration(core, op) + t_after
        if u != RECV:
            next_on_unit[u] = value
        for d in op.deps:
            if d >= start and after[d - start] < value:
                after[d - start] = value
        if j == tot.last[u]:
            tail[u] = t_after
            if u == RECV:
                last_recv = (op.peer, op.tag, t_after)
        if u == RING:
            sends[op.tag] = t_after
    return tail, sends, last_recv
