"""Tensor parallelism on the spyre platform: two worker processes, one card each, the group
``"cpu:gloo,spyre:spyreccl"``; the compiled pieces run between the all-reduces (opaque ops the piecewise
backend leaves to the host) and spyreccl charges each collective's modeled time on the card's clock.

One TP-2 engine for the whole module (and the session: `spyre_tp_runs`), since each rank compiles its pieces.
"""

from __future__ import annotations

import pytest
import torch
from spyre_tp_runs import STEPS, SpyreRun, spyre_runs

# fp16 on the card: sharding changes the order of the sums (per-rank partials, then the all-reduce in fp16 on the
# wire), so logits (|x| < 16) differ by a few fp16 ulps (2**-7 at |x| in [8, 16)); measured max |diff| <MEASURED>
FP16_TOLERANCE = dict(atol=3e-2, rtol=1e-2)


@pytest.fixture(scope="module")
def runs() -> dict[int, SpyreRun]:
    return spyre_runs()


def test_two_cards_decode_the_tokens_one_card_decodes(runs) -> None:
    one, two = runs[1], runs[2]
    assert two.backend == "spyreccl" and one.backend == ""
    assert all(len(t) == STEPS for t in one.tokens)
    assert two.tokens == one.tokens
    assert two.logits.dtype == torch.float16
    torch.testing.assert_close(two.logits, one.logits, **FP16_TOLERANCE)


def test_rank_zeros_modeled_steps_include_the_collectives_spyreccl_charged(runs) -> None:
    """Each step's modeled trace holds card 0's collectives: the time spyreccl charged, inside the step's span."""
    stats = runs[2].stats
    served = [s.step for s in stats.steps if not s.kind.startswith("warmup")]
    per_step = []
    for step in served:
        trace = stats.details[step].device_trace
        own = trace.on("card0.ccl")
        assert own and all(e.args["modeled"] and e.args["world_size"] == 2 for e in own)
        assert sum(e.dur_us for e in own) < trace.duration_us
        per_step.extend(e.dur_us for e in own)
        assert [e.name for e in trace.on("card1.ccl")] == [e.name for e in own]   # rank 1's own recording
    assert sum(per_step) > 0
    assert per_step == pytest.approx(runs[2].charged)
    # the one-card run's steps carry no collectives
    one = runs[1].stats
    assert all(not one.details[s.step].device_trace.on("card0.ccl") for s in one.steps
               if s.step in one.details and one.details[s.step].device_trace is not None)


def test_each_decoder_block_is_three_compiled_pieces_shared_by_every_layer(runs) -> None:
    """The all-reduces after o_proj and down_proj cut each block; the program cache still compiles each kind of
    piece once per bucket (the pieces of later layers hit)."""
    stats = runs[2].stats
    first_decode = next(s for s in stats.steps if s.kind == "decode")
    names = [e.name for e in stats.details[first_decode.step].device_trace.on("card0.ccl")]
    layers = 4
    assert names.count("allreduce [ring]") == 1 + 2 * layers           # embedding + o_proj + down_proj per layer
    assert names[-1].startswith("gather")                                # the LM head's vocab slices to rank 0
