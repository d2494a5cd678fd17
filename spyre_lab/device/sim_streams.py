"""What each core's DRAM streams are and the rates the card gives them: the analytic model's first passes.

Before :func:`~spyre_lab.device.sim_analytic.run_analytic` places any op it reads every core's program once:
how many bytes the core loads and stores, where its last load sits, which cores send it ring data, how much
DRAM its loads draw (a broadcast load is read once for its group), and from all cores together the read/write
mix DRAM runs at while their streams overlap. From those come each core's rate (water-filling), the rate of a
store in the drain, and how much every transfer must slow down for DRAM to move the whole kernel. Cores that
share one program (``same_as``) or run one program but for their ring partners (``shapes``) are read once.
"""

from __future__ import annotations

from collections.abc import Iterable

from spyre_lab.device.config import SpyreConfig
from spyre_lab.device.isa import OpKind, TileOp, TileProgram
from spyre_lab.device.sim_partners import PartnerShape

_LOAD, _STORE, _SEND, _RECV = OpKind.LOAD, OpKind.STORE, OpKind.RING_SEND, OpKind.RING_RECV


Survey = tuple[dict[int, int], dict[int, int], dict[int, int], dict[int, set[int]], set[int], dict[int, float]]


def survey(kernel: TileProgram, active: list[int], same_as: dict[int, int], shapes: dict[int, PartnerShape],
           cfg: SpyreConfig) -> Survey:
    """Per core: bytes loaded, bytes stored, index of its last load (-1 if none), the cores it
    receives ring data from; the cores without ring ops; and per core the DRAM weight of its
    stream (DRAM bytes drawn per byte moved: below 1 when loads are broadcast). A core of a partner
    shape takes its first core's totals and reads only its own receives for its senders."""
    drawn: dict[int, float] = {}
    loads: dict[int, int] = {}
    stores: dict[int, int] = {}
    last_load: dict[int, int] = {}
    senders: dict[int, set[int]] = {}
    ringless: set[int] = set()
    broadcast = cfg.dram_broadcast_cores
    for c in active:
        twin = same_as[c]
        shape = shapes.get(c)
        if (twin != c and twin in ringless) or (shape is not None and shape.first != c):
            twin = twin if shape is None else shape.first
            loads[c], stores[c], last_load[c], drawn[c] = loads[twin], stores[twin], last_load[twin], drawn[twin]
            if shape is None:
                ringless.add(c)
            else:
                ops = kernel.programs[c].ops
                _add_senders(senders, c, [ops[j] for j in shape.recvs])
            continue
        ops = kernel.programs[c].ops
        loaded = stored = 0
        from_dram = 0.0
        last = -1
        ring = False
        for i, op in enumerate(ops):
            kind = op.kind
            if kind is _LOAD:
                loaded += op.nbytes
                from_dram += op.nbytes * (1.0 / min(op.share, broadcast))   # TileOp.dram_weight, inline
                last = i
            elif kind is _STORE:
                stored += op.nbytes
            elif kind is _RECV or kind is _SEND:
                ring = True
                if kind is _RECV:
                    _add_senders(senders, c, (op,))
        loads[c], stores[c], last_load[c] = loaded, stored, last
        drawn[c] = (from_dram + stored) / (loaded + stored) if loaded + stored else 1.0
        if not ring:
            ringless.add(c)
    return loads, stores, last_load, senders, ringless, drawn


def _add_senders(senders: dict[int, set[int]], core: int, recvs: Iterable[TileOp]) -> None:
    """Note the cores (other than ``core``) whose sends ``core``'s receives wait for."""
    for op in recvs:
        if op.peer is not None and op.peer != core:
            senders.setdefault(core, set()).add(op.peer)


def drain_rate(kernel: TileProgram, stores: dict[int, int], last_load: dict[int, int], cfg: SpyreConfig) -> float:
    """The rate of a store issued after its core's last load: the cores that store then share DRAM.

    The main streams are over by then, so a core finishing with a store (the one core of a K-split
    group that writes the result) gets the bandwidth the finished cores left, shared only with the
    other cores that also end in a store.
    """
    draining = 0
    for c, stored in stores.items():
        if stored and (last_load[c] < 0 or kernel.programs[c].ops[-1].kind is _STORE):
            draining += 1
    return min(float(cfg.core_dma_bytes_per_cycle), cfg.dram_bytes_per_cycle / max(1, draining))


