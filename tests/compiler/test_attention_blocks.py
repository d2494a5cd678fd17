"""The attention tiler answers a causal mask's block states by index arithmetic: held equal to reading the mask."""

from __future__ import annotations

import math
import random

import pytest
import torch

from spyre_lab.compiler.constant_facts import causal_offset
from spyre_lab.compiler.tiling_attention import block_state_fn, unmasked_keys


def _read_state(t: torch.Tensor, streamed: int, generated: bool, b0, b1, m0, m1, n0, n1) -> str:
    """What a block needs, read off the mask itself (the definition the arithmetic must agree with)."""
    blk = t[min(b0, t.shape[0] - 1):max(b1, 1) if t.shape[0] > 1 else 1, m0:m1, n0:n1]
    if bool((blk == -math.inf).all()):
        return "skip"
    if streamed == 0 and bool((blk == 0).all()):
        return "plain"
    return "causal" if generated else "load"


def _causal(heads: int, m: int, n: int, dtype=torch.float16) -> torch.Tensor:
    rows, cols = torch.arange(m).unsqueeze(1), torch.arange(n).unsqueeze(0)
    return torch.where(cols <= rows + (n - m), 0.0, -math.inf).to(dtype).expand(heads, m, n).contiguous()


@pytest.mark.parametrize(("heads", "m", "n"), [(1, 64, 64), (1, 40, 72), (2, 96, 32), (1, 1, 17), (3, 33, 33)])
@pytest.mark.parametrize("streamed", [0, 1])
def test_causal_blocks_match_reading_the_mask(heads: int, m: int, n: int, streamed: int) -> None:
    t = _causal(heads, m, n)
    assert causal_offset(t) == n - m
    state = block_state_fn({"mask": t}, streamed, True)
    rng = random.Random(m * 1000 + n + streamed)
    for _ in range(400):
        m0, n0, b0 = rng.randrange(0, m + 2), rng.randrange(0, n + 2), rng.randrange(0, heads + 1)
        m1, n1, b1 = m0 + rng.randrange(0, 40), n0 + rng.randrange(0, 40), b0 + rng.randrange(0, 3)
        want = _read_state(t, streamed, streamed == 0, b0, b1, m0, m1, n0, n1)
        assert state(b0, b1, m0, m1, n0, n1) == want, (b0, b1, m0, m1, n0, n1)


def test_causal_row_keys_match_reading_the_mask() -> None:
    t = _causal(2, 48, 80)
    assert unmasked_keys({"mask": t}, True) == (~(t == -math.inf).all(dim=0)).sum(dim=-1).tolist()


def test_a_mask_that_is_not_causal_is_read_block_by_block() -> None:
    t = _causal(1, 32, 32)
    t[0, 5, 3] = -math.inf                       # one extra masked key: no longer what is_causal builds
    assert causal_offset(t) is None
    state = block_state_fn({"mask": t}, 0, True)
    assert state(0, 1, 4, 8, 0, 4) == "load" and state(0, 1, 0, 4, 8, 16) == "skip"
    assert state(0, 1, 8, 16, 0, 8) == "plain"
