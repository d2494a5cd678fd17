"""Discrete-event simulation of one kernel: every tile op on every core, fired by the dataflow rule.

An op fires when (1) every op it depends on has finished, (2) its unit is free and (3) if it
writes an LX buffer, its core's LX has room for it. Each unit (load DMA, PT, SFU, store DMA, ring)
runs one op at a time and, among its ready ops, takes the earliest in program order. Nothing else
orders the ops: loads run ahead into free LX space and stall when it is full, so double and
multi-buffering emerge from the dependencies the compiler emits and the LX capacity.

DRAM is one shared resource. Every in-flight load or store progresses at
``min(core_dma_bytes_per_cycle, 1 / (reads + writes) / peak + turnaround * min(reads, writes)))``
(processor sharing of a bus that turns around between reads and writes, see
:func:`~spyre_lab.device.sim_costs.dram_rate`; a load broadcast to ``share`` cores counts as
``1/share`` of a transfer; re-evaluated whenever a transfer starts or ends). Because all transfers share one rate, one
"virtual service" counter tracks them all: a transfer started when the counter read ``S`` with
``b`` bytes finishes when it reads ``S + b``; a heap keyed on that value gives the next finisher
in O(log n), however often the rate changes.

Ring: a ``ring_recv`` is *posted* (claims its LX buffer) once its deps are done and LX has room;
the matching ``ring_send`` fires only after that (credit-based flow control: the sender never
pushes into a receiver that has no buffer for it) and occupies the sender's ring unit; the
receive completes with the send.
"""

from __future__ import annotations

from heapq import heappop, heappush

from spyre_lab.device.config import SpyreConfig
from spyre_lab.device.isa import LXOverflowError, OpKind, TileProgram
from spyre_lab.device.sim_costs import LOAD, PT, RECV, RING, SFU, STORE, UNIT_INDEX, EngineRun, fixed_cycles

_INF = float("inf")
_KIND_NAME = {kind: kind.value for kind in OpKind}  # Enum.value is a slow descriptor; looked up once per op


class _Graph:
    """Every core's ops flattened into global ids (program order is id order within a core)."""

    def __init__(self, kernel: TileProgram, cfg: SpyreConfig, capacity: int) -> None:
        self.unit: list[int] = []
        self.cost: list[float] = []  # cycles for PT/SFU/ring ops, bytes for DRAM ops
        self.out_b: list[int] = []
        self.core_of: list[int] = []
        self.weight: list[float] = []  # DRAM bandwidth a transfer draws (below 1 for broadcast loads)
        self.dram_bytes = 0.0
        self.deps_of: list[tuple[int, ...]] = []
        self.deps_left: list[int] = []
        self.dependents: list[list[int]] = []
        self.send_of: dict[int, int] = {}  # receive -> its send
        self.recv_of: dict[int, int] = {}  # send -> its receive
        bytes_loaded = bytes_stored = ring_bytes = flops = macs = 0
        matmul_cores: set[int] = set()
        unit, cost, out_b, core_of = self.unit, self.cost, self.out_b, self.core_of
        deps_of, deps_left, dependents = self.deps_of, self.deps_left, self.dependents
        sends_by_tag: dict[tuple[int, str | None], int] = {}
        recvs: list[tuple[int, int | None, str | None]] = []
        cycle_cache: dict[tuple, float] = {}
        for c, program in enumerate(kernel.programs):
            base = len(unit)
            for i, op in enumerate(program.ops):
                kind = op.kind
                u = UNIT_INDEX[kind]
                if op.out_bytes > capacity:
                    raise LXOverflowError(kernel.name, c, op.out_bytes, 0, capacity)
                if u in (LOAD, STORE):
                    cost.append(op.nbytes)
                    self.weight.append(op.dram_weight(cfg.dram_broadcast_cores))
                    self.dram_bytes += op.nbytes * self.weight[-1]
                    if u == LOAD:
                        bytes_loaded += op.nbytes
                    else:
                        bytes_stored += op.nbytes
                else:
                    self.weight.append(0.0)
                    key = (kind, op.m, op.n, op.k, op.elements, op.nbytes, op.hops)
                    cycles = cycle_cache.get(key)
                    if cycles is None:
                        cycles = cycle_cache[key] = fixed_cycles(kind, op.m, op.n, op.k, op.elements, op.nbytes,
                                                                 op.hops, cfg)
                    cost.append(cycles)
                    if u == PT:
                        flops += 2 * op.m * op.n * op.k
                        macs += op.m * op.n * op.k
                        matmul_cores.add(c)
                    elif u == SFU:
                        flops += op.elements
                    elif u == RING:
                        ring_bytes += op.nbytes
                        sends_by_tag[(c, op.tag)] = base + i
                    else:
                        recvs.append((base + i, op.peer, op.tag))
                unit.append(u)
                out_b.append(op.out_bytes)
                core_of.append(c)
                deps = tuple(base + d for d in op.deps) if base else op.deps
                deps_of.append(deps)
                deps_left.append(len(deps))
                dependents.append([])
                g = base + i
                for d in deps:
                    dependents[d].append(g)
        for r, peer, tag in recvs:
            s = sends_by_tag[(peer, tag)]
            self.send_of[r], self.recv_of[s] = s, r
            deps_left[s] += 1  # a send also waits for its receive to be posted
        self.bytes_loaded, self.bytes_stored, self.ring_bytes = bytes_loaded, bytes_stored, ring_bytes
        self.flops, self.macs, self.matmul_cores = flops, macs, len(matmul_cores)


