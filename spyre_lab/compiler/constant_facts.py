"""Facts about constant tensors, found once per tensor: is it all zero, is it a causal mask (and at what offset).

A decoder stack builds the same constants in every layer (SDPA's zero fill, its causal mask), and the
scheduler, the attention tiler and the plan memo each ask about them. Reading a [32, 1024, 1024] mask costs
a tenth of a second; the answer is kept on the tensor's identity and version (the tensor is held, so its id
is not reused while the answer lives), and a mask broadcast over heads is read once, not once per head.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

MAX_FACTS = 64
_FACTS: dict[tuple, tuple[torch.Tensor, object]] = {}


def _known(t: torch.Tensor, question: str, answer: Callable[[torch.Tensor], object]) -> object:
    key = (id(t), t._version, tuple(t.shape), question)
    hit = _FACTS.get(key)
    if hit is not None:
        return hit[1]
    value = answer(t)
    if len(_FACTS) >= MAX_FACTS:
        _FACTS.clear()
    _FACTS[key] = (t, value)
    return value


def distinct_rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` without the leading dims it is only broadcast along (stride 0): the values that are really there."""
    index = tuple(slice(0, 1) if t.stride(d) == 0 and t.shape[d] > 1 else slice(None) for d in range(t.dim()))
    return t[index]


def all_zero(t: torch.Tensor) -> bool:
    return bool(_known(t, "all_zero", lambda x: bool((distinct_rows(x) == 0).all())))


def causal_offset(t: torch.Tensor) -> int | None:
    """``d`` if the [B or 1, M, N] mask is 0 where ``key <= query + d`` and -inf elsewhere (what ``is_causal``
    builds), else None."""
    return _known(t, "causal", _causal_offset)  # type: ignore[return-value]


def _causal_offset(t: torch.Tensor) -> int | None:
    m, n = t.shape[-2], t.shape[-1]
    d = n - m
    rows, cols = torch.arange(m).unsqueeze(1), torch.arange(n).unsqueeze(0)
    want = torch.where(cols <= rows + d, 0.0, -math.inf)
    return d if bool((distinct_rows(t) == want).all()) else None