def stream_mix(kernel: TileProgram, active: list[int], same_as: dict[int, int], shapes: dict[int, PartnerShape],
               last_load: dict[int, int], cfg: SpyreConfig) -> float:
    """DRAM's rate (bytes per cycle) at the read/write mix its streams make while they overlap.

    The bus turns around only for reads and writes in flight together: a store while its core still
    loads overlaps the core's next loads, which move as many bytes meanwhile (one transfer each at the
    same fair rate) but draw only their broadcast weight from DRAM. A store after the core's last load
    runs in the drain, one way. Overlap over all bytes gives the rate, as ``cfg.dram_bytes_per_cycle_at``.
    """
    moved = overlap = 0.0
    mixes: dict[int, tuple[float, float, float, int, list[int]]] = {}
    for c in active:
        if same_as[c] != c:
            continue
        twins = sum(1 for d in active if same_as[d] == c)
        shape = shapes.get(c)
        first = c if shape is None else shape.first
        mix = mixes.get(first)
        if mix is None:
            mix = _core_mix(kernel.programs[c].ops, last_load[c], cfg.dram_broadcast_cores)
            if shape is not None:
                mixes[first] = mix
        reads, writes, weights, loads, stored = mix
        for nbytes in stored:                   # added one by one, in program order: the same float sums
            moved += twins * nbytes
        moved += twins * reads
        overlap += twins * min(reads, writes * weights / loads) if loads else 0.0
    per_byte = overlap / moved if moved else 0.0
    return 1.0 / (1.0 / cfg.dram_bytes_per_cycle + cfg.dram_turnaround_cycles_per_byte * per_byte)


def _core_mix(ops: list[TileOp], last_load: int, broadcast: int) -> tuple[float, float, float, int, list[int]]:
    """One core's DRAM reads (by broadcast weight), its writes while it still loads, its loads' summed weights,
    its load count and every store's bytes in program order."""
    reads = writes = weights = 0.0
    loads = 0
    stored: list[int] = []
    for i, op in enumerate(ops):
        if op.kind is _LOAD:
            weight = 1.0 / min(op.share, broadcast)                      # TileOp.dram_weight, inline
            reads += op.nbytes * weight
            weights += weight
            loads += 1
        elif op.kind is _STORE:
            stored.append(op.nbytes)
            writes += op.nbytes if i < last_load else 0
    return reads, writes, weights, loads, stored


def dram_rates(loads: dict[int, int], stores: dict[int, int], drawn: dict[int, float], dram: float,
                cfg: SpyreConfig) -> tuple[dict[int, float], float]:
    """Per core, the average rate its longer DRAM stream gets; and how much slower every transfer must go
    for the card's DRAM to move all the kernel's bytes (1 if it keeps up).

    Water-filling: all streams start together and share DRAM equally (each capped by a DMA
    engine); when the smallest one is done, the rest share what it leaves. So a core that streams
    less than the others finishes early, and the biggest one runs faster at the end. A stream
    whose loads are broadcast draws only ``drawn[c]`` of DRAM per byte it moves. DRAM runs at the
    rate of the read/write mix of the overlapping streams (``cfg.dram_bytes_per_cycle_at``, see :func:`stream_mix`).
    """
    dma = float(cfg.core_dma_bytes_per_cycle)
    volumes = sorted((max(loads[c], stores[c]), c) for c in loads if loads[c] or stores[c])
    rates: dict[int, float] = {}
    clock = moved = 0.0
    shares = [drawn[c] for _, c in volumes]      # summed from each stream on, in order (the same float sums)
    for i, (volume, c) in enumerate(volumes):
        clock += (volume - moved) / min(dma, dram / sum(shares[i:]))
        moved = volume
        rates[c] = volume / clock if clock > 0 else dma
    card_floor = sum((loads[c] + stores[c]) * drawn[c] for c in loads) / dram
    return rates, max(1.0, card_floor / clock) if clock > 0 else 1.0


