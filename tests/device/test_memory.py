import contextlib
import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spyre_lab.device.config import SPYRE, GiB, MiB
from spyre_lab.device.isa import LXOverflowError
from spyre_lab.device.memory import (
    Allocation,
    DeviceMemory,
    DeviceOutOfMemoryError,
    FreeList,
    Scratchpad,
    format_bytes,
)


def test_addresses_are_stick_aligned_and_sizes_rounded_up():
    mem = DeviceMemory(64 * 1024)
    a = mem.allocate(1, "a")
    b = mem.allocate(129, "b")
    c = mem.allocate(0, "empty")
    assert (a.address, a.nbytes, a.size) == (0, 1, 128)
    assert (b.address, b.size) == (128, 256)
    assert (c.address, c.nbytes, c.size) == (384, 0, 128)  # a zero-byte request still gets a real block
    assert all(x.address % 128 == 0 for x in (a, b, c))
    assert mem.allocated_bytes == 512 and mem.stats()["requested_bytes.all.current"] == 130


def test_freed_address_is_reused_first():
    mem = DeviceMemory(1 * MiB)
    a, b, _ = mem.allocate(1000), mem.allocate(1000), mem.allocate(1000)
    mem.free(b)
    assert mem.allocate(900).address == b.address
    mem.free(a.address)  # by address works too
    assert mem.allocate(1000).address == a.address


def test_neighbours_coalesce_into_one_block():
    mem = DeviceMemory(4096)
    a, b, c, d = (mem.allocate(1024, tag) for tag in "abcd")
    assert mem.free_bytes == 0
    for x in (a, c, b):  # middle last: it must join both sides
        mem.free(x)
    assert mem.free_blocks() == [(0, 3072)]
    big = mem.allocate(3072)
    assert big.address == 0
    mem.free(d)
    assert mem.free_blocks() == [(3072, 1024)]


def test_peak_and_fragmentation_on_a_hand_made_case():
    mem = DeviceMemory(10 * 1024)
    blocks = [mem.allocate(1024, str(i)) for i in range(10)]
    assert mem.peak_allocated_bytes == 10 * 1024 and mem.fragmentation == 0.0  # nothing free
    for i in (1, 3, 4, 7):
        mem.free(blocks[i])
    # free: [1024, 2048) [3072, 5120) [7168, 8192) -> 4 KiB free, largest 2 KiB
    assert mem.free_bytes == 4096 and mem.largest_free_block == 2048
    assert mem.fragmentation == pytest.approx(0.5)
    assert mem.peak_allocated_bytes == 10 * 1024 and mem.allocated_bytes == 6 * 1024
    mem.reset_peak()
    assert mem.peak_allocated_bytes == 6 * 1024
    stats = mem.stats()
    assert stats["allocated_bytes.all.current"] == 6 * 1024
    assert stats["allocation.all.current"] == 6 and stats["allocation.all.allocated"] == 10
    assert stats["allocation.all.freed"] == 4 and stats["num_free_blocks"] == 3
    mem.reset()
    assert mem.num_allocations == 0 and mem.free_bytes == 10 * 1024 and mem.fragmentation == 0.0


def test_out_of_memory_message_gives_numbers_and_a_way_out():
    mem = DeviceMemory(2 * GiB)
    keep = mem.allocate(GiB, "weights")
    with pytest.raises(DeviceOutOfMemoryError) as info:
        mem.allocate(int(1.5 * GiB), "kv_cache")
    err = info.value
    assert isinstance(err, RuntimeError) and isinstance(err, MemoryError)
    assert (err.requested, err.free, err.largest_free_block) == (int(1.5 * GiB), GiB, GiB)
    text = str(err)
    for needle in ("spyre:0", "1.50 GiB", "1.00 GiB free of 2.00 GiB", "largest free block 1.00 GiB",
                   "'kv_cache'", "smaller batch"):
        assert needle in text
    assert mem.stats()["num_ooms"] == 1
    mem.free(keep)
    assert mem.allocate(int(1.5 * GiB)).address == 0


def test_out_of_memory_from_fragmentation_says_so():
    mem = DeviceMemory(4096)
    blocks = [mem.allocate(1024) for _ in range(4)]
    mem.free(blocks[0])
    mem.free(blocks[2])
    with pytest.raises(DeviceOutOfMemoryError, match="fragmented"):
        mem.allocate(2048)


def test_bad_frees_are_explained():
    mem = DeviceMemory(8192)
    a = mem.allocate(256, "a")
    mem.free(a)
    with pytest.raises(ValueError, match="double free"):
        mem.free(a)
    again = mem.allocate(256, "b")  # same address handed out again
    with pytest.raises(ValueError, match=r"already freed.*tagged 'b'"):
        mem.free(a)
    with pytest.raises(ValueError, match="inside the allocation"):
        mem.free(again.address + 128)
    with pytest.raises(ValueError, match="never allocated"):
        mem.free(4096)
    mem.free(again)


@pytest.mark.parametrize(
    "call, error, needle",
    [
        (lambda: DeviceMemory(0), ValueError, "capacity"),
        (lambda: DeviceMemory(4096, alignment=96), ValueError, "power of two"),
        (lambda: DeviceMemory(4096).allocate(-1), ValueError, "negative"),
        (lambda: DeviceMemory(4096).allocate(1.5), TypeError, "int"),
    ],
)
def test_bad_arguments_name_the_problem(call, error, needle):
    with pytest.raises(error, match=needle):
        call()


