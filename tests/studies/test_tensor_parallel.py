"""The tensor-parallel study's structure, on a small Granite-shaped model (the 8B table is the printer's job)."""

from __future__ import annotations

import dataclasses

import pytest
from warning_checks import SPYRE_ENGINE_WARNINGS, only_warnings

from spyre_lab.distributed import allreduce_cost
from spyre_lab.studies.granite8b import GRANITE_3_3_8B, PROBE_DEPTHS, ProbeCache, StepConfig, time_steps
from spyre_lab.studies.tensor_parallel import (
    explain_decode,
    format_table,
    shard_config,
    step_collectives,
    tensor_parallel_table,
    weight_bytes,
)

SMALL = dataclasses.replace(GRANITE_3_3_8B, hidden_size=256, num_attention_heads=8, num_key_value_heads=4,
                            head_dim=32, intermediate_size=512, num_hidden_layers=4, vocab_size=1001,
                            max_position_embeddings=4096)
BUCKETS = (("prefill", 64), ("decode", 1))


@pytest.fixture(scope="module")
def table() -> list:
    with only_warnings(*SPYRE_ENGINE_WARNINGS):
        return tensor_parallel_table((1, 2, 4), BUCKETS, config=SMALL)


def test_tp1_has_no_collective_and_the_share_grows_with_k(table: list) -> None:
    for kind, size in BUCKETS:
        rows = sorted((r for r in table if (r.kind, r.size) == (kind, size)), key=lambda r: r.tp)
        assert [r.tp for r in rows] == [1, 2, 4]
        assert rows[0].collective_us == 0 and rows[0].collectives == 0
        shares = [r.collective_share for r in rows]
        assert shares[0] == 0 < shares[1] < shares[2], (kind, shares)
        for r in rows:
            assert r.step_us == pytest.approx(r.compute_us + r.collective_us)
            assert r.collectives == (2 * SMALL.num_hidden_layers + 2 if r.tp > 1 else 0)
        assert rows[0].compute_us > rows[1].compute_us > rows[2].compute_us  # each rank runs a smaller layer
        assert rows[0].weight_bytes_per_card > rows[1].weight_bytes_per_card > rows[2].weight_bytes_per_card


def test_two_allreduces_per_layer_of_the_activation_bytes() -> None:
    costs = step_collectives(SMALL, 4, "prefill", 64)
    activation = 64 * SMALL.hidden_size * 2
    allreduces = [c for c in costs if c.op == "allreduce"]
    assert len(allreduces) == 2 * SMALL.num_hidden_layers + 1  # + the vocabulary-parallel embedding's
    assert all(c.nbytes == activation and c.us == allreduce_cost(activation, 4).us for c in allreduces)
    assert [c.op for c in costs].count("gather") == 1  # the logits shards to rank 0
    assert step_collectives(SMALL, 1, "decode", 1) == []


def test_shards_split_heads_kv_heads_intermediate_and_vocabulary() -> None:
    shard = shard_config(GRANITE_3_3_8B, 8)
    assert (shard.num_attention_heads, shard.num_key_value_heads, shard.intermediate_size) == (4, 1, 1600)
    assert shard.vocab_size == 6145  # ceil(49159 / 8)
    assert weight_bytes(GRANITE_3_3_8B) / weight_bytes(shard) == pytest.approx(8, rel=1e-3)
    with pytest.raises(ValueError, match="num_key_value_heads=8 does not split over 16 cards"):
        shard_config(GRANITE_3_3_8B, 16)


def test_printer_and_explanation_read_the_table(table: list) -> None:
    text = format_table(table)
    assert "modeled" in text and "estimate" in text
    assert text.count("\n") == len(table) + 2
    story = explain_decode(table)
    assert "decode batch 1: fastest at TP" in story and "TP 2->4" in story
    with pytest.raises(ValueError, match="two or more TP sizes"):
        explain_decode([r for r in table if r.tp == 1])


def test_the_table_is_the_step_study_at_each_tensor_parallel_size(table: list) -> None:
    """Each row is ``time_steps(StepConfig(tensor_parallel=k))``: the rank's step on the sharded shapes (one card,
    the same probes) plus the collectives ``step_collectives`` lists."""
    probes = ProbeCache()
    with only_warnings(*SPYRE_ENGINE_WARNINGS):
        at_2 = time_steps(StepConfig(tensor_parallel=2), BUCKETS, config=SMALL, probes=probes)
        rank = time_steps(StepConfig(), BUCKETS, config=shard_config(SMALL, 2), probes=probes)
    assert probes.built == len(PROBE_DEPTHS)       # one rank's model per depth: TP 2 and its shapes share them
    for kind, size in BUCKETS:
        t, row = at_2[(kind, size)], next(r for r in table if (r.tp, r.kind, r.size) == (2, kind, size))
        costs = step_collectives(SMALL, 2, kind, size)
        assert t.collectives == len(costs) and t.collective_us == pytest.approx(sum(c.us for c in costs))
        assert t.compute_us == pytest.approx(rank[(kind, size)].step_us)
        assert t.step_us == pytest.approx(t.compute_us + t.collective_us) and 0 < t.collective_share < 1
        assert (row.compute_us, row.collective_us) == pytest.approx((t.compute_us, t.collective_us))


def test_tensor_parallel_must_be_a_card_count() -> None:
    for bad in (0, -2, 2.0, True):
        with pytest.raises(ValueError, match="tensor_parallel is the number of cards"):
            StepConfig(tensor_parallel=bad)
    with pytest.raises(ValueError, match="num_key_value_heads=8 does not split over 16 cards"):
        time_steps(StepConfig(tensor_parallel=16), BUCKETS)
