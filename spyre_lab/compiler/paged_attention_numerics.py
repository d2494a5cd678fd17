"""Paged attention's numerics on CPU tensors: the kernel's online softmax, block by block through the block table.

:func:`paged_online_attention` computes what the tiled kernel of
:mod:`~spyre_lab.compiler.tiling_paged_attention` computes, in the same order: per (sequence, KV head) a
running max and sum and an fp32 accumulator updated once per key tile, and, where the plan cut a unit's
key tiles into split-KV chunks, each chunk's partial state merged down the chain as the cores do. It is not
a call to SDPA: tests compare the two.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch


def context_blocks(context: int, block_size: int) -> int:
    """Cache blocks a context of ``context`` tokens covers (the last one may be partly filled)."""
    return -(-context // block_size)


def paged_online_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, query_index: torch.Tensor, seq_lens: torch.Tensor,
                           query_lens: torch.Tensor, num_kv_heads: int, scale: float,
                           chunks: Sequence[Sequence[int]] | None = None,
                           out: torch.Tensor | None = None, tile_blocks: int = 1) -> torch.Tensor:
    """Attention of each sequence's queries over its paged keys, block by block; ``[T, heads * d]`` out.

    ``query [T, heads*d]`` (flat tokens), caches ``[blocks, block_size, kv_heads, d]`` (this step's keys
    already written), ``block_tables [B, W]``, ``query_index [B, Q]`` (flat token of each query),
    ``seq_lens [B]`` (keys a sequence's context covers, this step's included), ``query_lens [B]`` (its real
    queries: the last ``query_lens`` positions, causal by position). Rows no real query owns stay 0.

    Per (sequence, KV head): the group's query rows in fp32, a running max ``m`` and sum ``l``, an fp32
    accumulator; per block ``s = q k^T * scale`` (keys past a query's position or the context: -inf),
    ``m' = max(m, rowmax s)``, ``p = exp(s - m')`` (fp16 into the PV product, as the PE array takes it),
    ``acc = acc * exp(m - m') + p v``, ``l = l * exp(m - m') + rowsum p``. ``chunks[b]`` (the blocks where
    chunks start after block 0, e.g. ``[3]``) computes each chunk's blocks from scratch and merges the partials
    in chunk order, as split-KV does on the card; ``tile_blocks`` blocks share one online-softmax update, as in
    the kernel's key tiles. A row that sees no key gives 0.
    """
    num_tokens = query.shape[0]
    bs, kv, d = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    heads = query.shape[-1] // d if query.dim() == 2 else query.shape[1]
    group = heads // num_kv_heads
    if out is None:
        out = torch.zeros(num_tokens, heads * d, dtype=query.dtype)
    q_all = query.reshape(num_tokens, kv, group, d)
    lens = zip(seq_lens.tolist(), query_lens.tolist())
    for b, (seq_len, qlen) in enumerate(lens):
        if qlen <= 0 or seq_len <= 0:
            continue
        tokens = query_index[b, :qlen]
        q = q_all.index_select(0, tokens).permute(1, 0, 2, 3).reshape(kv, qlen * group, d).float()   # query-major
        # a query sees the keys up to its own position; it is inside the context, so no key past the context
        if qlen == 1:                                                 # a decode: every row at the last position
            q_pos = seq_len - 1
        else:
            q_pos = torch.arange(seq_len - qlen, seq_len).repeat_interleave(group).view(1, -1, 1)
        nblocks = context_blocks(seq_len, bs)
        cuts = [c for c in (chunks[b] if chunks is not None else ()) if 0 < c < nblocks]
        bounds = [0, *cuts, nblocks]
        table = block_tables[b]
        parts = []
        for j0, j1 in itertools.pairwise(bounds):
            state = None                                              # (m, l, acc): none before the first tile
            for t0 in range(j0, j1, tile_blocks):                 # one key tile: ``tile_blocks`` blocks
                blocks = table[t0:min(j1, t0 + tile_blocks)]
                k = k_cache.index_select(0, blocks).flatten(0, 1).transpose(0, 1).float()      # [kv, keys, d]
                v = v_cache.index_select(0, blocks).flatten(0, 1).transpose(0, 1)
                s = torch.matmul(q, k.transpose(1, 2)) * scale
                if t0 * bs + k.shape[1] - 1 > seq_len - qlen:             # some key lies past some query
                    if qlen == 1:                                         # one query: the keys past it are a tail
                        s.narrow(-1, seq_len - t0 * bs, t0 * bs + k.shape[1] - seq_len).fill_(-math.inf)
                    else:
                        k_pos = torch.arange(t0 * bs, t0 * bs + k.shape[1]).view(1, 1, -1)
                        s = s.masked_fill(k_pos > q_pos, -math.inf)
                state = _online_step(*state, s, v) if state is not None else _first_step(s, v)
            parts.append(state)
        m, l_sum, acc = parts[-1]
        for pm, pl, pacc in reversed(parts[:-1]):                    # the ring chain: r+1 merged into r
            m, l_sum, acc = merge_partials((pm, pl, pacc), (m, l_sum, acc))
        if qlen == 1:                      # a decode row sees its own key, so its sum is at least exp(0) = 1
            o = acc / l_sum
        else:
            empty = l_sum == 0
            o = torch.where(empty, 0.0, acc / torch.where(empty, 1.0, l_sum))
        o = o.view(kv, qlen, group, d).permute(1, 0, 2, 3).reshape(qlen, heads * d)
        out.index_copy_(0, tokens, o.to(out.dtype))               # a sequence's tokens are distinct
    return out


def _first_step(s: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`_online_step` from the empty state (max -inf, sum 0, accumulator 0), with the terms that are exactly
    known left out: the running max is the tile's, the old state is rescaled by exp(-inf) = 0, so the sum is
    the tile's and the accumulator the tile's ``p v`` (plus 0.0, which turns a -0.0 into 0.0 as the full update
    does)."""
    new_m = s.amax(dim=-1, keepdim=True)
    safe = torch.where(new_m == -math.inf, 0.0, new_m)               # a row masked so far: nothing to shift
    p = torch.exp(s - safe)
    return new_m, p.sum(dim=-1, keepdim=True), torch.matmul(p.to(v.dtype).float(), v.float()) + 0.0


def _online_step(m: torch.Tensor, l_sum: torch.Tensor, acc: torch.Tensor, s: torch.Tensor,
                 v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    new_m = torch.maximum(m, s.amax(dim=-1, keepdim=True))
    safe = torch.where(new_m == -math.inf, 0.0, new_m)               # a row masked so far: nothing to shift
    p = torch.exp(s - safe)
    rescale = torch.exp(m - safe)
    l_sum = l_sum * rescale + p.sum(dim=-1, keepdim=True)
    acc = acc * rescale + torch.matmul(p.to(v.dtype).float(), v.float())
    return new_m, l_sum, acc


def merge_partials(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """Two partial softmax states ``(max, sum, acc)`` over disjoint keys -> the state over both."""
    (ma, la, acca), (mb, lb, accb) = a, b
    m = torch.maximum(ma, mb)
    safe = torch.where(m == -math.inf, 0.0, m)
    fa, fb = torch.exp(ma - safe), torch.exp(mb - safe)
    return m, la * fa + lb * fb, acca * fa + accb * fb