def run_event(kernel: TileProgram, cfg: SpyreConfig, capacity: int, want_events: bool) -> EngineRun:
    """Simulate ``kernel`` op by op; raises :class:`LXOverflowError` when LX cannot hold what it needs."""
    graph = _Graph(kernel, cfg, capacity)
    timing = _Timing(len(kernel.programs), len(graph.unit))
    _simulate(kernel, graph, timing, cfg, capacity)
    return _result(kernel, graph, timing, want_events, cfg)


class _Timing:
    """What the simulation finds out: when each op ran, each unit's busy cycles, each core's LX peak."""

    def __init__(self, ncores: int, total: int) -> None:
        self.start = [0.0] * total
        self.end = [0.0] * total
        self.busy_cycles = [[0.0] * 5 for _ in range(ncores)]
        self.peak = [0] * ncores
        self.recv_xfer_start: dict[int, float] = {}  # receive -> when its send started moving bytes


def _result(kernel: TileProgram, graph: _Graph, timing: _Timing, want_events: bool, cfg: SpyreConfig) -> EngineRun:
    programs = kernel.programs
    ncores = len(programs)
    busy = {(c, u): timing.busy_cycles[c][u] for c in range(ncores) if len(programs[c]) for u in range(5)}
    compute_busy = _compute_union(ncores, graph.unit, graph.core_of, timing.start, timing.end)
    run = EngineRun(makespan=max(timing.end, default=0.0), busy=busy, compute_busy=compute_busy,
                    lx_peak={c: timing.peak[c] for c in range(ncores) if len(programs[c])},
                    bytes_loaded=graph.bytes_loaded, bytes_stored=graph.bytes_stored, ring_bytes=graph.ring_bytes,
                    dram_bytes=graph.dram_bytes,
                    flops=graph.flops, macs=graph.macs, matmul_cores=graph.matmul_cores)
    if want_events:
        run.events = _events(programs, graph.unit, timing.start, timing.end, timing.recv_xfer_start,
                             graph.deps_of, graph.dependents, 1e6 / cfg.clock_hz)
    return run


