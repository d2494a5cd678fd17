"""spyreccl on real processes: numerics equal gloo's on the CPU, refusals, modeled time, failures.

Every multi-process check shares one 4-rank run (a process start costs seconds of CPU on 2 cores).
"""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from spyre_lab.distributed import (
    SpyreCCLNotSupportedError,
    allreduce_cost,
    card_link,
    host_staged_link,
    set_card_link,
)
from spyre_lab.distributed.launch import RankFailedError, run_ranks

WORKERS = Path(__file__).with_name("ccl_workers.py")
SIZES = [64, 4096, 262144]
WORLD = 4


@pytest.fixture(scope="module")
def four_ranks() -> list[dict]:
    return run_ranks(WORKERS, "everything", WORLD, args=(SIZES,), timeout_s=90)


def test_init_string_builds_a_spyreccl_group(four_ranks: list[dict]) -> None:
    assert [r["numerics"]["backend"] for r in four_ranks] == ["cpu:gloo,spyre:spyreccl"] * WORLD


def test_collectives_on_spyre_equal_the_cpu_result(four_ranks: list[dict]) -> None:
    for rank, result in enumerate(four_ranks):
        assert result["numerics"]["failures"] == [], f"rank {rank}"


@pytest.mark.parametrize("op", ["scatter", "reduce_scatter", "alltoall", "_allgather_base", "allreduce_coalesced",
                                "_reduce_scatter_base", "alltoall_base"])
def test_unsupported_collectives_raise_with_the_workaround(four_ranks: list[dict], op: str) -> None:
    for result in four_ranks:
        message = result["unsupported"][op]
        assert message.startswith(f"spyreccl does not support {op}"), message
        assert "workaround:" in message


def test_refused_collectives_still_serve_cpu_tensors_through_gloo(four_ranks: list[dict]) -> None:
    for rank, result in enumerate(four_ranks):
        assert result["unsupported"]["cpu scatter"] == [float(rank)] * 4
        assert result["unsupported"]["cpu all_to_all_single"] == [float(r) for r in range(WORLD) for _ in range(4)]


def test_modeled_allreduce_is_charged_on_the_card_lane_by_the_ring_algorithm(four_ranks: list[dict]) -> None:
    for rank, result in enumerate(four_ranks):
        for entry in result["timed"]:
            assert f"card{rank}.ccl" in entry["lanes"]
            (event,) = entry["events"]
            want = allreduce_cost(2 * entry["n"], WORLD)
            assert event["name"] == "allreduce [ring]"
            assert event["bytes"] == 2 * entry["n"] and event["rounds"] == 2 * (WORLD - 1)
            assert event["dur_us"] == pytest.approx(want.us)


def test_ring_allreduce_time_is_latency_plus_the_ring_share_of_bytes() -> None:
    link = card_link()
    for k in (2, 4, 8):
        small, big = allreduce_cost(2, k), allreduce_cost(2 + 1 << 24, k)
        slope = (big.us - small.us) / ((2 + 1 << 24) - 2)
        assert slope == pytest.approx(2 * (k - 1) / k / link.bandwidth * 1e6)
        assert allreduce_cost(0, k).us == pytest.approx(2 * (k - 1) * link.latency_us)
    assert allreduce_cost(1 << 20, 1).us == 0.0
    assert allreduce_cost(1 << 20, 8).us > allreduce_cost(1 << 20, 4).us > allreduce_cost(1 << 20, 2).us


def test_the_card_link_estimate_is_one_switch() -> None:
    before = allreduce_cost(1 << 20, 4).us
    previous = set_card_link(bandwidth=card_link().bandwidth * 2)
    try:
        faster = allreduce_cost(1 << 20, 4).us
    finally:
        set_card_link(previous.bandwidth, previous.latency_us)
    assert faster < before
    assert allreduce_cost(1 << 20, 4).us == pytest.approx(before)
    with pytest.raises(ValueError, match="bandwidth must be > 0"):
        set_card_link(bandwidth=0)