def test_lx_overflow_error_fields():
    lx = Scratchpad.for_config(SPYRE, core=3)
    assert lx.capacity == 1_677_721 and lx.usable_bytes == 1_677_696  # whole sticks of the planner budget
    assert lx.allocate(1_000_000, "softmax.max") == 0
    with pytest.raises(LXOverflowError) as info:
        lx.allocate(700_000, "softmax.exp")
    err = info.value
    assert (err.kernel, err.core, err.requested, err.in_use, err.capacity) == (
        "softmax.exp", 3, 700_000, 1_000_064, 1_677_721)
    assert lx.in_use == 1_000_064 and lx.peak == 1_000_064


def test_lx_offsets_reuse_and_fragmentation_note():
    lx = Scratchpad(4096, core=1)
    a, b, c = lx.allocate(1024, "k"), lx.allocate(1024, "k"), lx.allocate(1024, "k")
    assert (a, b, c) == (0, 1024, 2048)
    lx.free(a)
    lx.free(c)
    assert lx.allocate(512, "k") == 0
    lx.free(b)
    assert lx.free_blocks() == [(512, 3584)]
    lx.allocate(3584, "k")
    lx.free(0)
    with pytest.raises(LXOverflowError):
        lx.allocate(1024, "k")
    lx.reset()
    lx.allocate(2048, "k")
    lx.free(0)
    lx.allocate(1024, "k")
    lx.allocate(1024, "k")
    lx.allocate(1024, "k")
    lx.free(1024)
    with pytest.raises(LXOverflowError) as info:
        lx.allocate(2048, "big")
    assert any("fragmented" in note for note in info.value.__notes__)


def test_format_bytes():
    assert format_bytes(100) == "100 B"
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(int(1.5 * GiB)) == "1.50 GiB"


# --- random alloc/free sequences against a brute-force model ---------------------------------------
class BruteForceFirstFit:
    """First fit the slow, obvious way: try every aligned address from 0 up."""

    def __init__(self, capacity: int, alignment: int) -> None:
        self.capacity, self.alignment, self.live = capacity, alignment, {}

    def allocate(self, nbytes: int) -> int | None:
        size = max(1, -(-nbytes // self.alignment)) * self.alignment
        candidates = sorted({0} | {a + s for a, s in self.live.items()})
        for start in candidates:
            fits = start + size <= self.capacity
            if fits and all(start + size <= a or a + s <= start for a, s in self.live.items()):
                self.live[start] = size
                return start
        return None


sizes = st.one_of(st.integers(0, 300), st.integers(0, 3000))
ops = st.lists(st.one_of(st.tuples(st.just("alloc"), sizes),
                         st.tuples(st.just("free"), st.integers(0, 10**6))), max_size=80)


@settings(max_examples=150, deadline=None)
@given(ops, st.sampled_from([128, 256]))
def test_random_sequences_match_brute_force_first_fit(sequence, alignment):
    capacity = 16 * 1024
    mem = DeviceMemory(capacity, alignment=alignment)
    model = BruteForceFirstFit(capacity, alignment)
    live: list[Allocation] = []
    for op, value in sequence:
        if op == "alloc":
            expected = model.allocate(value)
            if expected is None:
                with pytest.raises(DeviceOutOfMemoryError):
                    mem.allocate(value)
            else:
                got = mem.allocate(value)
                assert got.address == expected
                live.append(got)
        elif live:
            victim = live.pop(value % len(live))
            mem.free(victim)
            del model.live[victim.address]
        check_invariants(mem, live, capacity)


def check_invariants(mem: DeviceMemory, live: list[Allocation], capacity: int) -> None:
    spans = sorted((a.address, a.end) for a in live)
    assert all(end <= nxt for (_, end), (nxt, _) in itertools.pairwise(spans)), "live allocations overlap"
    free = mem.free_blocks()
    assert all(a + s < b for (a, s), (b, _) in itertools.pairwise(free)), "free blocks not coalesced / sorted"
    pieces = sorted(spans + [(a, a + s) for a, s in free])
    covered = 0
    for start, end in pieces:  # live + free tile the whole memory exactly
        assert start == covered
        covered = end
    assert covered == capacity
    assert mem.free_bytes == sum(s for _, s in free) == capacity - mem.allocated_bytes
    assert mem.largest_free_block == max((s for _, s in free), default=0)


def test_free_list_stays_consistent_under_heavy_churn():
    rng = random.Random(7)
    mem = DeviceMemory(1 << 22)
    live: list[Allocation] = []
    for step in range(3000):
        if live and rng.random() < 0.4:
            mem.free(live.pop(rng.randrange(len(live))))
        else:
            with contextlib.suppress(DeviceOutOfMemoryError):
                live.append(mem.allocate(rng.choice([0, 64, 128, 1000, 4096, 20000, 200_000])))
        if step % 500 == 0:
            check_invariants(mem, live, 1 << 22)
    check_invariants(mem, live, 1 << 22)
    while live:
        mem.free(live.pop())
    assert mem.stats()["num_ooms"] > 0  # the churn really ran the memory full
    assert mem.free_blocks() == [(0, 1 << 22)]


def test_free_list_refuses_a_range_that_is_already_free():
    free = FreeList(0, 1024)
    assert free.take_first_fit(256) == 0
    with pytest.raises(ValueError, match="overlaps"):
        free.give_back(128, 256)
