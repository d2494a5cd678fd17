"""The dataflow firing rule, written to be read: fire, advance, retire.

This is the rule the event simulator (:mod:`spyre_lab.device.sim_event`) implements, without its speed
tricks (flat loops, heaps, one virtual clock for all DRAM transfers). A test holds the two equal on random
kernels, so read this one to learn the rule and trust the fast one to follow it.

1. **Fire.** On every core, each free unit (load DMA, PT, SFU, store DMA, ring) takes its earliest ready
   op in program order; an op is ready when every op it depends on has finished. An op that writes an LX
   buffer claims its bytes first and waits while the core's LX is full. A ``ring_recv`` occupies no unit:
   once ready it is *posted* (claims its buffer), and only then may its ``ring_send`` fire.
2. **Advance** time to the next op that finishes. PT, SFU and ring ops take a fixed number of cycles.
   DRAM transfers share the card's DRAM: each in flight moves at :func:`~spyre_lab.device.sim_costs.dram_rate`
   of the loads and stores in flight, a rate that changes whenever a transfer starts or ends.
3. **Retire** what finished: free its unit, wake the ops that depended on it, and release every LX buffer
   whose last user is done (a buffer nothing reads is released when its op ends). A receive lands with its
   send.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from spyre_lab.device.config import SpyreConfig
from spyre_lab.device.isa import LXOverflowError, OpKind, TileOp, TileProgram
from spyre_lab.device.sim_costs import LOAD, RECV, STORE, UNIT_INDEX, dram_rate, fixed_cycles


@dataclass
class _Op:
    core: int
    index: int
    op: TileOp
    unit: int
    waiting_on: int  # deps not yet finished (a send also waits for its receive to be posted)
    users_left: int  # ops that read its LX buffer and have not finished
    producers: list[_Op] = field(default_factory=list)
    dependents: list[_Op] = field(default_factory=list)
    start: float = -1.0
    end: float = -1.0
    left: float = 0.0  # a DRAM transfer's bytes still to move
    due: float = 0.0  # a fixed-length op's finishing time


@dataclass
class ReferenceRun:
    """When every op started and ended (cycles from launch end), each unit's busy cycles, each core's LX peak."""

    ops: list[_Op]
    busy: dict[tuple[int, int], float]
    lx_peak: dict[int, int]

    @property
    def makespan(self) -> float:
        return max((o.end for o in self.ops), default=0.0)


def run_reference(kernel: TileProgram, cfg: SpyreConfig, capacity: int) -> ReferenceRun:
    """Simulate ``kernel`` by the firing rule above; raises :class:`LXOverflowError` when LX cannot hold it."""
    ops = _ops(kernel)
    send_of = {o.index: s for o in ops if o.unit == RECV for s in ops if s.op.kind is OpKind.RING_SEND
               and (s.core, s.op.tag) == (o.op.peer, o.op.tag)}
    recv_of = {id(s): r for r, s in ((r, send_of[r.index]) for r in ops if r.unit == RECV)}
    lx = {c: 0 for c in range(len(kernel.programs))}
    peak = dict(lx)
    busy: dict[tuple[int, int], float] = {}
    running: list[_Op] = []
    t = 0.0
    while any(o.end < 0 for o in ops):
        for o in _fire(ops, running, lx, peak, capacity, send_of, t):  # 1. fire
            o.left = o.op.nbytes
            o.due = t + fixed_cycles(o.op.kind, o.op.m, o.op.n, o.op.k, o.op.elements, o.op.nbytes, o.op.hops, cfg)
        if not running:
            _stuck(kernel, ops, lx, capacity)
        t, finished = _advance(running, t, cfg)  # 2. advance
        for o in finished:  # 3. retire
            running.remove(o)
            landed = [o, recv_of[id(o)]] if id(o) in recv_of else [o]
            for f in landed:
                f.end = t
                if f.unit != RECV:
                    busy[(f.core, f.unit)] = busy.get((f.core, f.unit), 0.0) + t - f.start
                _release(f, lx)
    return ReferenceRun(ops, busy, peak)


def _ops(kernel: TileProgram) -> list[_Op]:
    ops: list[_Op] = []
    for c, program in enumerate(kernel.programs):
        mine = [_Op(c, len(ops) + i, op, UNIT_INDEX[op.kind], len(op.deps), 0) for i, op in enumerate(program.ops)]
        for o in mine:
            o.producers = [mine[d] for d in o.op.deps]
            for p in o.producers:
                p.dependents.append(o)
            o.waiting_on += o.op.kind is OpKind.RING_SEND  # its receive must be posted first
        for o in mine:
            o.users_left = len(o.dependents)
        ops += mine
    return ops


def _fire(ops: list[_Op], running: list[_Op], lx: dict[int, int], peak: dict[int, int], capacity: int,
          send_of: dict[int, _Op], t: float) -> list[_Op]:
    """Start, at this instant, every op the rule lets start (posting a receive can free a send: repeat)."""
    started: list[_Op] = []
    changed = True
    while changed:
        changed = False
        for c in lx:
            mine = [o for o in ops if o.core == c and o.start < 0 and o.waiting_on == 0]
            busy_units = {o.unit for o in running if o.core == c}
            heads = [min((o for o in mine if o.unit == u), key=lambda o: o.index)
                     for u in {o.unit for o in mine} if u == RECV or u not in busy_units]
            for head in sorted(heads, key=lambda o: o.index):
                queue = sorted((o for o in mine if o.unit == RECV), key=lambda o: o.index) if head.unit == RECV \
                    else [head]
                for o in queue:
                    if lx[c] + o.op.out_bytes > capacity:
                        break  # waits until a buffer on this core is released
                    lx[c] += o.op.out_bytes
                    peak[c] = max(peak[c], lx[c])
                    o.start = t
                    if o.unit == RECV:  # posted: its send may fire now
                        send_of[o.index].waiting_on -= 1
                        changed = True
                    else:
                        running.append(o)
                        started.append(o)
    return started


def _advance(running: list[_Op], t: float, cfg: SpyreConfig) -> tuple[float, list[_Op]]:
    """Move time to the next finish; every op in flight progresses meanwhile. Returns (new time, finished ops)."""
    transfers = [o for o in running if o.unit in (LOAD, STORE)]
    reads = sum(o.op.dram_weight(cfg.dram_broadcast_cores) for o in transfers if o.unit == LOAD)
    writes = sum(o.op.dram_weight(cfg.dram_broadcast_cores) for o in transfers if o.unit == STORE)
    rate = dram_rate(reads, writes, cfg) if transfers else 0.0
    now = min([o.due for o in running if o not in transfers] + [t + o.left / rate for o in transfers])
    for o in transfers:
        o.left -= rate * (now - t)
    done = [o for o in running if (o.left <= 1e-9 * (1 + o.op.nbytes) if o in transfers else o.due <= now)]
    return now, sorted(done, key=lambda o: o.index)


def _release(finished: _Op, lx: dict[int, int]) -> None:
    """Wake the ops waiting on ``finished`` and free the LX buffers it was the last user of."""
    for d in finished.dependents:
        d.waiting_on -= 1
    for producer in finished.producers:
        producer.users_left -= 1
        if producer.users_left == 0:
            lx[finished.core] -= producer.op.out_bytes
    if not finished.dependents:
        lx[finished.core] -= finished.op.out_bytes


def _stuck(kernel: TileProgram, ops: list[_Op], lx: dict[int, int], capacity: int) -> None:
    for o in ops:
        if o.start < 0 and o.waiting_on == 0 and lx[o.core] + o.op.out_bytes > capacity:
            raise LXOverflowError(kernel.name, o.core, o.op.out_bytes, lx[o.core], capacity)
    raise RuntimeError(f"kernel {kernel.name!r} deadlocked: the remaining ops wait for ring transfers that never come")