def _simulate(kernel: TileProgram, graph: _Graph, timing: _Timing, cfg: SpyreConfig, capacity: int) -> None:
    """The event loop: (1) fire what may start, (2) advance to the next completion, (3) retire it; repeat.

    Written as one flat loop with local names, no helper calls: it runs once per op, and a call per
    phase would cost more than the phase does (the benchmark counts tile ops simulated per second).
    """
    ncores = len(kernel.programs)
    unit, cost, out_b, core_of, weight = graph.unit, graph.cost, graph.out_b, graph.core_of, graph.weight
    deps_of, deps_left, dependents = graph.deps_of, graph.deps_left, graph.dependents
    send_of, recv_of = graph.send_of, graph.recv_of
    total = len(unit)
    start, end, busy_cycles, peak = timing.start, timing.end, timing.busy_cycles, timing.peak
    recv_xfer_start = timing.recv_xfer_start

    # Per core: a heap of ready op ids per unit (index RECV holds posted-receive candidates), which
    # unit is busy, and LX in use.
    ready = [[[] for _ in range(6)] for _ in range(ncores)]
    busy_unit = [[False] * 5 for _ in range(ncores)]
    lx = [0] * ncores
    consumers = [len(ds) for ds in dependents]
    events: list[tuple[float, int]] = []  # fixed-duration completions: (end cycle, op)
    xfers: list[tuple[float, int]] = []  # DRAM transfers: (virtual service at completion, op)
    service = rate = 0.0
    inflight = 0  # transfers in flight
    reading = writing = 0.0  # their summed DRAM weights, loads and stores: see sim_costs.dram_rate
    dma_cap = float(cfg.core_dma_bytes_per_cycle)
    per_byte = 1.0 / cfg.dram_bytes_per_cycle
    turnaround = cfg.dram_turnaround_cycles_per_byte
    for g in range(total):
        if deps_left[g] == 0:
            ready[core_of[g]][unit[g]].append(g)  # ascending ids are already a heap
    dirty_flag = [True] * ncores  # cores whose ready ops may be able to start
    dirty = list(range(ncores - 1, -1, -1))

    t = t_last = 0.0
    done = 0
    while True:
        # 1. fire: on every core something changed on, start what may start, earliest op first
        while dirty:
            c = dirty.pop()
            dirty_flag[c] = False
            queues, busy_c = ready[c], busy_unit[c]
            cands = [(q[0], u) for u, q in enumerate(queues) if q and (u == RECV or not busy_c[u])]
            if len(cands) > 1:
                cands.sort()
            for g, u in cands:
                q = queues[u]
                while True:
                    need = out_b[g]
                    if need:
                        if lx[c] + need > capacity:
                            break  # stalls until a buffer on this core is released
                        lx[c] += need
                        if lx[c] > peak[c]:
                            peak[c] = lx[c]
                    heappop(q)
                    start[g] = t
                    if u == RECV:  # posted: the sender may now push into it; post the next receive too
                        s = send_of[g]
                        deps_left[s] -= 1
                        if deps_left[s] == 0:
                            sc = core_of[s]
                            heappush(ready[sc][RING], s)
                            if not dirty_flag[sc]:
                                dirty_flag[sc] = True
                                dirty.append(sc)
                        if q:
                            g = q[0]
                            continue
                        break
                    busy_c[u] = True
                    if u in (LOAD, STORE):
                        heappush(xfers, (service + cost[g], g))
                        inflight += 1
                        if u == LOAD:
                            reading += weight[g]
                        else:
                            writing += weight[g]
                        rate = min(dma_cap, 1.0 / (per_byte * (reading + writing)
                                                   + turnaround * min(reading, writing)))
                    else:
                        heappush(events, (t + cost[g], g))
                    break
        if done == total:
            break

        # 2. advance to the next completion: a fixed-duration op or the first DRAM transfer to finish
        t_fixed = events[0][0] if events else _INF
        t_dram = t_last + max(0.0, xfers[0][0] - service) / rate if inflight else _INF
        if t_fixed == _INF and t_dram == _INF:
            _raise_stuck(kernel, ready, busy_unit, out_b, lx, capacity, ncores, done, total)
        if t_dram <= t_fixed:
            t = t_dram
            service = max(service, xfers[0][0])
        else:
            t = t_fixed
            if inflight:
                service += rate * (t - t_last)
        t_last = t
        completed: list[int] = []
        while events and events[0][0] <= t:
            completed.append(heappop(events)[1])
        if inflight:
            limit = service + 1e-9 * (1.0 + service)
            while xfers and xfers[0][0] <= limit:
                g = heappop(xfers)[1]
                completed.append(g)
                inflight -= 1
                if unit[g] == LOAD:
                    reading -= weight[g]
                else:
                    writing -= weight[g]
            if not inflight:
                reading = writing = 0.0  # no float residue across idle periods
            rate = (min(dma_cap, 1.0 / (per_byte * (reading + writing) + turnaround * min(reading, writing)))
                    if inflight else 0.0)

        # 3. retire: free the unit, wake dependents, release buffers whose last user is done
        for g in completed:
            if unit[g] == RING and g in recv_of:  # the receive lands with its send
                r = recv_of[g]
                recv_xfer_start[r] = start[g]
                finished = (g, r)
            else:
                finished = (g,)
            for f in finished:
                end[f] = t
                done += 1
                c = core_of[f]
                u = unit[f]
                if u != RECV:
                    busy_unit[c][u] = False
                    busy_cycles[c][u] += t - start[f]
                queues = ready[c]
                ds = dependents[f]
                for d in ds:
                    deps_left[d] -= 1
                    if deps_left[d] == 0:
                        heappush(queues[unit[d]], d)
                for p in deps_of[f]:
                    consumers[p] -= 1
                    if consumers[p] == 0 and out_b[p]:
                        lx[c] -= out_b[p]
                if not ds and out_b[f]:
                    lx[c] -= out_b[f]
                if not dirty_flag[c]:
                    dirty_flag[c] = True
                    dirty.append(c)