def test_the_card_link_estimate_comes_from_the_device_config() -> None:
    from spyre_lab.device.config import SPYRE
    from spyre_lab.distributed.links import CardLinkEstimate

    assert (card_link().bandwidth, card_link().latency_us) == (SPYRE.card_link_bandwidth, SPYRE.card_link_latency_us)
    slow = CardLinkEstimate.of(SPYRE.replace(card_link_bandwidth=SPYRE.card_link_bandwidth / 4)).link()
    assert slow.estimate and "(estimate)" in slow.describe()
    assert allreduce_cost(1 << 20, 4, link=slow).us > allreduce_cost(1 << 20, 4).us


def test_unknown_algorithm_names_the_choices() -> None:
    with pytest.raises(ValueError, match="ring"):
        allreduce_cost(8, 2, algorithm="butterfly")


def test_a_rank_that_raises_gives_a_clear_error_and_leaves_no_process() -> None:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(RankFailedError, match="rank 1 failed") as info:
        run_ranks(WORKERS, "raises_on", 2, args=(1,), timeout_s=30)
    assert info.value.rank == 1
    assert "deliberate failure on rank 1" in info.value.cause
    left = {p.pid for p in psutil.Process().children(recursive=True)} - before
    assert left == set()


def test_the_rank_that_raised_is_named_even_when_the_peer_it_left_exits_first() -> None:
    with pytest.raises(RankFailedError, match="rank 1 failed") as info:
        run_ranks(WORKERS, "raises_and_exits_late_on", 2, args=(1,), timeout_s=30)
    assert "deliberate failure on rank 1" in info.value.cause


def test_a_rank_that_dies_is_named_with_its_exit_code() -> None:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(RankFailedError, match="rank 0 failed: exit code 3"):
        run_ranks(WORKERS, "dies_on", 2, args=(0,), timeout_s=30)
    assert {p.pid for p in psutil.Process().children(recursive=True)} - before == set()


def test_bad_world_size_is_refused() -> None:
    with pytest.raises(ValueError, match=r"world_size must be 1\.\.8"):
        run_ranks(WORKERS, "numerics", 9)
    assert issubclass(SpyreCCLNotSupportedError, RuntimeError)


def test_host_staged_route_is_two_pcie_hops_of_the_device_config() -> None:
    from spyre_lab.device.config import SPYRE

    link = host_staged_link(SPYRE.replace(pcie_bandwidth=40e9, pcie_latency_us=3.0))
    assert link.transfer_us(0) == pytest.approx(6.0)
    assert link.transfer_us(1e6) - link.transfer_us(0) == pytest.approx(2 * 1e6 / 40e9 * 1e6)
    assert allreduce_cost(1 << 20, 4, link=link).us > allreduce_cost(1 << 20, 4, link=card_link()).us
    default = host_staged_link()  # the estimate stays faster than staging through the host, on both terms
    assert default.bandwidth < card_link().bandwidth and default.latency_us > card_link().latency_us


def test_each_algorithm_counts_its_rounds() -> None:
    from spyre_lab.distributed import (
        allgather_cost,
        barrier_cost,
        broadcast_cost,
        gather_cost,
        reduce_cost,
        send_cost,
    )

    link = card_link()
    b = 1 << 16
    assert [broadcast_cost(b, k).rounds for k in (1, 2, 3, 4, 5, 8)] == [0, 1, 2, 2, 3, 3]  # binomial tree
    assert allreduce_cost(b, 8, algorithm="gather_sum_bcast").rounds == 7 + 3
    assert allreduce_cost(b, 8, algorithm="gather_sum_bcast").round_bytes == b  # full messages, not b / k
    assert reduce_cost(b, 4).rounds == gather_cost(b, 4).rounds == allgather_cost(b, 4).rounds == 3
    assert send_cost(b).us == pytest.approx(link.transfer_us(b))
    assert barrier_cost(8).us == pytest.approx(3 * link.latency_us)
    with pytest.raises(ValueError, match="world size >= 1"):
        allreduce_cost(b, 0)
