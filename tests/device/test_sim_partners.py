"""Ring partners of one shape are timed once: the analytic answer is the full pass's, and what differs is honoured."""

from __future__ import annotations

from spyre_lab.device.config import SPYRE
from spyre_lab.device.isa import CoreOps, OpKind, TileProgram
from spyre_lab.device.sim import simulate
from spyre_lab.device.sim_partners import partner_shapes


def _group_programs(heavy_sender_group: int, groups: int = 4) -> list[CoreOps]:
    """``groups`` K-split pairs: rank 0 loads and multiplies its half and sends the partial sum to rank 1, which
    adds it to its own and stores. As codegen does, every group's cores reuse group 0's op objects with only the
    ring ops re-aimed; the rank-0 core of ``heavy_sender_group`` loads four times more (its own program)."""
    def sender(load_bytes: int) -> CoreOps:
        p = CoreOps()
        w = p.load("w", load_bytes)
        mm = p.matmul("acc", 64, 64, 256, deps=[w], out_bytes=8192)
        p.ring_send(8192, peer=1, hops=1, tag="g0", deps=[mm])
        return p

    receiver = CoreOps()
    w = receiver.load("w", 65536)
    mm = receiver.matmul("acc", 64, 64, 256, deps=[w], out_bytes=8192)
    got = receiver.ring_recv("psum", 8192, peer=0, tag="g0")
    receiver.store(8192, deps=[receiver.vector(None, 4096, deps=[mm, got])])
    template = sender(65536)
    programs = []
    for g in range(groups):
        a, b, tag = 2 * g, 2 * g + 1, f"g{g}"
        first = sender(4 * 65536) if g == heavy_sender_group else template
        programs.append(CoreOps([op.evolved(peer=b, tag=tag) if op.kind is OpKind.RING_SEND else op
                                 for op in first.ops]))
        programs.append(CoreOps([op.evolved(peer=a, tag=tag) if op.kind is OpKind.RING_RECV else op
                                 for op in receiver.ops]))
    return programs


def _fresh(programs: list[CoreOps]) -> list[CoreOps]:
    """The same programs with every op its own object: nothing for the simulator to share."""
    return [CoreOps([op.evolved() for op in p.ops]) for p in programs]


def test_partner_cores_are_found_and_timed_as_the_full_pass_times_them():
    programs = _group_programs(heavy_sender_group=2)
    shared = TileProgram.from_programs("ksplit", programs, SPYRE.cores)
    fresh = TileProgram.from_programs("ksplit", _fresh(programs), SPYRE.cores)
    active = shared.active_cores
    shapes = partner_shapes(shared.programs, active, {c: c for c in active})
    assert {c for c, s in shapes.items() if s.first == 1} == {1, 3, 5, 7}    # every receiver is group 0's shape
    assert {c for c, s in shapes.items() if s.first == 0} == {0, 2, 6}       # group 2's sender loads more
    assert not partner_shapes(fresh.programs, active, {c: c for c in active})
    quick, full = simulate(shared, mode="analytic", trace=False), simulate(fresh, mode="analytic", trace=False)
    assert quick.time_us == full.time_us
    assert quick.busy_us == full.busy_us and list(quick.busy_us) == list(full.busy_us)
    assert (quick.core_utilization, quick.lx_peak, quick.dram_bytes) == (full.core_utilization, full.lx_peak,
                                                                          full.dram_bytes)
    # the heavy group's receiver waits longer for its partial sum and ends the kernel: had it been given group 0's
    # receiver's timing (same ops, other landing time), the kernel would end earlier
    light = simulate(TileProgram.from_programs("ksplit", _group_programs(heavy_sender_group=-1), SPYRE.cores),
                     mode="analytic", trace=False)
    assert quick.time_us > light.time_us


def test_a_core_whose_ring_op_talks_to_itself_is_not_a_partner():
    programs = _group_programs(heavy_sender_group=-1, groups=2)
    programs[3] = CoreOps([op.evolved(peer=3) if op.kind is OpKind.RING_RECV else op for op in programs[3].ops])
    active = list(range(4))
    shapes = partner_shapes(programs, active, {c: c for c in active})
    assert 3 not in shapes and shapes[2].first == 0