def _compute_union(ncores: int, unit: list[int], core_of: list[int], start: list[float],
                   end: list[float]) -> dict[int, float]:
    """Per core, cycles during which PT or SFU was busy (overlapping PT and SFU time counted once)."""
    spans: list[list[tuple[float, float]]] = [[] for _ in range(ncores)]
    for g, u in enumerate(unit):
        if u in (PT, SFU):
            spans[core_of[g]].append((start[g], end[g]))
    union: dict[int, float] = {}
    for c, intervals in enumerate(spans):
        intervals.sort()
        total, cursor = 0.0, -_INF
        for s, e in intervals:
            s = max(s, cursor)
            if e > s:
                total += e - s
                cursor = e
        union[c] = total
    return union


def _events(programs: list, unit: list[int], start: list[float], end: list[float],
            recv_xfer_start: dict[int, float], deps_of: list[tuple[int, ...]], dependents: list[list[int]],
            us_per_cycle: float) -> list[tuple[int, int, str, float, float, dict]]:
    """One event per op. Args say what a picture of the firing needs: ``idx`` (the op's index on its core),
    ``trigger`` (index of the dep that finished last: the arrival that made the op ready) and, for an op that
    claims LX, ``lx_held_us`` (from the event's start until the buffer is released by its last user)."""
    out = []
    g = 0
    for c, program in enumerate(programs):
        base = g
        for i, op in enumerate(program.ops):
            u = unit[g]
            s = recv_xfer_start.get(g, start[g]) if u == RECV else start[g]
            args: dict = {"op": _KIND_NAME[op.kind], "idx": i}
            if deps_of[g]:
                args["trigger"] = max(deps_of[g], key=end.__getitem__) - base
            if op.out is not None:
                users = dependents[g]
                args["lx_held_us"] = ((max(end[d] for d in users) if users else end[g]) - s) * us_per_cycle
            if op.kind is OpKind.MATMUL:
                args.update(m=op.m, n=op.n, k=op.k)
            elif op.elements:
                args["elements"] = op.elements
            else:
                args["bytes"] = op.nbytes
            if op.out is not None:
                args["buffer"] = op.out
                args["buffer_bytes"] = op.out_bytes
            if op.tag is not None:
                args.update(peer=op.peer, tag=op.tag)
            if u == RECV:
                args["posted_cycle"] = start[g]
            out.append((c, RING if u == RECV else u, op.name, s, end[g] - s, args))
            g += 1
    return out


def _raise_stuck(kernel: TileProgram, ready: list[list[list[int]]], busy_unit: list[list[bool]], out_b: list[int],
                 lx: list[int], capacity: int, ncores: int, done: int, total: int) -> None:
    """Nothing is running and ops remain: name the LX overflow (or the ring wait) that blocks them."""
    for c in range(ncores):
        for u, q in enumerate(ready[c]):
            if q and (u == RECV or not busy_unit[c][u]) and lx[c] + out_b[q[0]] > capacity:
                raise LXOverflowError(kernel.name, c, out_b[q[0]], lx[c], capacity)
    raise RuntimeError(
        f"kernel {kernel.name!r} deadlocked after {done} of {total} ops: the remaining ops wait for ring "
        "transfers that can never happen (a ring_send whose ring_recv depends on it, directly or across cores); "
        "post each ring_recv before the ops that wait on its peer"
    )
